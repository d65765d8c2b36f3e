"""Traces across workers, end to end: three real worker processes export their spans over
OTLP/HTTP to a receiver on loopback (loadtest.otlp), which decodes what the SDK's exporter
sends. A SIGTERM hand-off shows as the old holder's release span, linked from the new
holder's acquisition, with the first flush in the acquisition's trace; a kill -9 as a
survivor's take-over span whose child acquisitions took the victim's streams."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from loadtest.audit import find_handoff, find_takeovers
from loadtest.otlp import Receiver, Span
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import Fleet, wait_until

pytestmark = pytest.mark.fleet


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as found:
        yield found


async def _delivering(fleet: Fleet, ids: list[str], beyond: dict[str, int]) -> bool:
    records = await fleet.records()
    return all((records[s].last_seq or 0) > beyond.get(s, 0) for s in ids)


async def _started(make_fleet: FleetFactory, receiver: Receiver) -> Fleet:
    fleet = make_fleet(streams=6, rate=10, env=receiver.env())
    await fleet.start(workers=3)
    await wait_until(fleet.all_owned, 30, "all 6 streams owned")
    await wait_until(lambda: _delivering(fleet, fleet.stream_ids, {}), 30, "all delivering")
    await wait_until(fleet.balanced, 20, "two streams a worker")
    return fleet


async def test_a_sigterm_hand_off_is_linked_from_release_or_take_to_first_flush(
        make_fleet: FleetFactory, receiver: Receiver) -> None:
    fleet = await _started(make_fleet, receiver)
    owners = await fleet.owners()
    victim = max(fleet.workers, key=lambda n: sum(o == n for o in owners.values()))
    survivors = set(fleet.workers) - {victim}
    fleet.workers[victim].drain()  # SIGTERM: hands over or releases, flushes spans, exits 0
    log = fleet.workers[victim].log_events
    handed = sorted({str(r["stream"]) for r in log("lease.handed_over")
                     if r.get("reason") == "shutdown"})
    released = sorted({str(r["stream"]) for r in log("lease.released")
                       if r.get("reason") == "shutdown"})
    # Two peers with room: every stream goes to one of them live (make before break).
    assert handed and not released, fleet.workers[victim].tail()

    async def linked() -> bool:
        spans = receiver.spans()
        return all(find_handoff(spans, victim, sid).linked for sid in handed)
    await wait_until(linked, 30, f"hand-offs of {handed} traced take to first flush")

    spans = receiver.spans()
    for sid in handed:
        h = find_handoff(spans, victim, sid)
        assert h.release is not None and h.acquire is not None and h.first_flush is not None
        # The acquisition on a survivor: handed from the victim, its connection dialled
        # ahead and its take (the write that moved the lease) inside it.
        assert h.acquire.instance in survivors
        assert h.acquire.attr("how") == "handed"
        assert h.acquire.attr("previous_owner") == victim
        assert h.release.what == "take" and h.release.parent_id == h.acquire.span_id
        assert h.release.attr("holder") == victim
        assert h.acquire.attr("fence") == h.release.attr("fence") + 1
        dials = [s for s in spans if s.what == "dial" and s.parent_id == h.acquire.span_id]
        assert [d.attr("ahead") for d in dials] == [True]
        assert dials[0].end_ns <= h.release.start_ns  # dialled before the fence moved
        # First delivery on the new holder, in the acquisition's trace, under its fence,
        # with no resume read: the holder's fenced writes left last_seq exact.
        assert h.first_flush.trace_id == h.acquire.trace_id
        assert h.first_flush.instance == h.acquire.instance
        assert h.first_flush.attr("fence") == h.acquire.attr("fence")
        assert not [s for s in spans if s.what == "resume_read" and s.attr("stream") == sid
                    and s.trace_id == h.acquire.trace_id]
    assert receiver.rejected == 0
    await fleet.audit()


def _on_behalf(spans: list[Span], victim: str) -> set[str]:
    """Streams a survivor acquired after a fencer released them on the victim's behalf,
    linked to that release span."""
    releases = [s for s in spans if s.what == "release" and s.attr("reason") == "on_behalf"
                and s.attr("member") == victim and s.attr("released") is True]
    return {str(a.attr("stream")) for a in spans
            if a.what == "acquire" and a.attr("acquired") is True
            and any(a.links_to(r) and r.attr("stream") == a.attr("stream") for r in releases)}


async def test_a_kill_9_take_over_is_one_trace_under_the_survivors_take_over_span(
        make_fleet: FleetFactory, receiver: Receiver) -> None:
    fleet = await _started(make_fleet, receiver)
    owners = await fleet.owners()
    victim = max(fleet.workers, key=lambda n: sum(o == n for o in owners.values()))
    survivors = set(fleet.workers) - {victim}
    before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
    # Frozen first, so what it holds is read while it can no longer hand a stream over.
    fleet.workers[victim].proc.signal(signal.SIGSTOP)
    victim_streams = sorted(s for s, o in (await fleet.owners()).items() if o == victim)
    assert victim_streams
    fleet.workers[victim].proc.kill()
    await wait_until(lambda: fleet.all_owned(by=survivors, ids=victim_streams), 30,
                     "the victim's streams taken over")
    await wait_until(lambda: _delivering(fleet, victim_streams, before), 30,
                     "the victim's streams delivering again")

    def taken_over(spans: list[Span]) -> dict[str, tuple[Span, Span]]:
        """Stream -> (its acquisition, the take-over span it is a child of), for streams
        whose first flush is in the take-over's trace too."""
        out = {}
        for t in find_takeovers(spans, victim, None):
            for acquire in t.acquired:
                sid = str(acquire.attr("stream"))
                if any(s.what == "first_flush" and s.attr("stream") == sid for s in t.trace):
                    out[sid] = (acquire, t.span)
        return out

    async def traced() -> bool:
        spans = receiver.spans()
        taken = set(taken_over(spans))
        return bool(taken) and taken | _on_behalf(spans, victim) >= set(victim_streams)
    await wait_until(traced, 30, f"the take-over of {victim_streams} traced")

    spans = receiver.spans()
    taken = taken_over(spans)
    print(f"kill -9 of {victim}: {sorted(taken)} taken over in take-over spans, "
          f"{sorted(_on_behalf(spans, victim) - set(taken))} released on its behalf")
    for sid, (acquire, root) in taken.items():
        assert sid in victim_streams
        # The take-over: a root on a survivor (the dead member wrote nothing to link to).
        assert root.instance in survivors and root.parent_id is None
        assert root.attr("member") == victim and root.attr("epoch") is not None
        # Its child acquisition, same trace and worker, took the stream from the victim.
        assert acquire.parent_id == root.span_id and acquire.trace_id == root.trace_id
        assert acquire.instance == root.instance
        assert acquire.attr("how") == "takeover" and acquire.attr("previous_owner") == victim
        assert acquire.attr("fence") is not None
    assert receiver.rejected == 0
    await fleet.audit()
