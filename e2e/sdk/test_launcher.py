"""What localstripe_launcher.py adds to stock localstripe, checked against
it directly (no Vaultcap in between) with the official SDK."""

import hashlib
import hmac
import http.server
import json
import queue
import threading
import urllib.request

import pytest
import stripe


@pytest.fixture
def sdk(localstripe, real_stripe_key) -> stripe.StripeClient:
    return stripe.StripeClient(real_stripe_key, base_addresses={"api": localstripe}, max_network_retries=0)


def create_charge(sdk: stripe.StripeClient, amount: int, idempotency_key: str):
    return sdk.v1.charges.create(
        params={"amount": amount, "currency": "usd", "source": "pm_card_visa"},
        options={"idempotency_key": idempotency_key},
    )


def test_a_retry_with_the_same_idempotency_key_gets_the_first_charge_back(sdk):
    first = create_charge(sdk, 1500, "launcher-retry")
    again = create_charge(sdk, 1500, "launcher-retry")
    other = create_charge(sdk, 1500, "launcher-other")

    assert again.id == first.id
    assert again.last_response.headers.get("Idempotent-Replayed") == "true"
    assert other.id != first.id, "another key is another charge"


def test_the_same_idempotency_key_with_other_parameters_is_an_idempotency_error(sdk):
    create_charge(sdk, 1500, "launcher-mismatch")
    with pytest.raises(stripe.IdempotencyError) as refused:
        create_charge(sdk, 2500, "launcher-mismatch")
    assert refused.value.http_status == 400


def test_charges_list_newest_first_within_a_created_range(sdk):
    made = [create_charge(sdk, 100 + n, f"launcher-range-{n}") for n in range(3)]
    created = made[0].created
    listed = sdk.v1.charges.list(params={"created": {"gte": created, "lte": created + 3600}, "limit": 100})
    ids = [c.id for c in listed.data]
    assert [m.id for m in made if m.id in ids] == [m.id for m in made], "all three are in the range"
    assert ids.index(made[2].id) < ids.index(made[0].id), "newest first"
    assert sdk.v1.charges.list(params={"created": {"lt": created - 10}}).data == []


def test_charges_carry_the_fields_async_stripe_decodes(sdk):
    charge = create_charge(sdk, 700, "launcher-fields").to_dict()
    assert charge["amount_captured"] == 700
    assert charge["disputed"] is False
    assert set(charge["billing_details"]) == {"address", "email", "name", "phone"}


def test_payment_intents_carry_the_fields_async_stripe_decodes_and_list_by_created(sdk):
    intent = sdk.v1.payment_intents.create(
        params={"amount": 900, "currency": "usd", "payment_method": "pm_card_visa", "confirm": True,
                "metadata": {"customer_id": "cust_launcher"}},
        options={"idempotency_key": "launcher-intent"},
    ).to_dict()
    assert (intent["status"], intent["amount_received"], intent["amount_capturable"]) == ("succeeded", 900, 0)
    assert intent["confirmation_method"] == "automatic"
    assert intent["payment_method_types"] == ["card"]
    listed = sdk.v1.payment_intents.list(params={"created": {"gte": intent["created"]}, "limit": 100})
    assert intent["id"] in [i.id for i in listed.data]
    assert sdk.v1.payment_intents.list(params={"created": {"lt": intent["created"] - 10}}).data == []


def test_refunds_take_a_reason_refund_the_remainder_and_never_twice(sdk):
    charge = create_charge(sdk, 1000, "launcher-refund")
    sdk.v1.refunds.create(params={"charge": charge.id, "amount": 300, "reason": "duplicate"})
    rest = sdk.v1.refunds.create(params={"charge": charge.id})
    assert rest.amount == 700, "what was left, not the whole charge again"
    with pytest.raises(stripe.InvalidRequestError) as refused:
        sdk.v1.refunds.create(params={"charge": charge.id})
    assert refused.value.code == "charge_already_refunded"
    assert sdk.v1.charges.retrieve(charge.id).amount_refunded == 1000


@pytest.fixture
def receiver():
    """A webhook receiver on a free port: the events it was sent, in order."""
    received: queue.Queue = queue.Queue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.put((self.headers["Stripe-Signature"], body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()


def test_charges_are_announced_signed_with_the_request_that_made_them(sdk, localstripe, real_stripe_key, receiver):
    url, received = receiver
    secret = "whsec_launcher"
    register = urllib.request.Request(
        f"{localstripe}/_config/webhooks/launcher",
        data=json.dumps({"url": url, "secret": secret, "events": ["charge.succeeded", "charge.refunded"]}).encode(),
        headers={"Authorization": f"Bearer {real_stripe_key}", "Content-Type": "application/json"},
    )
    urllib.request.urlopen(register).read()
    charge = create_charge(sdk, 1200, "launcher-events")
    sdk.v1.refunds.create(params={"charge": charge.id, "amount": 200})

    # Events of the other tests' charges may still be on their way.
    by_type = {}
    while len(by_type) < 2:
        signature, body = received.get(timeout=10)
        t, v1 = (part.split("=", 1)[1] for part in signature.split(","))
        expected = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(v1, expected), "signed as Stripe signs"
        event = json.loads(body)
        if event["data"]["object"]["id"] == charge.id:
            by_type[event["type"]] = event
    assert set(by_type) == {"charge.succeeded", "charge.refunded"}
    succeeded = by_type["charge.succeeded"]
    assert succeeded["request"]["idempotency_key"] == "launcher-events"
    assert succeeded["pending_webhooks"] == 1
    assert by_type["charge.refunded"]["data"]["object"]["amount_refunded"] == 200
