"""The load test's OTLP/HTTP receiver decodes what the SDK's own exporter sends: names,
ids, parents, links, attributes and the resource's worker id; anything else is refused."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link

from loadtest.otlp import PATH, Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


def _provider(receiver: Receiver, compression: Compression) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create(
        {"service.name": "streamlease", "service.instance.id": "w7"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=receiver.endpoint + PATH, compression=compression)))
    return provider


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_spans_from_the_sdk_exporter_arrive_whole(receiver: Receiver,
                                                   compression: Compression) -> None:
    provider = _provider(receiver, compression)
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("streamlease.release",
                                      attributes={"streamlease.stream": "s1",
                                                  "streamlease.fence": 4,
                                                  "streamlease.released": True}) as release:
        pass
    with tracer.start_as_current_span("streamlease.reconcile"), \
            tracer.start_as_current_span(
                "streamlease.acquire", links=[Link(release.get_span_context(),
                                                   {"streamlease.link": "release"})],
                attributes={"streamlease.stream": "s1", "streamlease.how": "released"}) \
            as acquire:
        pass
    provider.shutdown()
    [got_release] = receiver.named("release", stream="s1")
    [got_acquire] = receiver.named("acquire", how="released")
    [reconcile] = receiver.named("reconcile")
    context = release.get_span_context()
    assert got_release.trace_id == f"{context.trace_id:032x}"
    assert got_release.span_id == f"{context.span_id:016x}"
    assert got_release.parent_id is None
    assert got_release.attributes == {"streamlease.stream": "s1", "streamlease.fence": 4,
                                      "streamlease.released": True}
    assert got_release.instance == "w7" and got_release.service == "streamlease"
    assert got_release.end_ns >= got_release.start_ns > 0
    assert got_acquire.parent_id == reconcile.span_id
    assert got_acquire.trace_id == reconcile.trace_id != got_release.trace_id
    assert got_acquire.span_id == f"{acquire.get_span_context().span_id:016x}"
    assert got_acquire.links_to(got_release) and not got_release.links_to(got_acquire)
    assert got_acquire.links[0].attributes == {"streamlease.link": "release"}
    assert receiver.requests == 3 and receiver.rejected == 0


def _post(receiver: Receiver, body: bytes, kind: str = "application/x-protobuf",
          path: str = PATH, encoding: str | None = None) -> int:
    headers = {"Content-Type": kind, **({"Content-Encoding": encoding} if encoding else {})}
    request = urllib.request.Request(receiver.endpoint + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_what_is_not_an_export_request_is_refused_and_counted(receiver: Receiver) -> None:
    assert _post(receiver, b"\xff\xff\xff not protobuf") == 400
    assert _post(receiver, b"not gzip", encoding="gzip") == 400
    assert _post(receiver, b"{}", kind="application/json") == 415
    assert _post(receiver, b"", path="/v1/metrics") == 404
    assert receiver.rejected == 3 and receiver.spans() == []
    # An empty request is a valid one (no spans), gzip'd or not.
    assert _post(receiver, b"") == 200
    assert _post(receiver, gzip.compress(b""), encoding="gzip") == 200
    assert receiver.requests == 2 and receiver.spans() == []


def test_the_worker_environment_names_the_receiver(receiver: Receiver) -> None:
    env = receiver.env()
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://127.0.0.1:{receiver.port}"
    assert env["OTEL_BSP_SCHEDULE_DELAY"] == "200"
    assert "OTEL_BSP_SCHEDULE_DELAY" not in receiver.env(None)
