"""Fixtures for driving Vaultcap with the official stripe-python SDK.

scripts/test runs these after the cargo and browser tests, with the private
PostgreSQL cluster of the run in E2E_DATA_DIR. The fixtures start localstripe
(through localstripe_launcher.py) and `vaultcap serve` in front of it, each
on a free port announced on stdout, and stop both at the end.
"""

import contextlib
import json
import os
import pathlib
import subprocess
import sys
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
VAULTCAP = os.environ.get("VAULTCAP_BIN", str(ROOT / "target" / "debug" / "vaultcap"))
DATA_DIR = os.environ.get("E2E_DATA_DIR")
REAL_STRIPE_KEY = "sk_test_vaultcap_upstream"


def _vaultcap_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(extra)
    return env


@contextlib.contextmanager
def serving(data_dir: str, **extra: str):
    """`vaultcap serve` over the run's cluster on a free port, with `extra`
    in its environment: its URL; stopped, and checked to stop cleanly, after."""
    proc = subprocess.Popen(
        [VAULTCAP, "serve", "--addr", "127.0.0.1:0", "--data-dir", data_dir],
        stdout=subprocess.PIPE,
        text=True,
        env=_vaultcap_env(**extra),
    )
    url = None
    for line in proc.stdout:
        if line.startswith("Vaultcap console: "):
            url = line.split(": ", 1)[1].strip()
            break
    assert url, "vaultcap serve did not start"
    try:
        yield url
    finally:
        proc.terminate()
    assert proc.wait(timeout=30) == 0, "vaultcap serve did not stop cleanly"


@pytest.fixture(scope="session")
def data_dir() -> str:
    if not DATA_DIR:
        pytest.fail("E2E_DATA_DIR is not set: run these tests through scripts/test")
    return DATA_DIR


@pytest.fixture(scope="session")
def localstripe():
    launcher = pathlib.Path(__file__).with_name("localstripe_launcher.py")
    proc = subprocess.Popen([sys.executable, str(launcher), "--port", "0"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    assert line.startswith("port="), f"localstripe did not start: {line!r}"
    yield f"http://127.0.0.1:{line.split('=')[1]}"
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def real_stripe_key() -> str:
    """The key Vaultcap forwards with; localstripe accepts any `sk_…`."""
    return REAL_STRIPE_KEY


@pytest.fixture(scope="session")
def vaultcap(localstripe, data_dir):
    # The browser tests' serve ran over this cluster with other fleet
    # settings (webhooks, upstream timeout) and has stopped: this one makes
    # its own the fleet's, as a rollout of new settings would.
    with serving(
        data_dir,
        STRIPE_API_BASE=localstripe,
        STRIPE_SECRET_KEY=REAL_STRIPE_KEY,
        VAULTCAP_REPLACE_FLEET_SETTINGS="true",
    ) as url:
        yield url


@pytest.fixture(scope="session")
def api_token(data_dir) -> str:
    out = subprocess.run(
        [
            VAULTCAP, "token", "add", "--name", "sdk tests", "--data-dir", data_dir,
            # What a billing job needs: its key, and more cap when refused.
            "--scope", "keys:create,keys:read,cap_requests:create",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=_vaultcap_env(),
    ).stdout
    return out.rsplit("Token (shown once): ", 1)[1].strip()


@pytest.fixture
def issue_key(vaultcap, api_token):
    """Issues a vault key through the key API, as a billing job does before a run."""

    def issue(body: dict) -> dict:
        request = urllib.request.Request(
            f"{vaultcap}/vault/keys",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {api_token}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request) as response:
            assert response.status == 201
            return json.load(response)

    return issue


@pytest.fixture
def sql():
    """Runs a query against the run's database; rows as lists of strings."""
    url = os.environ.get("E2E_DATABASE_URL")
    if not url:
        pytest.fail("E2E_DATABASE_URL is not set: run these tests through scripts/test")

    def query(text: str) -> list:
        out = subprocess.run(["psql", url, "-AtF", "\t", "-c", text], check=True, capture_output=True, text=True)
        return [line.split("\t") for line in out.stdout.splitlines()]

    return query


@pytest.fixture
def audit_rows(sql):
    """A key's audit decisions in order, read straight from the database."""

    def decisions(key_id: int) -> list:
        return [row[0] for row in sql(f"SELECT decision FROM audit_log WHERE vault_key_id = {int(key_id)} ORDER BY id")]

    return decisions
