"""Spans for a test: an SDK tracer provider installed for it alone, whose spans are kept in
memory (``InMemorySpanExporter``); the API's global provider is reset around it, so every
other test runs with tracing off (the API's proxy, whose spans are no-ops)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from streamlease.tracing import PREFIX


def reset_tracing() -> None:
    """No tracer provider installed (the API's own test utilities do the same)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    reset_tracing()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        reset_tracing()


@pytest.fixture
def no_tracing() -> Iterator[None]:
    reset_tracing()
    yield
    reset_tracing()


def named(exporter: InMemorySpanExporter, name: str, **having: Any) -> list[ReadableSpan]:
    """The finished spans ``streamlease.<name>`` whose attributes include ``having``."""
    return [s for s in exporter.get_finished_spans() if s.name == PREFIX + name
            and all(attrs(s).get(k) == v for k, v in having.items())]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    """A span's ``streamlease.*`` attributes, without the prefix."""
    return {k.removeprefix(PREFIX): v for k, v in (span.attributes or {}).items()}


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
