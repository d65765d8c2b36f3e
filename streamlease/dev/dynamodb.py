"""An embedded DynamoDB-compatible server for development and tests (moto, served atomically).

moto's DynamoDB backend checks a condition and then writes without a lock, so two
concurrent requests can both pass the same conditional write: a lease store tested on
it can see two owners that real DynamoDB would never allow. This server fixes both
measured problems without forking moto:

* **Atomicity.** Every request runs under one lock, so each request sees the state the
  previous one left, as DynamoDB promises for single-item conditional writes and
  transactions. Connections are still accepted concurrently.
* **Index keys typed as DynamoDB types them.** DynamoDB refuses a write that puts, say,
  a string into a number-typed index key; moto stores it, and every later query of that
  index then fails with HTTP 500. Here such a write is refused with DynamoDB's
  ValidationException and the item is left as it was.
* **Transactions that stay fast.** moto deep-copies every table a transaction touches
  (to roll back on failure), so a transaction costs O(table size). Here tables are
  "copied" by reference and only the items the transaction touches are backed up and
  restored, which gives the same all-or-nothing result in O(items touched).

**Injected latency** (``--latency-ms N``, for load tests of a slow store): every request
waits N ms before it is served, in one of two places:

* ``--latency-mode serial`` (the default): inside the request lock. The server then
  behaves as a slow *and saturated* store: it completes at most 1000/N requests a
  second whatever the clients' parallelism, and a request's latency grows with the
  number of requests queued ahead of it. This is the overload that turned renew
  timeouts into ownership churn, and the one a lease protocol must survive.
* ``--latency-mode parallel``: before the lock. Concurrent requests wait out their
  delays together, so throughput stays near the unslowed server's: a slow network or
  a distant, well-provisioned service, as DynamoDB is from another region.

The lock is not fair (a waiting request may be overtaken), so in serial mode the tail
latency under saturation is longer than queue length x N.

Loopback only, no persistence: state lives as long as the process.
"""

from __future__ import annotations

import argparse
import copy
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

try:
    from moto.backends import get_backend
    from moto.dynamodb.exceptions import MockValidationException
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table
    from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
    from werkzeug.serving import BaseWSGIServer, make_server
except ImportError as exc:  # pragma: no cover - exercised by the CLI without the extra
    raise ImportError(
        "streamlease dev dynamodb needs the dev extra: pip install 'streamlease[dev]'") from exc

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_PATCH_LOCK = threading.Lock()
_patched = False
_original_transact: Callable[..., Any] | None = None
_original_put: Callable[..., Any] | None = None
_original_update: Callable[..., Any] | None = None


LATENCY_MODES = ("serial", "parallel")
MAX_LATENCY_MS = 10_000.0


class DelayedApp:
    """WSGI middleware that holds every request ``seconds`` before serving it."""

    def __init__(self, app: WSGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        time.sleep(self.seconds)
        return list(self.app(environ, start_response))


class SerializedApp:
    """WSGI middleware that runs one request at a time (the whole request, body included)."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            # Materialise the body inside the lock: a lazy iterable would run moto's
            # handler after the lock is released.
            return list(self.app(environ, start_response))


@contextmanager
def _tables_by_reference() -> Iterator[None]:
    """While set, ``copy.deepcopy(table)`` returns the table itself (see module doc)."""
    Table.__deepcopy__ = lambda self, memo: self  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del Table.__deepcopy__  # type: ignore[attr-defined]


def _touched_items(backend: Any, transact_items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(table, hash, range, backup) for every item a transaction may write."""
    touched = []
    for entry in transact_items:
        if len(entry) != 1:
            continue
        op_type, op = next(iter(entry.items()))
        table = backend.tables.get(op.get("TableName"))
        if table is None:
            continue
        attrs = op.get("Item") if op_type == "Put" else op.get("Key")
        if not isinstance(attrs, dict) or table.hash_key_attr not in attrs:
            continue
        hash_value = DynamoType(attrs[table.hash_key_attr])
        range_value = None
        if table.range_key_attr is not None:
            if table.range_key_attr not in attrs:
                continue
            range_value = DynamoType(attrs[table.range_key_attr])
        backup = copy.deepcopy(table.get_item(hash_value, range_value))
        touched.append((table, hash_value, range_value, backup))
    return touched


def _restore(touched: list[tuple[Any, ...]]) -> None:
    for table, hash_value, range_value, backup in reversed(touched):
        if backup is None:
            table.delete_item(hash_value, range_value)
        elif range_value is not None:
            table.items[hash_value][range_value] = backup
        else:
            table.items[hash_value] = backup


def _fast_transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
    assert _original_transact is not None
    touched = _touched_items(self, transact_items)
    with _tables_by_reference():
        try:
            _original_transact(self, transact_items)
        except BaseException:
            # moto's own rollback re-assigned each table to itself (a no-op here);
            # put back exactly the items the transaction may have changed.
            _restore(touched)
            raise


def _index_key_mismatch(table: Any, attrs: dict[str, Any]) -> str | None:
    """DynamoDB's message if ``attrs`` (wire format) gives an index key the wrong type."""
    declared = {a["AttributeName"]: a["AttributeType"] for a in table.attr}
    for index in table.global_indexes:
        for key in index.schema:
            name = key["AttributeName"]
            value = attrs.get(name)
            if isinstance(value, dict) and value and name in declared:
                actual = next(iter(value))
                if actual != declared[name]:
                    return (f"One or more parameter values were invalid: Type mismatch for "
                            f"Index Key {name} Expected: {declared[name]} Actual: {actual} "
                            f"IndexName: {index.name}")
    return None


def _typed_put_item(self: Any, table_name: str, item_attrs: dict[str, Any],
                    *args: Any, **kwargs: Any) -> Any:
    assert _original_put is not None
    problem = _index_key_mismatch(self.get_table(table_name), item_attrs)
    if problem:
        raise MockValidationException(problem)
    return _original_put(self, table_name, item_attrs, *args, **kwargs)


def _typed_update_item(self: Any, table_name: str, key: dict[str, Any],
                       *args: Any, **kwargs: Any) -> Any:
    assert _original_update is not None
    table = self.get_table(table_name)
    touched = _touched_items(self, [{"Update": {"TableName": table_name, "Key": key}}])
    item = _original_update(self, table_name, key, *args, **kwargs)
    problem = _index_key_mismatch(table, item.to_json()["Attributes"])
    if problem:
        _restore(touched)
        raise MockValidationException(problem)
    return item


def install_typed_index_keys() -> None:
    """Patch moto (in this process) to refuse wrongly typed index keys like DynamoDB."""
    global _original_put, _original_update
    with _PATCH_LOCK:
        if _original_put is not None:
            return
        _original_put = DynamoDBBackend.put_item
        _original_update = DynamoDBBackend.update_item
        DynamoDBBackend.put_item = _typed_put_item  # type: ignore[method-assign]
        DynamoDBBackend.update_item = _typed_update_item  # type: ignore[method-assign]


def install_fast_transactions() -> None:
    """Patch moto (in this process) to back up touched items instead of whole tables."""
    global _patched, _original_transact
    with _PATCH_LOCK:
        if _patched:
            return
        _original_transact = DynamoDBBackend.transact_write_items
        DynamoDBBackend.transact_write_items = _fast_transact_write_items  # type: ignore[method-assign]
        _patched = True


class EmbeddedDynamoDB:
    """A DynamoDB-compatible HTTP server on loopback, in a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, serialize: bool = True,
                 fast_transactions: bool = True, latency_s: float = 0.0,
                 latency_mode: str = "serial") -> None:
        if latency_mode not in LATENCY_MODES:
            raise ValueError(f"latency_mode must be one of {LATENCY_MODES}, got {latency_mode!r}")
        if not 0.0 <= latency_s <= MAX_LATENCY_MS / 1000:
            raise ValueError(f"latency_s must be 0-{MAX_LATENCY_MS / 1000:g}, got {latency_s!r}")
        self.host = host
        self.requested_port = port
        self.serialize = serialize
        self.fast_transactions = fast_transactions
        self.latency_s = latency_s
        self.latency_mode = latency_mode
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> EmbeddedDynamoDB:
        install_typed_index_keys()
        if self.fast_transactions:
            install_fast_transactions()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app: WSGIApp = create_backend_app("dynamodb")
        # Serial latency is served under the lock (a saturated server), parallel latency
        # before it (a slow path to a server with capacity to spare); see the module doc.
        if self.latency_s and self.latency_mode == "serial":
            app = DelayedApp(app, self.latency_s)
        if self.serialize:
            app = SerializedApp(app)
        if self.latency_s and self.latency_mode == "parallel":
            app = DelayedApp(app, self.latency_s)
        MotoRequestHandler.protocol_version = "HTTP/1.1"  # keep-alive for SDK clients
        self._server = make_server(self.host, self.requested_port, app, threaded=True,
                                   request_handler=MotoRequestHandler)
        self._server.daemon_threads = True  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="embedded-dynamodb", daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_address[1])

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def backend(self, region: str = "us-east-1", account: str = "123456789012") -> Any:
        """The moto backend behind this server (same process only; for seeding tests)."""
        return get_backend("dynamodb")[account][region]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> EmbeddedDynamoDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamlease dev dynamodb",
        description="Serve an embedded, atomic DynamoDB-compatible API on loopback.")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0: pick a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind")
    parser.add_argument("--latency-ms", type=float, default=0.0,
                        help="hold every request this long (load tests of a slow store)")
    parser.add_argument("--latency-mode", choices=LATENCY_MODES, default="serial",
                        help="serial: inside the request lock, a saturated store (1000/N "
                             "requests/s at most); parallel: before it, a slow network")
    # Test-only knobs: a tiny thread switch interval makes races likely, and --no-lock
    # serves plain moto, so the tests can show the race they guard against is real.
    parser.add_argument("--switch-interval", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-lock", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0-65535, got {args.port}")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error(f"--host must be a loopback address, got {args.host!r}")
    if not 0.0 <= args.latency_ms <= MAX_LATENCY_MS:
        parser.error(f"--latency-ms must be 0-{MAX_LATENCY_MS:g}, got {args.latency_ms:g}")
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    server = EmbeddedDynamoDB(args.host, args.port, serialize=not args.no_lock,
                              latency_s=args.latency_ms / 1000, latency_mode=args.latency_mode)
    try:
        server.start()
    except OSError as exc:
        print(f"streamlease dev dynamodb: cannot bind {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"listening on {server.endpoint_url}", flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
