"""Spans (OpenTelemetry): one stream's hand-off or take-over, seen across workers.

Only the OpenTelemetry API is imported here, and with the API alone every span below is the
API's no-op: nothing is built, recorded or exported. ``setup_tracing`` (once, at worker
start) installs the SDK's tracer provider, with a batch processor and the OTLP/HTTP
exporter, only if the SDK is installed (the ``tracing`` extra) and an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and
``OTEL_SDK_DISABLED`` is not ``true``. The SDK reads the other standard variables itself:
the sampler (``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``, default
``parentbased_always_on``), the resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``;
``service.name`` defaults to ``streamlease``, ``service.instance.id`` is the worker id),
the exporter's headers and timeouts, the batch processor's limits.

Spans are named ``streamlease.<what>`` and their attributes ``streamlease.<name>`` (README,
"Tracing"). There is one per reconcile cycle, acquisition, resume read, dial, first flush
of a tenure, release, take of a stream handed live (``take``, inside its acquisition),
take-over of a dead member's streams, leader election and job run;
never one per message or batch.

Across workers: a release writes its span's context (a W3C ``traceparent``) on the stream
item in the same write (``trace_parent``); the next holder's acquisition span links to it.
A dead member writes nothing: a stream taken over from it is acquired inside the
survivor's take-over span (a root), and one its fencer released links to the fencer's
release span (``OnBehalfReleases``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from streamlease import __version__
from streamlease.core.membership import MemberRecord
from streamlease.core.model import StreamRecord
from streamlease.logs import event
from streamlease.store import codec
from streamlease.store.protocols import Acquired, LeaseStore

PREFIX = "streamlease."
SERVICE_NAME = "streamlease"
TRACEPARENT_ENV = "TRACEPARENT"  # a job's process gets its run span's context here
MAX_TRACEPARENT_CHARS = 512  # longer is not a traceparent (an item edited by hand)

# How a stream became free for the acquisition that took it (``streamlease.how``).
HOW_ORPHAN = "orphan"  # its lease expired (a holder that crashed or stalled)
HOW_RELEASED = "released"  # released: by its holder, on a dead member's behalf, by ctl
HOW_TAKEOVER = "takeover"  # a dead member's stream, taken straight over
HOW_HAND_WRITTEN = "hand-written"  # never held: written by an operator
HOW_HANDED = "handed"  # offered by its live holder and taken from it (a hand-over)

AttributeValue = str | bool | int | float
S = TypeVar("S")
P = ParamSpec("P")

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: tuple[trace.TracerProvider, trace.Tracer] | None = None  # the provider's tracer
_installed: Any = None  # the SDK tracer provider setup_tracing installed, if any


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def setup_tracing(worker_id: str) -> bool:
    """Install the SDK's tracer provider (batch processor, OTLP/HTTP exporter) if the SDK is
    installed, an OTLP endpoint is set and ``OTEL_SDK_DISABLED`` is not true; True if it
    was. Otherwise nothing is installed and every span is the API's no-op."""
    global _installed
    env = os.environ
    if _installed is not None:
        return True
    if _truthy(env.get("OTEL_SDK_DISABLED")) or env.get("OTEL_TRACES_EXPORTER") == "none":
        return False
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return False
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        event(logging.WARNING, "tracing.sdk_missing", "an OTLP endpoint is set but the "
              "OpenTelemetry SDK is not installed (pip install 'streamlease[tracing]'); "
              "no spans are exported", error=str(exc))
        return False
    attributes: dict[str, AttributeValue] = {"service.instance.id": worker_id}
    if not env.get("OTEL_SERVICE_NAME") and \
            "service.name=" not in env.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes["service.name"] = SERVICE_NAME
    # No sampler given: the SDK takes OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG.
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    _installed = provider
    event(logging.INFO, "tracing.exporting", "exporting spans over OTLP/HTTP",
          sampler=env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on"),
          sampler_arg=env.get("OTEL_TRACES_SAMPLER_ARG"))
    return True


def shutdown_tracing(timeout_s: float = 2.0) -> None:
    """Flush what is still queued (at most ``timeout_s``) and stop the exporter; nothing
    if ``setup_tracing`` installed nothing. Called once, as the worker exits."""
    global _installed
    provider, _installed = _installed, None
    if provider is None:
        return
    try:
        provider.force_flush(int(timeout_s * 1000))
        provider.shutdown()
    except Exception as exc:  # exporting is best effort: never fail the exit over it
        event(logging.WARNING, "tracing.shutdown_failed", "flushing spans at exit failed",
              error=repr(exc)[:300])


def enabled() -> bool:
    """Whether spans are recorded at all: a real tracer provider is installed (by
    ``setup_tracing``, or by a test)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def tracer() -> trace.Tracer:
    """The worker's tracer, from the tracer provider installed now (the API's proxy, whose
    tracer is a no-op, until one is)."""
    global _tracer
    provider = trace.get_tracer_provider()
    if _tracer is None or _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer("streamlease", __version__))
    return _tracer[1]


@contextlib.contextmanager
def span(name: str, *, root: bool = False, links: Sequence[Link] = (),
         **attributes: AttributeValue | None) -> Iterator[Span]:
    """``streamlease.<name>`` as the current span, attributes named ``streamlease.<key>``
    (None values left out). ``root``: the start of a trace of its own, linked to the span
    that was current (if any) instead of being its child. With tracing off: the no-op
    span, and nothing else is done."""
    if not enabled():
        yield trace.INVALID_SPAN
        return
    parent: otel_context.Context | None = None
    if root:
        parent = otel_context.Context()
        current = trace.get_current_span().get_span_context()
        if current.is_valid:
            links = [*links, Link(current, {PREFIX + "link": "parent"})]
    with tracer().start_as_current_span(PREFIX + name, context=parent, links=links,
                                       attributes=_attributes(attributes)) as current_span:
        yield current_span


def takeover_span(method: Callable[Concatenate[S, MemberRecord, P], Coroutine[Any, Any, None]]
                  ) -> Callable[Concatenate[S, MemberRecord, P], Coroutine[Any, Any, None]]:
    """Run a take-over of a dead member's streams (a method whose first argument is the dead
    member's row) in a ``streamlease.takeover`` span: a root, since the dead member wrote
    nothing to link to; the acquisitions it makes are its children."""
    @functools.wraps(method)
    async def traced(self: S, dead: MemberRecord, /, *args: P.args, **kwargs: P.kwargs) -> None:
        with span("takeover", root=True, member=dead.worker_id, epoch=dead.epoch):
            await method(self, dead, *args, **kwargs)
    return traced


def set_attributes(target: Span | None = None, **attributes: AttributeValue | None) -> None:
    """Set ``streamlease.<key>`` attributes on ``target`` (default: the current span)."""
    target = trace.get_current_span() if target is None else target
    if target.is_recording():
        target.set_attributes(_attributes(attributes))


def _attributes(attributes: dict[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    return {PREFIX + key: value for key, value in attributes.items() if value is not None}


def traceparent_of(target: Span | None = None) -> str | None:
    """``target``'s context (default: the current span's) as a W3C ``traceparent``; None
    for the no-op span (tracing off)."""
    target = trace.get_current_span() if target is None else target
    if not target.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(target))
    return carrier.get("traceparent")


def link_from(traceparent: str | None) -> list[Link]:
    """A link to the span a W3C ``traceparent`` names; [] if None or not a valid one."""
    if not traceparent or len(traceparent) > MAX_TRACEPARENT_CHARS:
        return []
    extracted = _PROPAGATOR.extract({"traceparent": traceparent})
    context = trace.get_current_span(extracted).get_span_context()
    return [Link(context)] if context.is_valid else []


def how_freed(record: StreamRecord) -> str:
    """How an orphan the index returned became free (``streamlease.how``)."""
    if record.lease_owner is None:
        return HOW_HAND_WRITTEN
    if record.lease_expires_at_ms == 0:
        return HOW_RELEASED
    return HOW_ORPHAN


def note_acquired(got: Acquired, how: str, on_invalid: Callable[[], None]) -> None:
    """Complete the current acquisition span: the fence and checkpoint acquired, and for a
    released stream a link to the span that released it (the item's ``trace_parent``).
    A ``trace_parent`` that is not a valid traceparent (an item edited by hand) is
    logged and counted (``on_invalid``), and not linked. Nothing with tracing off."""
    current = trace.get_current_span()
    if not current.is_recording():
        return
    current.set_attributes(_attributes({"acquired": True, "fence": got.tenure.fence,
                                        "last_seq": got.tenure.last_seq}))
    # An expired lease's trace_parent is an older release's; a take-over has its parent.
    if how not in (HOW_RELEASED, HOW_HAND_WRITTEN):
        return
    text = codec.trace_parent(got.record)
    if text is None:
        return
    links = link_from(text)
    if not links:
        on_invalid()
        event(logging.WARNING, "trace.context_invalid", "the stream item's trace_parent is "
              "not a W3C traceparent; the acquisition is not linked to its release",
              stream=got.tenure.stream_id, fence=got.tenure.fence, trace_parent=text[:100])
        return
    current.add_link(links[0].context, {PREFIX + "link": "release"})


def job_environment(base: dict[str, str]) -> dict[str, str]:
    """A job process's environment: ``base`` with ``TRACEPARENT`` set to the current span's
    context (the job run's), or without one inherited from the worker's own environment
    when there is none."""
    env = {k: v for k, v in base.items() if k not in (TRACEPARENT_ENV, "TRACESTATE")}
    traceparent = traceparent_of()
    if traceparent is not None:
        env[TRACEPARENT_ENV] = traceparent
    return env


class OnBehalfReleases:
    """A ``LeaseStore`` whose ``release_for`` (a fencer releasing a dead member's stream on
    its behalf) runs in a ``streamlease.release`` span of its own and stores that span's
    context on the item, so the stream's next holder links to it; every other call goes
    straight to the wrapped store."""

    def __init__(self, leases: LeaseStore) -> None:
        self.leases = leases

    def __getattr__(self, name: str) -> Any:
        return getattr(self.leases, name)

    async def release_for(self, stream_id: str, owner: str, fence: int, fenced_epoch: int,
                          timeout: float | None = None,
                          trace_parent: str | None = None) -> bool:
        with span("release", root=True, stream=stream_id, fence=fence, reason="on_behalf",
                  member=owner) as current:
            released = await self.leases.release_for(
                stream_id, owner, fence, fenced_epoch, timeout=timeout,
                trace_parent=trace_parent or traceparent_of(current))
            set_attributes(current, released=released)
            return released
