"""An OTLP/HTTP trace receiver on loopback, for the fleet test and the load test.

``Receiver`` listens on 127.0.0.1 (an ephemeral port), accepts ``POST /v1/traces`` with an
``application/x-protobuf`` body (an ``ExportTraceServiceRequest``, optionally gzip- or
deflate-encoded, as the OpenTelemetry SDK's OTLP/HTTP exporter sends it) and keeps every
span it decodes, with the ``service.instance.id`` of the resource that sent it (a
streamlease worker's id). Workers reach it through ``env()``: the standard variables, with
a short batch delay so spans arrive within a fraction of a second of ending.

A body it cannot decode is answered 400 and counted (``rejected``), never kept.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"
PREFIX = "streamlease."
MAX_BODY = 64 * 2**20


@dataclass(frozen=True)
class Link:
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Span:
    """One received span. Ids are lower-case hex; times are epoch nanoseconds."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str | None  # None: a root
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[Link, ...]
    instance: str | None  # the resource's service.instance.id: the worker's id
    service: str | None  # service.name

    @property
    def what(self) -> str:
        """The name without ``streamlease.``: ``release``, ``acquire`` ..."""
        return self.name.removeprefix(PREFIX)

    def attr(self, key: str) -> Any:
        """A ``streamlease.<key>`` attribute (None if absent)."""
        return self.attributes.get(PREFIX + key)

    def links_to(self, other: Span) -> bool:
        return any(k.trace_id == other.trace_id and k.span_id == other.span_id
                   for k in self.links)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        out[pair.key] = _value(pair.value)
    return out


def decode(body: bytes) -> list[Span]:
    """The spans of one ``ExportTraceServiceRequest`` (``DecodeError`` if it is not one)."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[Span] = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        instance = resource.get("service.instance.id")
        service = resource.get("service.name")
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(Span(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex() or None,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    attributes=_attributes(s.attributes),
                    links=tuple(Link(k.trace_id.hex(), k.span_id.hex(),
                                     _attributes(k.attributes)) for k in s.links),
                    instance=str(instance) if instance is not None else None,
                    service=str(service) if service is not None else None))
    return spans


class Receiver:
    """The receiver, serving on a thread of its own until ``close``; also a context
    manager."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []
        self.requests = 0
        self.rejected = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                receiver._post(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: a worker exports every fraction of a second

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="otlp-receiver", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` names (the exporter adds ``/v1/traces``)."""
        return f"http://127.0.0.1:{self.port}"

    def env(self, schedule_delay_ms: int | None = 200) -> dict[str, str]:
        """A worker's environment for exporting here; ``schedule_delay_ms``: the batch
        processor's delay (None: the SDK's default, 5 s)."""
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
        if schedule_delay_ms is not None:
            env["OTEL_BSP_SCHEDULE_DELAY"] = str(schedule_delay_ms)
        return env

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def named(self, what: str, **having: Any) -> list[Span]:
        """Received spans ``streamlease.<what>`` whose ``streamlease.*`` attributes include
        ``having``."""
        return [s for s in self.spans() if s.name == PREFIX + what
                and all(s.attr(k) == v for k, v in having.items())]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        if handler.path.split("?", 1)[0] != PATH:
            self._answer(handler, 404)
            return
        kind = handler.headers.get("Content-Type", "").split(";", 1)[0].strip()
        length = int(handler.headers.get("Content-Length") or 0)
        if kind != PROTOBUF or not 0 <= length <= MAX_BODY:
            self._answer(handler, 415 if kind != PROTOBUF else 413, reject=True)
            return
        body = handler.rfile.read(length)
        try:
            encoding = handler.headers.get("Content-Encoding", "").strip().lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            spans = decode(body)
        except (DecodeError, OSError, zlib.error, EOFError):
            self._answer(handler, 400, reject=True)
            return
        with self._lock:
            self._spans.extend(spans)
            self.requests += 1
        self._answer(handler, 200, ExportTraceServiceResponse().SerializeToString())

    def _answer(self, handler: BaseHTTPRequestHandler, status: int, body: bytes = b"",
                reject: bool = False) -> None:
        if reject:
            with self._lock:
                self.rejected += 1
        handler.send_response(status)
        handler.send_header("Content-Type", PROTOBUF)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

