"""Fixtures of the output tests: real servers on loopback ports, one per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
