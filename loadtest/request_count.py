"""The embedded DynamoDB with a request counter, for figures a worker's own metrics cannot give.

A worker counts its DynamoDB calls by operation (``streamlease_dynamodb_requests_total``),
not by table: its reads of the streams table and of the fleet table look the same there.
This server is ``streamlease dev dynamodb`` itself (the same arguments, the same server)
with one WSGI layer in front that counts every request by caller, operation and table:

* **caller**: the access key id of the request's SigV4 signature. The server accepts any
  key, so a load test gives its workers a key of their own (``WORKER_ACCESS_KEY``) and
  keeps another for its own reads: the two are counted apart.
* **operation**: the ``X-Amz-Target`` action (``GetItem``, ``Query``, ``GetRecords``, ...).
* **table**: for the reads (``READ_OPERATIONS``) the table, plus ``/<index>`` for a Query or
  Scan of an index; one count per table a ``BatchGetItem`` names. Other requests are
  counted under ``-`` (their bodies are not parsed: a sink transaction can be large).

``GET /_loadtest/requests`` answers ``{"requests": [[caller, operation, table, count],
...]}``, the counts since the server started.

    python -m loadtest.request_count dynamodb --port 0 [streamlease dev dynamodb options]
"""

from __future__ import annotations

import io
import json
import re
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

COUNTS_PATH = "/_loadtest/requests"
# The access key id a load test's workers sign with (any key is accepted).
WORKER_ACCESS_KEY = "loadtest-workers"
READ_OPERATIONS = ("GetItem", "BatchGetItem", "Query", "Scan")
NO_TABLE = "-"
COMMAND = ("-m", "loadtest.request_count")  # loadtest.common.Server(..., command=COMMAND)

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Key = tuple[str, str, str]  # caller, operation, table

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


def caller_of(authorization: str) -> str:
    """The access key id of a SigV4 ``Authorization`` header; ``?`` without one."""
    found = _CREDENTIAL.search(authorization)
    return found.group(1) if found else "?"


def tables_of(operation: str, body: bytes) -> list[str]:
    """The tables a read names (``table/index`` for an index); ``[NO_TABLE]`` for any
    other request or a body that is not the JSON object expected."""
    if operation not in READ_OPERATIONS:
        return [NO_TABLE]
    try:
        request = json.loads(body)
    except ValueError:
        return [NO_TABLE]
    if not isinstance(request, dict):
        return [NO_TABLE]
    if operation == "BatchGetItem":
        items = request.get("RequestItems")
        return sorted(str(t) for t in items) if isinstance(items, dict) and items \
            else [NO_TABLE]
    table = request.get("TableName")
    if not isinstance(table, str):
        return [NO_TABLE]
    index = request.get("IndexName")
    return [f"{table}/{index}" if isinstance(index, str) and index else table]


class CountingApp:
    """WSGI middleware: counts every request (see the module doc), then serves it."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.counts: Counter[Key] = Counter()

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == COUNTS_PATH and environ.get("REQUEST_METHOD") == "GET":
            body = json.dumps({"requests": self.snapshot()}).encode()
            start_response("200 OK", [("Content-Type", "application/json"),
                                      ("Content-Length", str(len(body)))])
            return [body]
        operation = str(environ.get("HTTP_X_AMZ_TARGET", "")).rpartition(".")[2] or "?"
        tables = [NO_TABLE]
        if operation in READ_OPERATIONS:
            # Read the body to find its table, and hand the server an unread copy.
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length > 0 else b""
            environ["wsgi.input"] = io.BytesIO(body)
            tables = tables_of(operation, body)
        caller = caller_of(str(environ.get("HTTP_AUTHORIZATION", "")))
        with self.lock:
            for table in tables:
                self.counts[(caller, operation, table)] += 1
        return self.app(environ, start_response)

    def snapshot(self) -> list[list[Any]]:
        with self.lock:
            return [[*key, count] for key, count in sorted(self.counts.items())]


def read_counts(endpoint: str, timeout: float = 5.0) -> Counter[Key]:
    """The counts of the server at ``endpoint`` (its ``http://host:port``)."""
    with urllib.request.urlopen(endpoint.rstrip("/") + COUNTS_PATH, timeout=timeout) as resp:
        rows = json.load(resp)["requests"]
    return Counter({(str(c), str(o), str(t)): int(n) for c, o, t, n in rows})


def main(argv: list[str] | None = None) -> int:
    """``streamlease dev dynamodb``'s ``main`` with the counter put in front of its app."""
    from streamlease.dev import dynamodb

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["dynamodb"]:
        args = args[1:]
    start = dynamodb.EmbeddedDynamoDB.start

    def counted_start(self: dynamodb.EmbeddedDynamoDB) -> dynamodb.EmbeddedDynamoDB:
        start(self)
        server = self._server
        assert server is not None
        # The request handler reads ``server.app`` for every request.
        server.app = CountingApp(server.app)
        return self

    dynamodb.EmbeddedDynamoDB.start = counted_start  # type: ignore[method-assign]
    return dynamodb.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
