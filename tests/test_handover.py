"""Make before break (``streamlease.handover``), in process on the in-memory store.

The holder's side runs in virtual time (a supervisor with a scripted pump and an offer
callable that stands for the taker's member row; the take is the store's own
``take_handed``). The taker's side runs in real time against the reference upstream on
127.0.0.1, since it dials ahead: a reconciler told the offers its heartbeat read back,
and, at the end, two whole workers (membership, reconciler, real pumps) handing a stream
from one to the other on SIGTERM's path.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

import pytest

from streamlease.core.handover import OFFER_CHECK_S
from streamlease.core.lease import HolderState, LeaseTimings, StopReason
from streamlease.core.membership import MemberRecord, MemberStatus
from streamlease.core.model import Tenure
from streamlease.errors import StoreUnavailable
from streamlease.metrics import Metrics
from streamlease.store import codec
from streamlease.store.protocols import HandOver
from streamlease.supervisor import Supervisor
from streamlease.tenancy import Ties
from tests.fakes import PumpScript
from tests.test_supervisor import Rig, events

T = LeaseTimings(lease_s=10.0, heartbeat_s=2.0, skew_margin_s=1.0, safety_margin_s=1.0)
URL = "wss://feeds.example.com/a"
WAIT = 5.0  # the holder's handover_wait_s
TAKER = MemberRecord("w2", epoch=7, heartbeat=3, status=MemberStatus.ACTIVE, streams=0,
                     capacity=10)


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamlease")


def total(metrics: Metrics, name: str, **labels: str) -> float:
    """Every sample of ``name`` whose labels include ``labels``, summed."""
    found = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and labels.items() <= sample.labels.items():
                found += sample.value
    return found


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - a poll with a deadline on outside state
            await asyncio.sleep(0.01)


# == the holder's side (virtual time) =====================================================


class Offers:
    """The holder's offers into its taker's member row: each recorded with the loop time
    it was made; ``written`` False: the row refused it (the taker moved on)."""

    def __init__(self, written: bool = True, error: BaseException | None = None) -> None:
        self.written = written
        self.error = error
        self.made: list[tuple[str, str, float]] = []

    async def __call__(self, member: MemberRecord, text: str) -> bool:
        self.made.append((member.worker_id, text, asyncio.get_running_loop().time()))
        if self.error is not None:
            raise self.error
        return self.written

    @property
    def at(self) -> float:
        (_, _, at), = self.made
        return at


class Holder:
    """One supervisor holding "a" for "w1" under fence 1, its drains able to offer."""

    def __init__(self, script: PumpScript | None = None, offers: Offers | None = None,
                 **settings: Any) -> None:
        self.rig = Rig(script, **{"handover_wait_s": WAIT, **settings})
        self.offers = offers or Offers()
        self.supervisor: Supervisor | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self, run_s: float = 5.0) -> Supervisor:
        rig = self.rig
        await rig.memory.put_started("a", URL)
        sent = rig.clock.monotonic()
        got = await rig.memory.acquire("a", "w1", rig.clock.wall_ms(), T, epoch=1)
        assert got is not None
        self.supervisor = Supervisor(rig.ctx(rng=random.Random(1)), rig.settings, got, sent,
                                     Ties(hooks=rig.hooks(), offer=self.offers))
        self.task = asyncio.create_task(self.supervisor.run())
        await asyncio.sleep(run_s)
        return self.supervisor

    async def offered(self) -> None:
        await until(lambda: bool(self.offers.made))

    async def take(self, owner: str = "w2") -> Tenure:
        """The taker's one write, as ``Taking`` makes it."""
        rig = self.rig
        got = await rig.memory.take_handed(HandOver("a", "w1", 1, owner, rig.clock.wall_ms(),
                                                    T, epoch=TAKER.epoch))
        assert got is not None
        return got.tenure

    async def ended(self, timeout: float = 60.0) -> float:
        """Wait for the tenure to end; the loop time it ended at."""
        assert self.task is not None
        await asyncio.wait_for(self.task, timeout)
        return asyncio.get_running_loop().time()

    @property
    def pump(self) -> Any:
        return self.rig.script.pumps["a"]

    def calls_after(self, name: str, at: float) -> int:
        return sum(1 for n, t in self.rig.store.sent_at if n == name and t > at)

    def metric(self, name: str, **labels: str) -> float:
        return total(self.rig.metrics, name, **labels)


@pytest.mark.virtual_time
async def test_a_drain_with_a_taker_offers_the_stream_and_keeps_delivering_until_taken(
        caplog: pytest.LogCaptureFixture) -> None:
    """The offer goes to the taker's row and the pump runs on; once the lease is taken
    the holder's next write is refused and the tenure ends there: no flush, no release
    write, counted as released (not lost), and the refused write is no stale-fence
    alarm."""
    holder = Holder(PumpScript(every=0.05, batch=2))
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.offered()
    assert holder.offers.made == [("w2", "1:s:a", holder.offers.at)]
    assert sup.leaving is StopReason.SHUTDOWN and sup.holding.state is HolderState.HOLDING
    at_offer = holder.pump.committed
    await asyncio.sleep(1.0)  # a second of the offer's wait, still delivering
    assert holder.pump.committed > at_offer
    assert "a:stop" not in holder.rig.script.log
    taken = await holder.take()
    took_at = asyncio.get_running_loop().time()
    ended_at = await holder.ended()
    assert ended_at - took_at <= OFFER_CHECK_S + 0.1
    # What the holder delivered is exactly what the taker's tenure resumes after.
    record = await holder.rig.record()
    assert (record.lease_owner, record.fence, record.last_seq) == ("w2", 2, taken.last_seq)
    assert taken.last_seq == holder.pump.committed > at_offer
    assert record.lease_expires_at_ms == taken.expires_at_ms  # the taker's lease, as taken
    # It learnt from its next write (refused), not only from reading the item.
    assert holder.calls_after("write_batch", took_at) >= 1
    assert holder.metric("streamlease_stale_writes_rejected_total") == 0
    assert not events(caplog, "sink.stale_fence")
    # No flush and no release write after the take; the tenure ended as handed over.
    log = holder.rig.script.log
    assert "a:stop" not in log and "a:flushed" not in log
    assert holder.rig.store.count("release") == 0
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1
    assert holder.metric("streamlease_lease_lost_total") == 0
    assert holder.metric("streamlease_handovers_total") == 0  # the taker counts a take
    (handed,) = [r.__dict__["sl_fields"] for r in events(caplog, "lease.handed_over")]
    assert (handed["taker"], handed["reason"], handed["fence"]) == ("w2", "shutdown", 1)
    assert not events(caplog, "lease.released") and not events(caplog, "lease.lost")


@pytest.mark.virtual_time
async def test_a_holder_that_writes_nothing_learns_of_the_take_from_the_item() -> None:
    holder = Holder(PumpScript(every=1000.0))
    sup = await holder.start(run_s=1.0)
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.offered()
    await asyncio.sleep(1.0)
    await holder.take()
    took_at = asyncio.get_running_loop().time()
    ended_at = await holder.ended()
    assert ended_at - took_at <= OFFER_CHECK_S + 0.01
    assert holder.calls_after("write_batch", 0.0) == 0
    assert holder.rig.store.count("release") == 0 and "a:flushed" not in holder.rig.script.log
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1
    assert holder.metric("streamlease_lease_lost_total") == 0


@pytest.mark.virtual_time
async def test_an_offer_not_taken_in_time_falls_back_to_the_drain_and_a_clean_release(
        caplog: pytest.LogCaptureFixture) -> None:
    holder = Holder(PumpScript(every=0.5))
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.offered()
    at_offer = holder.pump.committed
    await holder.ended()
    (_, released_at), = [(n, t) for n, t in holder.rig.store.sent_at if n == "release"]
    waited = released_at - holder.offers.at
    assert WAIT <= waited <= WAIT + OFFER_CHECK_S + 1.0  # the wait, the flush, the release
    assert holder.rig.script.log[-3:] == ["a:stop", "a:flushed", "a:release"] or \
        holder.rig.script.log[-2:] == ["a:stop", "a:flushed"]
    assert holder.pump.committed > at_offer  # it delivered all through the wait
    record = await holder.rig.record()
    assert (record.lease_owner, record.fence, record.lease_expires_at_ms) == ("w1", 1, 0)
    mark = codec.clean_release(record)
    assert mark is not None and (mark.fence, mark.last_seq) == (1, holder.pump.committed)
    assert sup.holding.state is HolderState.RELEASED
    assert holder.metric("streamlease_handovers_total", outcome="not_taken") == 1
    assert holder.metric("streamlease_handovers_total") == 1
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1
    assert events(caplog, "handover.not_taken") and not events(caplog, "lease.handed_over")


@pytest.mark.virtual_time
async def test_a_declined_offer_is_released_at_once_not_after_the_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    wait = 60.0
    holder = Holder(PumpScript(every=0.5), handover_wait_s=wait)
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.offered()
    memory = holder.rig.memory
    # Another member's no (to some other offer of the same tenure) is not this taker's.
    await memory.decline("a", "w1", 1, "w3")
    await asyncio.sleep(2.0)
    assert holder.task is not None and not holder.task.done()
    await memory.decline("a", "w1", 1, "w2")
    declined_at = asyncio.get_running_loop().time()
    ended_at = await holder.ended()
    assert ended_at - declined_at <= OFFER_CHECK_S + 1.0  # read, flush, release
    assert ended_at - holder.offers.at < wait / 10
    record = await holder.rig.record()
    assert record.lease_expires_at_ms == 0 and codec.clean_release(record) is not None
    assert "a:flushed" in holder.rig.script.log
    assert holder.metric("streamlease_handovers_total", outcome="declined") == 1
    assert holder.metric("streamlease_handovers_total", outcome="not_taken") == 0
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1
    assert len(events(caplog, "handover.declined")) == 1


@pytest.mark.virtual_time
@pytest.mark.parametrize("offers", [Offers(written=False),
                                    Offers(error=StoreUnavailable("offer: injected"))],
                         ids=["refused", "failed"])
async def test_an_offer_that_never_reached_the_row_releases_without_waiting(
        offers: Offers) -> None:
    holder = Holder(PumpScript(every=0.5), offers=offers, handover_wait_s=60.0)
    sup = await holder.start()
    asked_at = asyncio.get_running_loop().time()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    ended_at = await holder.ended()
    assert len(offers.made) == 1
    assert ended_at - asked_at <= 1.0  # the flush and the release, no offer wait
    assert (await holder.rig.record()).lease_expires_at_ms == 0
    assert "a:flushed" in holder.rig.script.log
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1


@pytest.mark.virtual_time
async def test_a_rebalance_offer_says_so_and_is_counted_as_leaving_before_it_drains() -> None:
    holder = Holder(PumpScript(every=0.5))
    sup = await holder.start()
    sup.request_drain(StopReason.REBALANCE, taker=TAKER)
    await holder.offered()
    assert [text for _, text, _ in holder.offers.made] == ["1:r:a"]
    # Not draining yet (it delivers while offered), but the balancer counts it as going.
    assert sup.holding.reason is None and sup.leaving is StopReason.REBALANCE
    await holder.take()
    await holder.ended()
    assert holder.metric("streamlease_lease_released_total", reason="rebalance") == 1
    assert holder.rig.store.count("release") == 0


@pytest.mark.virtual_time
async def test_a_shutdown_budget_leaves_the_drain_its_own_time_after_the_offer() -> None:
    """The offer waits at most until the shutdown's release deadline less the drain's own
    budget; with no time left for it, nothing is offered."""
    holder = Holder(PumpScript(every=0.5), handover_wait_s=60.0, drain_timeout_s=5.0)
    sup = await holder.start()
    now = asyncio.get_running_loop().time()
    sup.request_drain(StopReason.SHUTDOWN, release_by=now + 8.0, taker=TAKER)
    await holder.ended()
    (_, released_at), = [(n, t) for n, t in holder.rig.store.sent_at if n == "release"]
    assert holder.offers.made and 3.0 <= released_at - now <= 3.0 + OFFER_CHECK_S + 1.0
    assert holder.metric("streamlease_handovers_total", outcome="not_taken") == 1

    short = Holder(PumpScript(every=0.5), handover_wait_s=60.0, drain_timeout_s=5.0)
    sup = await short.start()
    now = asyncio.get_running_loop().time()
    sup.request_drain(StopReason.SHUTDOWN, release_by=now + 4.0, taker=TAKER)
    await short.ended()
    assert short.offers.made == []
    assert (await short.rig.record()).lease_expires_at_ms == 0


@pytest.mark.virtual_time
async def test_an_output_that_cannot_hand_live_never_offers() -> None:
    """Without ``handover_wait_s`` (an output other than the events table) a drain with a
    taker named drains and releases as before."""
    holder = Holder(PumpScript(every=0.5), handover_wait_s=None)
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.ended()
    assert holder.offers.made == []
    assert (await holder.rig.record()).lease_expires_at_ms == 0
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1
