"""Live from Stripe, end to end: localstripe signs and sends its events to
Vaultcap's `/stripe/webhooks`. A charge whose answer was lost (the fault
forwarder withholds it) is settled by its event without a sync; a charge made
with the real key around the proxy becomes an `unmetered` finding and one
notification; a forged event is refused."""

import json
import pathlib
import queue
import socket
import subprocess
import threading
import time
import http.server
import urllib.error
import urllib.request

import pytest
import stripe

from conftest import serving
from test_stripe_python import client, in_a_month

WEBHOOK_SECRET = "whsec_vaultcap_e2e"
E2E = pathlib.Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(condition, what: str, timeout: float = 30.0):
    """Polls `condition` until it returns something truthy (events arrive
    about a second after Stripe acts, findings within a live pass)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def notifications():
    """A notification webhook receiver: the bodies it was sent."""
    received: queue.Queue = queue.Queue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            received.put(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()


@pytest.fixture(scope="module")
def faults(localstripe):
    """The fault forwarder in front of localstripe."""
    port = free_port()
    upstream = localstripe.rsplit(":", 1)[1]
    proc = subprocess.Popen(["node", str(E2E / "stripe_faults.js"), str(port), upstream])

    def listening():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_until(listening, "the fault forwarder to listen", timeout=10)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def live(faults, localstripe, data_dir, notifications, real_stripe_key):
    """`vaultcap serve` forwarding through the fault forwarder, taking
    localstripe's events signed with WEBHOOK_SECRET."""
    hook, _ = notifications
    with serving(
        data_dir,
        STRIPE_API_BASE=faults,
        STRIPE_SECRET_KEY=real_stripe_key,
        STRIPE_WEBHOOK_SECRET=WEBHOOK_SECRET,
        VAULTCAP_ALERT_WEBHOOKS=hook,
        VAULTCAP_UPSTREAM_TIMEOUT_SECS="2",
        VAULTCAP_REPLACE_FLEET_SETTINGS="true",
    ) as url:
        register = urllib.request.Request(
            f"{localstripe}/_config/webhooks/vaultcap",
            data=json.dumps({"url": f"{url}/stripe/webhooks", "secret": WEBHOOK_SECRET}).encode(),
            headers={"Authorization": f"Bearer {real_stripe_key}", "Content-Type": "application/json"},
        )
        urllib.request.urlopen(register).read()
        yield url


def test_a_lost_answer_is_settled_by_stripes_event_without_a_sync(live, api_token, sql):
    # Other tests of the run may have synced periods: none is started here.
    syncs = sql("SELECT count(*) FROM stripe_syncs")
    request = urllib.request.Request(
        f"{live}/vault/keys",
        data=json.dumps({
            "label": "webhooks-e2e", "expected_total_cents": 10000,
            "allowed_endpoints": ["/v1/charges"], "expires_at": in_a_month(),
        }).encode(),
        headers={"Authorization": f"Bearer {api_token}", "Content-Type": "application/json"},
        method="POST",
    )
    key = json.load(urllib.request.urlopen(request))
    sdk = client(live, key["vault_key"])
    params = {"amount": 1500, "currency": "usd", "source": "pm_card_visa",
              "metadata": {"customer_id": "cust_lost", "billing_period": "2026-07", "fault": "answer_lost"}}
    with pytest.raises(stripe.StripeError):
        sdk.v1.charges.create(params=params, options={"idempotency_key": "webhooks-e2e-lost"})

    def settled():
        rows = sql(f"SELECT state, stripe_charge_id FROM reservations WHERE vault_key_id = {key['id']}")
        return rows if rows and rows[0][0] == "settled" else None

    (state, charge_id), = wait_until(settled, "the charge's event to settle the call")
    assert charge_id.startswith("ch_")
    spent, reserved = sql(f"SELECT spent_cents, reserved_cents FROM vault_keys WHERE id = {key['id']}")[0]
    assert (spent, reserved) == ("1500", "0")
    assert sql("SELECT count(*) FROM stripe_syncs") == syncs, "no sync was needed"
    # Settled from Stripe's event (the webhook's action), not by asking Stripe.
    assert sql(f"""SELECT count(*) FROM operator_actions WHERE action = 'reservation.settle'
                   AND details ? 'stripe_event' AND details->>'stripe_charge_id' = '{charge_id}'""") == [["1"]]
    assert int(sql(f"SELECT count(*) FROM stripe_events WHERE object_id = '{charge_id}'")[0][0]) >= 1


def test_a_charge_made_with_the_real_key_is_unmetered_and_announced_once(
    live, localstripe, real_stripe_key, sql, notifications
):
    _, received = notifications
    direct = stripe.StripeClient(real_stripe_key, base_addresses={"api": localstripe}, max_network_retries=0)
    made = direct.v1.charges.create(params={
        "amount": 4200, "currency": "usd", "source": "pm_card_visa",
        "metadata": {"customer_id": "cust_around", "billing_period": "2026-07"},
    })

    def unmetered():
        return sql(
            "SELECT id, charge_ids::text FROM reconciliation_findings "
            "WHERE kind = 'unmetered' AND customer_id = 'cust_around'"
        )

    (finding_id, charge_ids), = wait_until(unmetered, "the unmetered finding")
    assert charge_ids == "{" + made.id + "}"

    def announced():
        while True:
            body = received.get(timeout=30)
            if body["event"] == "finding.unmetered" and body["finding"]["customer_id"] == "cust_around":
                return body

    body = announced()
    assert made.id in body["text"]
    assert sql(
        f"SELECT count(*) FROM alert_notifications WHERE finding_id = {finding_id}"
    ) == [["1"]], "one notification however many passes found it"


def test_a_forged_event_is_refused_and_recorded(live, sql):
    body = json.dumps({"id": "evt_forged", "object": "event", "type": "charge.succeeded", "created": int(time.time()),
                       "data": {"object": {"id": "ch_forged"}}}).encode()
    forged = urllib.request.Request(
        f"{live}/stripe/webhooks", data=body,
        headers={"Content-Type": "application/json", "Stripe-Signature": f"t={int(time.time())},v1={'0' * 64}"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged)
    assert refused.value.code == 400
    assert "webhook secret" in json.load(refused.value)["error"]["message"]
    assert sql("SELECT count(*) FROM stripe_events WHERE id = 'evt_forged'") == [["0"]]
    assert int(sql("SELECT count(*) FROM operator_actions WHERE action = 'stripe_event.refuse'")[0][0]) >= 1
