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
  except server errors (5xx), which a retry may redo.

Usage: python localstripe_launcher.py [--port N]
"""

import argparse
import socket
from dataclasses import dataclass

from aiohttp import web
from localstripe import server
from localstripe.errors import UserError
from localstripe.resources import Store


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    Store.dump_to_disk = lambda self: None
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
