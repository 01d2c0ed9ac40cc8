"""Starts localstripe (a stateful fake Stripe) for Vaultcap's tests.

Two changes to stock localstripe, both about running it beside other test
runs on one machine; nothing about Stripe's behaviour is changed:

* it listens on 127.0.0.1 only, on the port given (0: any free port), and
  prints `port=N` once it accepts connections, so callers need no polling;
* its store stays in memory: stock localstripe pickles it to the shared path
  /tmp/localstripe.pickle after every write, which lets concurrent runs see
  each other's objects and slows every write down as the store grows.

Usage: python localstripe_launcher.py [--port N]
"""

import argparse
import socket

from aiohttp import web
from localstripe import server
from localstripe.resources import Store


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()

    Store.dump_to_disk = lambda self: None

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
