"""The cap against unlucky and hostile callers, through `vaultcap serve` to
localstripe: the official SDK where a billing job would use it, raw HTTP
where an attacker would send what no SDK sends."""

import http.client
import urllib.parse

import pytest
import stripe

from test_stripe_python import client, error_code, in_a_month


def capped_key(issue_key, label: str, cap_cents: int) -> dict:
    return issue_key(
        {
            "label": label,
            "expected_total_cents": cap_cents,
            "cap_cents": cap_cents,
            "allowed_endpoints": ["/v1/charges"],
            "expires_at": in_a_month(),
        }
    )


def test_an_idempotency_key_whose_first_call_stripe_refused_is_no_free_pass(vaultcap, issue_key, audit_rows, sql):
    key = capped_key(issue_key, "sdk-free-pass", 1000)
    sdk = client(vaultcap, key["vault_key"])
    reused = {"idempotency_key": "free-pass-K"}
    with pytest.raises(stripe.InvalidRequestError) as missing:
        sdk.v1.charges.create(params={"amount": 500, "currency": "usd", "customer": "cus_does_not_exist"}, options=reused)
    assert missing.value.http_status == 404
    with pytest.raises(stripe.StripeError) as refused:
        sdk.v1.charges.create(params={"amount": 100000, "currency": "usd", "source": "pm_card_visa"}, options=reused)
    assert refused.value.http_status == 402
    assert error_code(refused.value) == "spend_cap_exceeded"
    assert audit_rows(key["id"]) == ["allowed", "refused_cap"]
    assert sql(f"SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = {key['id']}") == [["0", "0"]]


def test_a_used_key_with_other_parameters_is_stripes_idempotency_error(vaultcap, issue_key, audit_rows):
    key = capped_key(issue_key, "sdk-mismatch", 5000)
    sdk = client(vaultcap, key["vault_key"])
    reused = {"idempotency_key": "mismatch-K"}
    sdk.v1.charges.create(params={"amount": 600, "currency": "usd", "source": "pm_card_visa"}, options=reused)
    with pytest.raises(stripe.IdempotencyError):
        sdk.v1.charges.create(params={"amount": 4000, "currency": "usd", "source": "pm_card_visa"}, options=reused)
    assert audit_rows(key["id"]) == ["allowed", "refused_invalid_request"]


def raw_post(base: str, headers: list, body: str) -> int:
    address = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=10)
    connection.putrequest("POST", "/v1/charges")
    for name, value in headers + [("Content-Length", str(len(body)))]:
        connection.putheader(name, value)
    connection.endheaders(body.encode())
    status = connection.getresponse().status
    connection.close()
    return status


def test_two_idempotency_keys_or_a_key_of_nul_bytes_reach_nothing(vaultcap, issue_key, audit_rows, sql):
    key = capped_key(issue_key, "sdk-hostile-headers", 1000)
    form = [("Authorization", f"Bearer {key['vault_key']}"), ("Content-Type", "application/x-www-form-urlencoded")]
    body = "amount=600&currency=usd&source=pm_card_visa"
    doubled = form + [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    assert raw_post(vaultcap, doubled, body) == 400
    nul_key = [("Authorization", "Basic AAAAAA=="), ("Content-Type", "application/x-www-form-urlencoded")]
    assert raw_post(vaultcap, nul_key, body) == 401
    assert raw_post(vaultcap, form, body + "&amount=99999") == 400
    assert audit_rows(key["id"]) == ["refused_invalid_request", "refused_invalid_request"]
    assert sql(f"SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = {key['id']}") == [["0", "0"]]
