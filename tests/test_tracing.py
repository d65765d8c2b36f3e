"""Spans: set up only where configured, and a stream's hand-off and take-over linked across
workers through the stream item (``trace_parent``). Spans are read back from the SDK's
in-memory exporter (tests/spans.py); the stores are the in-memory ones (the DynamoDB store's
writes are in tests/store/test_contract.py)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamlease import tracing
from streamlease.core.jobs import RunOutcome
from streamlease.leader import LeaderLease
from streamlease.store import codec
from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import Stores
from streamlease.tracing import OnBehalfReleases, link_from, traceparent_of
from tests.fakes import FaultyStore
from tests.spans import attrs, named, no_tracing, reset_tracing, spans, traceparent
from tests.test_pump import FakeSink, make_pump, run_until
from tests.test_reconciler import Fleet, events
from tests.test_reconciler import T as STREAM_LEASE
from tests.test_takeover import DEAD_STREAMS, dead_member_holding, start, stop, supervised
from tests.test_takeover import T as MEMBER_TIMINGS
from tests.test_takeover import worker as takeover_worker

__all__ = ["no_tracing", "spans"]  # fixtures

OTEL_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                  "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_TRACES_SAMPLER",
                  "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
                  "OTEL_PYTHON_TRACER_PROVIDER")


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamlease")


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# -- set-up ------------------------------------------------------------------------------

def test_without_otel_variables_nothing_is_installed_and_spans_are_no_ops(
        otel_env: pytest.MonkeyPatch, no_tracing: None) -> None:
    assert tracing.setup_tracing("w1") is False
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert not tracing.enabled()
    with tracing.span("reconcile", held=1) as span:
        assert span is trace.INVALID_SPAN
        assert traceparent_of(span) is None and traceparent_of() is None
    assert tracing.job_environment({"TRACEPARENT": "00-stale", "A": "1"}) == {"A": "1"}
    tracing.shutdown_tracing()  # nothing to flush: nothing happens


@pytest.mark.parametrize("variables", [
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_TRACES_EXPORTER": "none"},
    {"OTEL_TRACES_SAMPLER": "always_on"},  # a sampler but nowhere to send to
], ids=["sdk_disabled", "exporter_none", "no_endpoint"])
def test_an_endpoint_is_needed_and_the_sdk_may_be_disabled(
        otel_env: pytest.MonkeyPatch, no_tracing: None, variables: dict[str, str]) -> None:
    for name, value in variables.items():
        otel_env.setenv(name, value)
    assert tracing.setup_tracing("w1") is False
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@pytest.mark.parametrize("endpoint", ["OTEL_EXPORTER_OTLP_ENDPOINT",
                                      "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_an_endpoint_installs_the_sdk_named_after_the_worker(
        otel_env: pytest.MonkeyPatch, no_tracing: None, endpoint: str) -> None:
    otel_env.setenv(endpoint, "http://127.0.0.1:9")  # nothing is sent: no span is made
    otel_env.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    otel_env.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    try:
        assert tracing.setup_tracing("worker-7") is True
        provider = trace.get_tracer_provider()
        assert isinstance(provider, SdkTracerProvider) and tracing.enabled()
        resource = provider.resource.attributes
        assert resource["service.name"] == "streamlease"
        assert resource["service.instance.id"] == "worker-7"
        assert "TraceIdRatioBased{0.25}" in provider.sampler.get_description()
    finally:
        tracing.shutdown_tracing()
        reset_tracing()


def test_the_default_sampler_follows_the_parent(otel_env: pytest.MonkeyPatch,
                                                no_tracing: None) -> None:
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    otel_env.setenv("OTEL_SERVICE_NAME", "feeds")
    try:
        assert tracing.setup_tracing("w1") is True
        provider = trace.get_tracer_provider()
        assert isinstance(provider, SdkTracerProvider)
        assert provider.sampler.get_description().startswith("ParentBased{root:AlwaysOnSampler")
        assert provider.resource.attributes["service.name"] == "feeds"
    finally:
        tracing.shutdown_tracing()
        reset_tracing()


# -- helpers -----------------------------------------------------------------------------

def test_a_traceparent_round_trips_into_a_link(spans: InMemorySpanExporter) -> None:
    with tracing.span("release", stream="a", fence=3, missing=None) as span:
        text = traceparent_of(span)
    assert text is not None
    (finished,) = named(spans, "release")
    assert text == traceparent(finished)
    assert attrs(finished) == {"stream": "a", "fence": 3}
    (link,) = link_from(text)
    assert link.context.trace_id == finished.context.trace_id
    assert link.context.span_id == finished.context.span_id


@pytest.mark.parametrize("text", [
    None, "", "not-a-traceparent", "00-zz-zz-01", "5",
    "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # all-zero trace id
    "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # all-zero span id
    "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
    "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" + "x" * 600,
])
def test_anything_but_a_traceparent_gives_no_link(text: str | None) -> None:
    assert link_from(text) == []


def test_a_root_span_starts_a_trace_linked_to_the_current_one(
        spans: InMemorySpanExporter) -> None:
    with tracing.span("acquire"), tracing.span("release", root=True):
        pass
    (release,) = named(spans, "release")
    (acquire,) = named(spans, "acquire")
    assert release.parent is None
    assert release.context.trace_id != acquire.context.trace_id
    (link,) = release.links
    assert link.context.span_id == acquire.context.span_id


# -- across workers ----------------------------------------------------------------------

async def held(fleet: Fleet, stream: str, limit_s: float = 60) -> None:
    async with asyncio.timeout(limit_s):
        while stream not in fleet.held():  # noqa: ASYNC110
            await asyncio.sleep(0.05)


def acquisition_of(exporter: InMemorySpanExporter, stream: str, **having: object) -> ReadableSpan:
    found = named(exporter, "acquire", stream=stream, acquired=True, **having)
    assert len(found) == 1, [attrs(s) for s in named(exporter, "acquire")]
    return found[0]


@pytest.mark.virtual_time
async def test_a_hand_off_links_the_next_acquisition_to_the_release(
        spans: InMemorySpanExporter) -> None:
    first = Fleet(owner="w1")
    await first.streams("a")
    first.start()
    await held(first, "a")
    await first.stop()  # SIGTERM: flush and release
    taken = acquisition_of(spans, "a", previous_owner=None)
    assert attrs(taken)["how"] == "hand-written" and attrs(taken)["fence"] == 1
    assert not taken.links
    (release,) = named(spans, "release", stream="a")
    assert attrs(release) == {"stream": "a", "fence": 1, "reason": "shutdown", "attempt": 1,
                              "released": True, "clean": True}
    assert release.parent is None  # a trace of its own, linked to the acquisition's
    assert [link.context.span_id for link in release.links] == [taken.context.span_id]
    item = first.memory.items["CONN#a"]
    assert item[codec.TRACE_PARENT] == {"S": traceparent(release)}

    second = Fleet(first.memory, owner="w2")
    second.start()
    await held(second, "a")
    handed = acquisition_of(spans, "a", previous_owner="w1")
    assert attrs(handed)["how"] == "released" and attrs(handed)["fence"] == 2
    assert [(link.context.trace_id, link.context.span_id) for link in handed.links] == \
        [(release.context.trace_id, release.context.span_id)]
    (reconcile,) = [s for s in named(spans, "reconcile")
                    if s.context.span_id == handed.parent.span_id]  # type: ignore[union-attr]
    assert reconcile.parent is None
    # The release was clean (its mark names fence 1 and the checkpoint): no resume read.
    assert named(spans, "resume_read", stream="a", fence=2) == []
    await second.stop()


@pytest.mark.virtual_time
async def test_a_malformed_trace_parent_is_reported_and_not_linked(
        spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet(owner="w1")
    for sid, value in (("a", {"S": "00-not-a-traceparent"}), ("b", {"N": "5"})):
        await fleet.memory.put_item({
            "Pk": {"S": f"CONN#{sid}"}, "desired_state": {"S": "STARTED"},
            "ws_url": {"S": f"wss://feeds.example.com/{sid}"}, "lease_owner": {"S": "w0"},
            "lease_expires_at_ms": {"N": "0"}, "fence": {"N": "3"}, "trace_parent": value})
    await asyncio.sleep(fleet.memory.index_lag.max_s)
    fleet.start()
    await held(fleet, "a")
    await held(fleet, "b")
    for sid in ("a", "b"):
        taken = acquisition_of(spans, sid)
        assert attrs(taken)["how"] == "released" and attrs(taken)["fence"] == 4
        assert not taken.links
    assert fleet.metrics.registry.get_sample_value(
        "streamlease_trace_context_invalid_total") == 2
    assert sorted(r.sl_fields["stream"]  # type: ignore[attr-defined]
                  for r in events(caplog, "trace.context_invalid")) == ["a", "b"]
    await fleet.stop()


@pytest.mark.virtual_time
async def test_tracing_off_writes_no_trace_parent(no_tracing: None) -> None:
    fleet = Fleet(owner="w1")
    await fleet.streams("a")
    fleet.start()
    await held(fleet, "a")
    await fleet.stop()
    item = fleet.memory.items["CONN#a"]
    assert item["lease_expires_at_ms"] == {"N": "0"} and codec.TRACE_PARENT not in item


@pytest.mark.virtual_time
async def test_a_release_on_a_dead_members_behalf_is_linked_by_the_next_holder(
        spans: InMemorySpanExporter) -> None:
    memory = MemoryStore()
    await memory.put_started("a", "wss://feeds.example.com/a")
    got = await memory.acquire("a", "dead", 1_700_000_000_000, STREAM_LEASE, epoch=1)
    assert got is not None
    fencer = OnBehalfReleases(FaultyStore(memory))  # as the worker wires membership's store
    assert await fencer.release_for("a", "dead", got.tenure.fence, 2) is True
    (release,) = named(spans, "release", stream="a")
    assert attrs(release) == {"stream": "a", "fence": 1, "reason": "on_behalf",
                              "member": "dead", "released": True}
    assert memory.items["CONN#a"][codec.TRACE_PARENT] == {"S": traceparent(release)}
    fleet = Fleet(memory, owner="w2")
    await asyncio.sleep(memory.index_lag.max_s)
    fleet.start()
    await held(fleet, "a")
    handed = acquisition_of(spans, "a")
    assert attrs(handed)["fence"] == 3 and attrs(handed)["previous_owner"] == "dead"
    assert [link.context.span_id for link in handed.links] == [release.context.span_id]
    await fleet.stop()


@pytest.mark.virtual_time
async def test_a_take_over_is_a_root_span_its_acquisitions_are_children_of(
        spans: InMemorySpanExporter) -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    dead, _ = await dead_member_holding(memory, store)
    survivors = [takeover_worker(store, name) for name in ("a", "b")]
    for w in survivors:
        await start(w)
    await asyncio.sleep(2 * MEMBER_TIMINGS.heartbeat_s)
    dead.membership.stop()  # a kill -9
    await asyncio.gather(*dead.tasks, return_exceptions=True)
    async with asyncio.timeout(4 * MEMBER_TIMINGS.lease_s):
        while supervised(survivors) < DEAD_STREAMS:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await stop(survivors)
    takeovers = {s.context.span_id: s for s in named(spans, "takeover", member="dead")}
    assert takeovers and all(s.parent is None for s in takeovers.values())
    taken = named(spans, "acquire", how="takeover", acquired=True)
    assert len(taken) == DEAD_STREAMS
    assert Counter(attrs(s)["fence"] for s in taken) == {2: DEAD_STREAMS}
    for span in taken:
        assert span.parent is not None and span.parent.span_id in takeovers
        assert span.context.trace_id == takeovers[span.parent.span_id].context.trace_id
        assert not span.links and attrs(span)["previous_owner"] == "dead"


# -- the pump: the dial, and the first flush alone ----------------------------------------

async def test_only_the_first_flush_of_a_tenure_has_a_span(spans: InMemorySpanExporter) -> None:
    from streamlease.dev.upstream import UpstreamOptions, UpstreamServer

    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0)) as up:
        sink = FakeSink()
        pump, _ = make_pump(up.url_for("s001"), sink, last_seq=10)
        with tracing.span("acquire", stream="s001") as acquisition:
            await run_until(pump, lambda: len(sink.batches) >= 4)
    parent = acquisition.get_span_context().span_id
    (flush,) = named(spans, "first_flush")
    assert attrs(flush) == {"stream": "s001", "fence": 1, "messages": len(sink.batches[0]),
                            "first_seq": 11, "last_seq": sink.batches[0][-1].seq}
    (dial,) = named(spans, "dial")
    assert attrs(dial) == {"stream": "s001", "fence": 1, "upstream": "streamlease",
                           "reconnect": False}
    assert flush.parent is not None and flush.parent.span_id == parent
    assert dial.parent is not None and dial.parent.span_id == parent


# -- jobs --------------------------------------------------------------------------------

async def test_a_job_run_has_a_span_whose_context_the_job_gets(
        spans: InMemorySpanExporter, tmp_path: Path) -> None:
    from tests.test_jobs import Rig, until

    rig = Rig()
    await rig.lease.acquire()
    task = asyncio.create_task(rig.runner.run(rig.lease, rig.stop))
    try:
        await rig.job("tick", 'echo "$TRACEPARENT"')

        async def finished() -> bool:
            return any(r.outcome is not None for r in await rig.runs("tick"))
        await until(finished)
    finally:
        rig.stop.set()
        await asyncio.wait_for(task, 30)
        await rig.lease.release()
    runs = [r for r in await rig.runs("tick") if r.outcome is not None]
    assert runs
    for run in runs:
        assert run.outcome is RunOutcome.SUCCEEDED
        (span,) = named(spans, "job_run", slot=run.slot)
        assert attrs(span) == {"job": "tick", "slot": run.slot, "fence": run.fence,
                               "outcome": "succeeded", "exit_code": 0}
        assert span.parent is None
        assert run.output.strip() == traceparent(span)


# -- both stores: the item carries the context from the release to the next acquisition ------

async def test_the_next_acquisition_links_to_the_release_on_either_store(
        spans: InMemorySpanExporter, stores: Stores) -> None:
    now = 1_700_000_000_000
    await stores.admin.put_started("a", "wss://feeds.example.com/a")
    got = await stores.leases.acquire("a", "w1", now, STREAM_LEASE)
    assert got is not None
    with tracing.span("release", root=True, stream="a") as release_span:
        assert await stores.leases.release(
            got.tenure, trace_parent=traceparent_of(release_span)) is True
    (release,) = named(spans, "release")
    invalid: list[int] = []
    candidate = await stores.admin.get("a")  # as the orphan index shows it: released
    assert candidate is not None and tracing.how_freed(candidate) == "released"
    with tracing.span("acquire", stream="a"):
        again = await stores.leases.acquire("a", "w2", now + 1, STREAM_LEASE)
        assert again is not None
        tracing.note_acquired(again, tracing.how_freed(candidate), lambda: invalid.append(1))
    (acquire,) = named(spans, "acquire")
    assert attrs(acquire) == {"stream": "a", "acquired": True, "fence": 2}
    assert [(link.context.trace_id, link.context.span_id) for link in acquire.links] == \
        [(release.context.trace_id, release.context.span_id)]
    assert invalid == []


async def test_a_won_leader_election_has_a_span(spans: InMemorySpanExporter) -> None:
    memory = MemoryStore()
    lease = LeaderLease(memory.stores().leader, "fleet", "w1", ttl_s=3.0, heartbeat_s=0.5,
                        safety_margin_s=0.3)
    assert await lease.acquire()
    await lease.release()
    (election,) = named(spans, "leader_election")
    assert attrs(election) == {"lease": "fleet", "won": True, "fence": lease.fence}
    assert election.parent is None
