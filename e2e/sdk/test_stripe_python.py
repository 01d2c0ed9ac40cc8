"""A billing job's view: the official stripe-python SDK pointed at Vaultcap
with a vault key, Vaultcap forwarding to localstripe with the real key."""

from datetime import datetime, timedelta, timezone

import pytest
import stripe


def client(api_base: str, vault_key: str) -> stripe.StripeClient:
    return stripe.StripeClient(vault_key, base_addresses={"api": api_base}, max_network_retries=0)


def in_a_month() -> str:
    """An expiry a vault key may have (within a year)."""
    return (datetime.now(timezone.utc) + timedelta(days=30)).isoformat()


def error_code(error: stripe.StripeError) -> str:
    # stripe-python sets `.code` only on some error classes; the body has it.
    return error.json_body["error"]["code"]


def charge(sdk: stripe.StripeClient, customer_id: str, idempotency_key: str | None = None):
    return sdk.v1.charges.create(
        params={
            "amount": 1000,
            "currency": "usd",
            "source": "pm_card_visa",
            "metadata": {"customer_id": customer_id, "billing_period": "2026-07"},
        },
        options={"idempotency_key": idempotency_key} if idempotency_key else None,
    )


def test_charges_succeed_until_the_cap_then_spend_cap_exceeded(vaultcap, issue_key, audit_rows):
    key = issue_key(
        {
            "label": "sdk-billing-run-2026-07",
            "expected_total_cents": 2728,
            "allowed_endpoints": ["/v1/charges"],
            "expires_at": in_a_month(),
        }
    )
    assert key["cap_cents"] == 3000
    sdk = client(vaultcap, key["vault_key"])

    charges = [charge(sdk, f"cust_{n}") for n in range(3)]
    assert all(c.id.startswith("ch_") and c.amount == 1000 and c.status == "succeeded" for c in charges)

    with pytest.raises(stripe.StripeError) as refused:
        charge(sdk, "cust_3")
    assert refused.value.http_status == 402
    assert error_code(refused.value) == "spend_cap_exceeded"
    assert "cap-increase-requests" in refused.value.user_message

    assert audit_rows(key["id"]) == ["allowed", "allowed", "allowed", "refused_cap"]


def test_endpoints_the_key_does_not_allow_are_refused(vaultcap, issue_key, audit_rows):
    key = issue_key(
        {
            "label": "sdk-charges-only",
            "expected_total_cents": 10000,
            "allowed_endpoints": ["/v1/charges"],
            "expires_at": in_a_month(),
        }
    )
    sdk = client(vaultcap, key["vault_key"])
    paid = charge(sdk, "cust_refund")

    with pytest.raises(stripe.PermissionError) as refused:
        sdk.v1.refunds.create(params={"charge": paid.id})
    assert error_code(refused.value) == "endpoint_not_allowed"
    with pytest.raises(stripe.PermissionError):
        sdk.v1.customers.create(params={"email": "someone@example.com"})

    assert audit_rows(key["id"]) == ["allowed", "refused_endpoint", "refused_endpoint"]


def test_an_unknown_key_is_an_authentication_error(vaultcap):
    with pytest.raises(stripe.AuthenticationError) as refused:
        charge(client(vaultcap, "vk_not_a_real_key"), "cust_x")
    assert error_code(refused.value) == "invalid_api_key"


def test_a_redelivered_charge_with_the_same_idempotency_key_is_charged_and_metered_once(
    vaultcap, issue_key, audit_rows, sql
):
    key = issue_key(
        {
            "label": "sdk-redelivery",
            "expected_total_cents": 10000,
            "allowed_endpoints": ["/v1/charges"],
            "expires_at": in_a_month(),
        }
    )
    sdk = client(vaultcap, key["vault_key"])

    first = charge(sdk, "cust_redelivered", idempotency_key="invoice-2026-07-cust_redelivered")
    again = charge(sdk, "cust_redelivered", idempotency_key="invoice-2026-07-cust_redelivered")

    assert again.id == first.id, "Stripe answered the retry with the original charge"
    assert audit_rows(key["id"]) == ["allowed", "replay"]
    assert sql(f"SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = {key['id']}") == [["1000", "0"]]
