"""Fixtures of the output tests: real servers on loopback ports, one per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import motoserver
from tests.pgserver import PostgresServer


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL cluster on 127.0.0.1 (tests/pgserver.py), stopped and removed
    at the end of the session; skipped (or failed, with REQUIRE_POSTGRES=1) without the
    binaries."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


# --- AWS outputs: moto's server over HTTP on loopback ----------------------------------

@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    """One moto server for the session; tests use names of their own."""
    with motoserver.running() as url:
        yield url


@pytest.fixture
def aws_env(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """This test's environment points Kinesis, SQS and S3 at the moto server."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    for key, value in motoserver.aws_env(moto_url).items():
        monkeypatch.setenv(key, value)
    return moto_url
