"""Starts localstripe (a stateful fake Stripe) for Vaultcap's tests.

Changes to stock localstripe, each small and tested in test_launcher.py:

* it listens on 127.0.0.1 only, on the port given (0: any free port), and
  prints `port=N` once it accepts connections, so callers need no polling;
* its store stays in memory: stock localstripe pickles it to the shared path
  /tmp/localstripe.pickle after every write, which lets concurrent runs see
  each other's objects and slows every write down as the store grows;
* it honours `Idempotency-Key` on POST as Stripe does (stock localstripe
  ignores it and charges twice): a retry with the same key and the same
  parameters gets the first answer back, marked `Idempotent-Replayed: true`,
  and changes nothing; the same key with other parameters is refused with a
  400 `idempotency_error`; a retry while the first request is still running
  gets a 409. Answers are kept per API key, for the life of the process,
  except server errors (5xx), which a retry may redo;
* charges and payment intents carry the fields async-stripe needs to decode
  them (charges: `amount_captured`, `billing_details`, `disputed`; payment
  intents: `amount_capturable`, `amount_received`, `confirmation_method`,
  `payment_method_types`), and listing either takes any of
  `created[gt|gte|lt|lte]` together and answers newest first, as Stripe does
  (stock localstripe takes `created[gt]` alone for charges, nothing for
  payment intents, and lists oldest first);
* refunds take Stripe's `reason`, refund what is left of the charge when
  no amount is given, and refuse a charge with nothing left to refund (400
  `charge_already_refunded`) instead of refunding it again;
* webhook events are sent for charges as Stripe sends them
  (`charge.succeeded`, `charge.failed`, `charge.refunded`; stock
  localstripe sends none), and every event carries Stripe's
  `pending_webhooks` and `request` (`id`, and the `idempotency_key` of the
  API request that caused it).

Usage: python localstripe_launcher.py [--port N]
"""

import argparse
import contextvars
import socket
from dataclasses import dataclass

from aiohttp import web
from localstripe import server
from localstripe.errors import UserError
from localstripe.resources import Charge, Event, PaymentIntent, Refund, Store, random_id, try_convert_to_int
from localstripe.webhooks import schedule_webhook

# The Idempotency-Key of the API request being served, for its events.
REQUEST_KEY: contextvars.ContextVar = contextvars.ContextVar("request_key", default=None)


@dataclass(frozen=True)
class SavedAnswer:
    path: str
    body: bytes
    status: int
    answer: bytes


def idempotency_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"type": "idempotency_error", "message": message}}, status=status)


def idempotent_posts():
    """An aiohttp middleware that replays POSTs by Idempotency-Key."""
    saved: dict = {}
    running: set = set()

    @web.middleware
    async def middleware(request: web.Request, handler):
        key = request.headers.get("Idempotency-Key")
        REQUEST_KEY.set(key)
        if request.method != "POST" or not key:
            return await handler(request)
        scope = (request.headers.get("Authorization", ""), key)
        body = await request.read()
        earlier = saved.get(scope)
        if earlier is not None:
            if (earlier.path, earlier.body) != (request.path, body):
                return idempotency_error(
                    400,
                    "Keys for idempotent requests can only be used with the same parameters "
                    f"they were first used with. Try using a key other than '{key}'.",
                )
            return web.Response(
                status=earlier.status,
                body=earlier.answer,
                content_type="application/json",
                headers={"Idempotent-Replayed": "true", "Idempotency-Key": key},
            )
        if scope in running:
            return idempotency_error(409, f"A request with the idempotency key '{key}' is still running.")
        running.add(scope)
        try:
            try:
                response = await handler(request)
            except UserError as error:
                response = error.to_response()
            if response.status < 500:
                saved[scope] = SavedAnswer(request.path, body, response.status, response.body)
            response.headers["Idempotency-Key"] = key
            return response
        finally:
            running.discard(scope)

    return middleware


BOUNDS = {
    "gt": lambda created, at: created > at,
    "gte": lambda created, at: created >= at,
    "lt": lambda created, at: created < at,
    "lte": lambda created, at: created <= at,
}


def ranged_listing(resource):
    """`resource`'s list as Stripe answers it: `customer` and any `created`
    bounds, newest first."""

    def list_all(cls, url, customer=None, created=None, limit=10, starting_after=None):
        if created is not None and not isinstance(created, dict):
            created = {"gte": created, "lte": created}
        wanted = []
        for op, raw in (created or {}).items():
            at = try_convert_to_int(raw)
            if op not in BOUNDS or not isinstance(at, int):
                raise UserError(400, f"Invalid created[{op}]: {raw}")
            wanted.append((BOUNDS[op], at))
        li = super(resource, cls)._api_list_all(url, limit=limit, starting_after=starting_after)
        li._list = [
            o
            for o in li._list
            if (customer is None or o.customer == customer) and all(test(o.created, at) for test, at in wanted)
        ]
        # Newest first; within a second, the later created first (the store
        # keeps creation order and the sort is stable).
        li._list.sort(key=lambda o: o.created)
        li._list.reverse()
        return li

    resource._api_list_all = classmethod(list_all)


def patch_charges() -> None:
    """Charges as Stripe shows, lists and announces them (see the module's doc)."""
    stock = Charge._initialize_charge

    def initialize(self, on_success=None, on_failure_now=None, on_failure_later=None):
        def failed_now():
            schedule_webhook(Event("charge.failed", self))
            if on_failure_now:
                on_failure_now()

        stock(self, on_success, failed_now, on_failure_later)
        if self.status == "succeeded":
            schedule_webhook(Event("charge.succeeded", self))

    Charge._initialize_charge = initialize
    Charge.amount_captured = property(
        lambda self: self.amount if self.captured and self.status == "succeeded" else 0
    )
    Charge.billing_details = property(
        lambda self: {"address": None, "email": None, "name": None, "phone": None}
    )
    Charge.disputed = property(lambda self: False)
    ranged_listing(Charge)


def patch_payment_intents() -> None:
    """Payment intents as Stripe shows and lists them (see the module's doc)."""
    PaymentIntent.amount_capturable = property(
        lambda self: self.amount if self.status == "requires_capture" else 0
    )
    PaymentIntent.amount_received = property(
        lambda self: self.amount if self.status == "succeeded" else 0
    )
    PaymentIntent.confirmation_method = property(lambda self: "automatic")
    PaymentIntent.payment_method_types = property(lambda self: ["card"])
    ranged_listing(PaymentIntent)


def patch_refunds() -> None:
    """Refunds as Stripe makes them (see the module's doc)."""
    stock = Refund.__init__
    reasons = ("duplicate", "fraudulent", "requested_by_customer")

    def refund(self, charge=None, payment_intent=None, amount=None, metadata=None, reason=None, **kwargs):
        if reason is not None and reason not in reasons:
            raise UserError(400, f"Invalid reason: must be one of {', '.join(reasons)}")
        if charge is not None:
            left = Charge._api_retrieve(charge).amount
            left -= Charge._api_retrieve(charge).amount_refunded
            wanted = try_convert_to_int(amount)
            if left <= 0:
                raise UserError(
                    400,
                    f"Charge {charge} has already been refunded.",
                    {"code": "charge_already_refunded"},
                )
            if wanted is None:
                amount = left
            elif isinstance(wanted, int) and wanted > left:
                raise UserError(400, f"Refund amount ({wanted}) is greater than unrefunded amount on charge ({left})")
        stock(self, charge=charge, payment_intent=payment_intent, amount=amount, metadata=metadata, **kwargs)
        self.reason = reason
        schedule_webhook(Event("charge.refunded", Charge._api_retrieve(self.charge)))

    Refund.__init__ = refund


def patch_events() -> None:
    """Events carry what Stripe's do (see the module's doc)."""
    stock = Event.__init__

    def event(self, type, data):
        stock(self, type, data)
        self.pending_webhooks = 1
        self.request = {"id": "req_" + random_id(14), "idempotency_key": REQUEST_KEY.get()}

    Event.__init__ = event


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    Store.dump_to_disk = lambda self: None
    patch_charges()
    patch_payment_intents()
    patch_refunds()
    patch_events()
    # Inside the authentication check, so only authenticated calls are kept.
    server.app.middlewares.insert(2, idempotent_posts())

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)

    async def announce(_app: web.Application) -> None:
        print(f"port={sock.getsockname()[1]}", flush=True)

    server.app.on_startup.append(announce)
    web.run_app(server.app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
