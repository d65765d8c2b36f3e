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
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from streamlease import tenancy
from streamlease.clock import SYSTEM_CLOCK
from streamlease.core.frames import Frame
from streamlease.core.handover import OFFER_CHECK_S, OFFER_TAKERS, Offer
from streamlease.core.lease import HolderState, LeaseTimings, StopReason
from streamlease.core.membership import MemberRecord, MemberStatus, MemberTimings
from streamlease.core.model import Tenure
from streamlease.core.urls import parse_allowed_urls
from streamlease.dev.upstream import DEFAULT_MODE, UpstreamOptions, UpstreamServer, frame_for
from streamlease.errors import StoreUnavailable
from streamlease.membership import Hooks, Membership, MembershipSettings
from streamlease.metrics import Metrics
from streamlease.pump import PumpSettings
from streamlease.reconciler import Reconciler, ReconcilerSettings
from streamlease.store import codec
from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import HandOver
from streamlease.supervisor import Supervisor, SupervisorSettings
from streamlease.tenancy import Ties
from tests.fakes import FaultyStore, PumpScript, StaticMember, context
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


async def until_async(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():  # noqa: ASYNC110 - a poll with a deadline on outside state
            await asyncio.sleep(0.01)


# == the holder's side (virtual time) =====================================================


class Offers:
    """The holder's offers into its taker's member row: each recorded with the loop time
    it was made; ``written`` False: the row refused it (the taker moved on)."""

    def __init__(self, written: bool = True, error: BaseException | None = None,
                 refusing: frozenset[str] = frozenset()) -> None:
        self.written = written
        self.error = error
        self.refusing = refusing  # members whose rows refuse the offer
        self.made: list[tuple[str, str, float]] = []

    async def __call__(self, member: MemberRecord, text: str) -> bool:
        self.made.append((member.worker_id, text, asyncio.get_running_loop().time()))
        if self.error is not None:
            raise self.error
        return self.written and member.worker_id not in self.refusing

    @property
    def at(self) -> float:
        (_, _, at), = self.made
        return at


class Holder:
    """One supervisor holding "a" for "w1" under fence 1, its drains able to offer."""

    def __init__(self, script: PumpScript | None = None, offers: Offers | None = None,
                 peers: list[MemberRecord] | None = None, **settings: Any) -> None:
        self.rig = Rig(script, **{"handover_wait_s": WAIT, **settings})
        self.offers = offers or Offers()
        # The further takers, in order, when the first cannot take (None: none asked for).
        self.peers = peers
        self.asked_next: list[frozenset[str]] = []
        self.asked_rebalance: list[bool] = []  # for a rebalance, each time it was asked
        self.supervisor: Supervisor | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self, run_s: float = 5.0) -> Supervisor:
        rig = self.rig
        await rig.memory.put_started("a", URL)
        sent = rig.clock.monotonic()
        got = await rig.memory.acquire("a", "w1", rig.clock.wall_ms(), T, epoch=1)
        assert got is not None
        self.supervisor = Supervisor(rig.ctx(rng=random.Random(1)), rig.settings, got, sent,
                                     Ties(hooks=rig.hooks(), offer=self.offers,
                                          next_taker=None if self.peers is None
                                          else self.next_taker))
        self.task = asyncio.create_task(self.supervisor.run())
        await asyncio.sleep(run_s)
        return self.supervisor

    def next_taker(self, stream_id: str, tried: frozenset[str],
                   rebalance: bool) -> MemberRecord | None:
        assert stream_id == "a" and self.peers is not None
        self.asked_next.append(tried)
        self.asked_rebalance.append(rebalance)
        return next((m for m in self.peers if m.worker_id not in tried), None)

    async def offered(self, count: int = 1) -> None:
        await until(lambda: len(self.offers.made) >= count)

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
async def test_a_refused_write_ends_the_wait_even_while_the_item_cannot_be_read(
        caplog: pytest.LogCaptureFixture) -> None:
    """The holder's reads of the item fail (the store is struggling) when the taker takes
    the lease: its next write is refused, the pump stops, and the offer's wait ends there,
    not a whole ``handover_wait_s`` later with nothing left to deliver."""
    wait = 60.0
    holder = Holder(PumpScript(every=0.05, batch=2), handover_wait_s=wait)
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.offered()
    holder.rig.store.fail("check", times=-1)
    await asyncio.sleep(1.0)
    await holder.take()
    took_at = asyncio.get_running_loop().time()
    ended_at = await holder.ended()
    assert holder.calls_after("write_batch", took_at) >= 1  # refused
    assert ended_at - took_at <= OFFER_CHECK_S + 0.1
    # Nothing more was written or released under the old fence.
    record = await holder.rig.record()
    assert (record.lease_owner, record.fence) == ("w2", 2)
    assert holder.rig.store.count("release") == 0 and "a:flushed" not in holder.rig.script.log
    # Unconfirmed (the item could not be read): not told as a hand-over, nor as an offer
    # that was not taken.
    assert holder.metric("streamlease_handovers_total", outcome="not_taken") == 0

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
        offers: Offers, caplog: pytest.LogCaptureFixture) -> None:
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
    refused = offers.error is None
    assert holder.metric("streamlease_handovers_total", outcome="refused") == int(refused)
    assert holder.metric("streamlease_handovers_total", outcome="error") == int(not refused)
    said = "handover.refused" if refused else "handover.offer_failed"
    assert len(events(caplog, said)) == 1


def peer(worker_id: str) -> MemberRecord:
    return MemberRecord(worker_id, epoch=7, heartbeat=3, status=MemberStatus.ACTIVE,
                        streams=0, capacity=10)


@pytest.mark.virtual_time
async def test_a_refused_offer_goes_to_the_next_peer_which_takes_it(
        caplog: pytest.LogCaptureFixture) -> None:
    """The first taker's row refuses (it began to drain too): the holder offers the
    stream to the next peer at once, delivering all along, and that one's take ends the
    tenure as any take does: no flush, no release."""
    holder = Holder(PumpScript(every=0.05, batch=2), offers=Offers(refusing=frozenset({"w2"})),
                    peers=[peer("w3")])
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.offered(2)
    (first, _, first_at), (second, text, second_at) = holder.offers.made
    assert (first, second, text) == ("w2", "w3", "1:s:a") and second_at == first_at
    assert holder.asked_next == [frozenset({"w2"})]
    at_offer = holder.pump.committed
    await asyncio.sleep(1.0)
    assert holder.pump.committed > at_offer and "a:stop" not in holder.rig.script.log
    taken = await holder.take(owner="w3")
    await holder.ended()
    record = await holder.rig.record()
    assert (record.lease_owner, record.last_seq) == ("w3", taken.last_seq)
    assert "a:flushed" not in holder.rig.script.log
    assert holder.rig.store.count("release") == 0
    assert holder.metric("streamlease_handovers_total", outcome="refused") == 1
    (handed,) = [r.__dict__["sl_fields"] for r in events(caplog, "lease.handed_over")]
    assert handed["taker"] == "w3"
    (told,) = [r.__dict__["sl_fields"] for r in events(caplog, "handover.next_taker")]
    assert (told["taker"], told["after"], told["why"]) == ("w3", "w2", "refused")


@pytest.mark.virtual_time
async def test_a_declined_offer_goes_to_the_next_peer_with_a_wait_of_its_own() -> None:
    wait = 60.0
    holder = Holder(PumpScript(every=0.5), peers=[peer("w3")], handover_wait_s=wait)
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.offered()
    await holder.rig.memory.decline("a", "w1", 1, "w2")
    await holder.offered(2)
    assert [who for who, _, _ in holder.offers.made] == ["w2", "w3"]
    # w3's decline mark is its own: w2's does not end w3's offer.
    await asyncio.sleep(wait / 2)
    assert holder.task is not None and not holder.task.done()
    await holder.take(owner="w3")
    await holder.ended()
    assert (await holder.rig.record()).lease_owner == "w3"
    assert holder.metric("streamlease_handovers_total", outcome="declined") == 1
    assert holder.rig.store.count("release") == 0


@pytest.mark.virtual_time
async def test_offers_stop_after_the_last_peer_allowed_and_the_stream_is_released(
        caplog: pytest.LogCaptureFixture) -> None:
    everyone = frozenset({"w2", "w3", "w4", "w5"})
    holder = Holder(PumpScript(every=0.5), offers=Offers(refusing=everyone),
                    peers=[peer("w3"), peer("w4"), peer("w5")])
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.ended()
    assert [who for who, _, _ in holder.offers.made] == ["w2", "w3", "w4"][:OFFER_TAKERS]
    assert holder.metric("streamlease_handovers_total", outcome="refused") == OFFER_TAKERS
    record = await holder.rig.record()
    assert record.lease_expires_at_ms == 0 and "a:flushed" in holder.rig.script.log
    assert len(events(caplog, "handover.next_taker")) == OFFER_TAKERS - 1


@pytest.mark.virtual_time
async def test_with_no_further_peer_the_stream_is_released_after_the_first_no() -> None:
    holder = Holder(PumpScript(every=0.5), offers=Offers(refusing=frozenset({"w2"})),
                    peers=[])
    sup = await holder.start()
    sup.request_drain(StopReason.SHUTDOWN, taker=TAKER)
    await holder.ended()
    assert len(holder.offers.made) == 1 and holder.asked_next == [frozenset({"w2"})]
    assert (await holder.rig.record()).lease_expires_at_ms == 0


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
async def test_a_rebalance_every_peer_asked_said_no_to_is_kept_and_delivered(
        caplog: pytest.LogCaptureFixture) -> None:
    """The taker declines (it reached its share meanwhile) and the only further peer's
    row refuses: the holder keeps the stream, delivering all along; nothing is flushed
    or released, and a later shutdown drains (and here releases) it as any other."""
    holder = Holder(PumpScript(every=0.05, batch=2),
                    offers=Offers(refusing=frozenset({"w3"})), peers=[peer("w3")])
    sup = await holder.start()
    sup.request_drain(StopReason.REBALANCE, taker=TAKER)
    await holder.offered()
    await holder.rig.memory.decline("a", "w1", 1, "w2")
    await holder.offered(2)
    await until(lambda: bool(events(caplog, "handover.kept")))
    # Asked for a further peer after each no: w3, then nobody left.
    assert holder.asked_rebalance == [True, True]
    assert holder.asked_next == [frozenset({"w2"}), frozenset({"w2", "w3"})]
    assert sup.leaving is None and sup.holding.state is HolderState.HOLDING
    at_kept = holder.pump.committed
    await asyncio.sleep(3.0)
    assert holder.pump.committed > at_kept and "a:stop" not in holder.rig.script.log
    assert holder.rig.store.count("release") == 0
    assert holder.metric("streamlease_handovers_total", outcome="kept") == 1
    record = await holder.rig.record()
    assert (record.lease_owner, record.fence) == ("w1", 1) and record.lease_expires_at_ms
    sup.request_drain(StopReason.SHUTDOWN, release_by=asyncio.get_running_loop().time() + 30)
    await holder.ended()
    assert (await holder.rig.record()).lease_expires_at_ms == 0
    assert "a:flushed" in holder.rig.script.log
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1


@pytest.mark.virtual_time
async def test_a_rebalance_not_taken_in_time_is_still_released() -> None:
    """An offer that came to nothing in time may yet be acted on: the holder does not
    keep delivering under a fence its taker could take, it releases."""
    holder = Holder(PumpScript(every=0.5), peers=[peer("w3")])
    sup = await holder.start()
    sup.request_drain(StopReason.REBALANCE, taker=TAKER)
    await holder.ended()
    assert [who for who, _, _ in holder.offers.made] == ["w2"]
    assert (await holder.rig.record()).lease_expires_at_ms == 0
    assert holder.metric("streamlease_handovers_total", outcome="not_taken") == 1
    assert holder.metric("streamlease_handovers_total", outcome="kept") == 0


@pytest.mark.virtual_time
async def test_a_shutdown_during_a_rebalance_offer_makes_the_next_offer_a_shutdowns() -> None:
    """SIGTERM comes while a rebalance's offer is out: the decline is followed by a
    shutdown's offer (taken by a peer with room past its share), and a shutdown whose
    peers all say no releases the stream: it is never kept on a worker that stops."""
    holder = Holder(PumpScript(every=0.5), peers=[peer("w3")])
    sup = await holder.start()
    sup.request_drain(StopReason.REBALANCE, taker=TAKER)
    await holder.offered()
    sup.request_drain(StopReason.SHUTDOWN, release_by=asyncio.get_running_loop().time() + 30,
                      taker=peer("w4"))
    await holder.rig.memory.decline("a", "w1", 1, "w2")
    await holder.offered(2)
    assert [(who, text) for who, text, _ in holder.offers.made] == [("w2", "1:r:a"),
                                                                    ("w3", "1:s:a")]
    assert holder.asked_rebalance == [False]
    await holder.rig.memory.decline("a", "w1", 1, "w3")
    await holder.ended()
    # w4 was named while the rebalance's offer was out: not offered on top of the chain.
    assert len(holder.offers.made) == 2
    assert (await holder.rig.record()).lease_expires_at_ms == 0
    assert holder.metric("streamlease_handovers_total", outcome="kept") == 0
    assert holder.metric("streamlease_lease_released_total", reason="shutdown") == 1


@pytest.mark.virtual_time
async def test_a_shutdown_cuts_a_rebalance_offers_wait_to_its_own_budget() -> None:
    """A rebalance's offer waits without a deadline of its own; a shutdown that comes
    meanwhile brings one, and the wait ends by it, leaving the drain its budget."""
    wait = 60.0
    holder = Holder(PumpScript(every=0.5), handover_wait_s=wait)
    sup = await holder.start()
    sup.request_drain(StopReason.REBALANCE, taker=TAKER)
    await holder.offered()
    loop = asyncio.get_running_loop()
    sup.request_drain(StopReason.SHUTDOWN, release_by=loop.time() + 10)
    ended = await holder.ended()
    assert ended - holder.offers.at < 10 < wait
    assert (await holder.rig.record()).lease_expires_at_ms == 0


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


# == the taker's side (real time, the reference upstream on 127.0.0.1) ====================

LOOPBACK = parse_allowed_urls("ws://127.0.0.1")
STREAM = LeaseTimings(lease_s=30.0, heartbeat_s=5.0, skew_margin_s=1.0, safety_margin_s=1.0)


async def delivered_by(memory: MemoryStore, sid: str, owner: str = "w1",
                       url: str = "", through: int = 0) -> Tenure:
    """``sid`` held by ``owner`` under fence 1, frames 1..``through`` in the events table."""
    await memory.put_started(sid, url)
    got = await memory.acquire(sid, owner, SYSTEM_CLOCK.wall_ms(), STREAM, epoch=1)
    assert got is not None
    if through:
        frames = [Frame(i, frame_for(sid, i)) for i in range(1, through + 1)]
        await memory.write_batch(got.tenure, 0, frames, SYSTEM_CLOCK.wall_ms())
    return got.tenure


async def seqs(memory: MemoryStore, sid: str) -> list[int]:
    return [f.seq async for f in memory.read_events(sid)]


def opened(up: UpstreamServer) -> int:
    """WebSocket connections the upstream accepted."""
    return int(up.stats()["modes"][DEFAULT_MODE]["opened"])


class Taker:
    """One worker's reconciler (real pumps), told the offers its heartbeat read back."""

    def __init__(self, memory: MemoryStore, owner: str = "w2", max_streams: int = 10,
                 **supervisor: Any) -> None:
        self.memory = memory
        self.store = FaultyStore(memory)
        self.metrics = Metrics()
        self.member = StaticMember()
        self.reconciler = Reconciler(
            context(self.store, SYSTEM_CLOCK, self.metrics, leases=self.store, owner=owner),
            ReconcilerSettings(
                reconcile_s=1.0, sweep_s=60.0, max_streams=max_streams, acquire_per_cycle=10,
                stopped_check_s=2.0,
                supervisor=SupervisorSettings(
                    timings=STREAM, allowed_urls=LOOPBACK,
                    pump=PumpSettings(allowed_urls=LOOPBACK, batch_max_s=0.05,
                                      open_timeout_s=2.0),
                    call_timeout_s=1.0, drain_timeout_s=2.0, handover_wait_s=5.0,
                    **supervisor)),
            self.member, tenancy.Hooks())
        self.task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Taker]:
        self.task = asyncio.create_task(self.reconciler.run())
        try:
            await until(lambda: self.reconciler.holdings.tg is not None)
            yield self
        finally:
            if not self.reconciler.stopping.is_set():
                self.reconciler.stop(release_by=SYSTEM_CLOCK.monotonic() + 5)
            await asyncio.wait_for(self.task, 10)

    def offer(self, *texts: str) -> None:
        self.reconciler.offered(frozenset(texts))

    def metric(self, name: str, **labels: str) -> float:
        return total(self.metrics, name, **labels)

    async def acted_on(self, count: int = 1) -> None:
        """Until ``count`` offers were acted on and taken off the row."""
        await until(lambda: len(self.member.offers_cleared) >= count)


async def test_an_offer_read_back_from_the_row_is_dialled_ahead_taken_and_served(
        caplog: pytest.LogCaptureFixture) -> None:
    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0, initial_backlog=40)) as up:
        memory = MemoryStore()
        await delivered_by(memory, "s001", url=up.url_for("s001"), through=10)
        taker = Taker(memory)
        text = Offer("s001", 1, rebalance=False).text
        async with taker.running():
            taker.offer(text)
            taker.offer(text)  # the next heartbeat reads it back before it is cleared
            await until(lambda: "s001" in taker.reconciler.supervisors)
            await until_async(lambda: _at_least(memory, "s001", 80))
            served = taker.reconciler.supervisors["s001"]
            assert served.tenure.fence == 2 and served.tenure.last_seq == 10
            record = await memory.get("s001")
            assert record is not None and (record.lease_owner, record.fence) == ("w2", 2)
            # Served from the connection opened ahead: the pump dialled nothing more.
            assert opened(up) == 1
        got = await seqs(memory, "s001")
        assert got == list(range(1, len(got) + 1)), "a gap or a duplicate at the take"
        # Acted on once: one read, one take; no resume read (the checkpoint is exact).
        assert taker.store.count("take_handed") == 1
        assert taker.store.count("newest_event") == 0
        assert taker.store.count("decline") == 0
        assert taker.member.offers_cleared == [text]
        assert taker.metric("streamlease_handovers_total", outcome="taken") == 1
        assert taker.metric("streamlease_handovers_total") == 1
        (acquired,) = [r.__dict__["sl_fields"] for r in events(caplog, "lease.acquired")]
        assert (acquired["how"], acquired["previous_owner"], acquired["fence"],
                acquired["last_seq"]) == ("handed", "w1", 2, 10)


async def _at_least(memory: MemoryStore, sid: str, count: int) -> bool:
    return len(await seqs(memory, sid)) >= count


@pytest.mark.parametrize("why", ["full", "not accepting", "stopping"])
async def test_a_taker_that_cannot_take_says_so_on_the_item_without_dialling(
        why: str) -> None:
    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0)) as up:
        memory = MemoryStore()
        await delivered_by(memory, "s001", url=up.url_for("s001"), through=3)
        taker = Taker(memory, max_streams=0 if why == "full" else 10)
        if why == "not accepting":
            taker.member.accepting = False
        text = Offer("s001", 1, rebalance=False).text
        async with taker.running():
            if why == "stopping":
                # Told of the offer as it begins to stop (its supervisors still drain).
                taker.reconciler.stop(release_by=SYSTEM_CLOCK.monotonic() + 5)
            taker.offer(text)
            await taker.acted_on()
        record = await memory.get("s001")
        assert record is not None
        assert codec.handover_declined(record) == "1:w2"
        assert (record.lease_owner, record.fence, record.last_seq) == ("w1", 1, 3)
        assert opened(up) == 0 and taker.store.count("take_handed") == 0
        assert taker.metric("streamlease_handovers_total", outcome="no_room") == 1
        assert taker.member.offers_cleared == [text]
        assert not taker.reconciler.supervisors


async def test_a_rebalance_is_taken_only_below_the_takers_own_share() -> None:
    """Past its share a taker would only shed the stream again: it declines a rebalance,
    but still takes a stream whose holder shuts down."""
    async with UpstreamServer(UpstreamOptions(streams=2, rate=200.0)) as up:
        memory = MemoryStore()
        for sid in ("s001", "s002"):
            await delivered_by(memory, sid, url=up.url_for(sid), through=2)
        taker = Taker(memory)
        taker.reconciler.holdings.share_level = 0
        rebalance = Offer("s001", 1, rebalance=True).text
        shutdown = Offer("s002", 1, rebalance=False).text
        async with taker.running():
            taker.offer(rebalance, shutdown)
            await taker.acted_on(2)
            assert set(taker.reconciler.supervisors) == {"s002"}
        declined = await memory.get("s001")
        assert declined is not None and codec.handover_declined(declined) == "1:w2"
        assert declined.lease_owner == "w1"
        assert taker.metric("streamlease_handovers_total", outcome="no_room") == 1
        assert taker.metric("streamlease_handovers_total", outcome="taken") == 1


async def test_an_offer_that_is_no_offer_is_counted_unreadable_and_cleared() -> None:
    memory = MemoryStore()
    taker = Taker(memory)
    async with taker.running():
        taker.offer("no offer at all")
        await taker.acted_on()
    assert taker.metric("streamlease_handovers_total", outcome="unreadable") == 1
    assert taker.metric("streamlease_handovers_total") == 1
    assert taker.member.offers_cleared == ["no offer at all"]
    assert taker.store.count("check") == taker.store.count("take_handed") == 0
    assert taker.store.count("decline") == 0
    assert taker.metrics.registry.get_sample_value(
        "streamlease_task_crashes_total", {"task": "handover"}) in (None, 0.0)


@pytest.mark.parametrize("moved", ["released", "fence moved", "stream gone"])
async def test_an_offer_whose_lease_moved_on_is_dropped_without_a_word(moved: str) -> None:
    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0)) as up:
        memory = MemoryStore()
        tenure = await delivered_by(memory, "s001", url=up.url_for("s001"), through=2)
        if moved == "released":
            assert await memory.release(tenure)
        elif moved == "fence moved":
            assert (await memory.force_release("s001")).changed
            assert await memory.acquire("s001", "w1", SYSTEM_CLOCK.wall_ms(), STREAM)
        taker = Taker(memory)
        offer = "1:s:s001" if moved != "stream gone" else "1:s:s999"
        async with taker.running():
            taker.offer(offer)
            await taker.acted_on()
        assert taker.metric("streamlease_handovers_total", outcome="moved_on") == 1
        assert opened(up) == 0 and taker.store.count("take_handed") == 0
        assert taker.store.count("decline") == 0
        record = await memory.get("s001")
        assert record is not None and codec.handover_declined(record) is None
        assert not taker.reconciler.supervisors


async def test_an_upstream_that_cannot_be_dialled_ahead_is_declined() -> None:
    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0)) as up:
        memory = MemoryStore()
        # A path the upstream does not serve: its handshake is refused (404).
        await delivered_by(memory, "s001", url=f"{up.base_url}/no-such-feed/s001", through=2)
        taker = Taker(memory)
        async with taker.running():
            taker.offer("1:s:s001")
            await taker.acted_on()
        record = await memory.get("s001")
        assert record is not None and codec.handover_declined(record) == "1:w2"
        assert (record.lease_owner, record.fence) == ("w1", 1)
        assert taker.metric("streamlease_handovers_total", outcome="dial_failed") == 1
        assert taker.store.count("take_handed") == 0 and not taker.reconciler.supervisors
        assert opened(up) == 0


async def test_an_item_the_taker_cannot_serve_is_declined_before_any_dial() -> None:
    memory = MemoryStore()
    # Not on the taker's allow list (and never dialled: the item is refused first).
    await delivered_by(memory, "s001", url="ws://127.0.0.2:9/s001", through=2)
    taker = Taker(memory)
    async with taker.running():
        taker.offer("1:s:s001")
        await taker.acted_on()
    record = await memory.get("s001")
    assert record is not None and codec.handover_declined(record) == "1:w2"
    assert taker.metric("streamlease_handovers_total", outcome="unservable") == 1
    assert taker.store.count("take_handed") == 0



async def test_a_take_that_lands_as_the_taker_begins_to_stop_is_handed_straight_back() -> None:
    """Room when it looked, stopping when the lease arrives: nothing may serve it here, so
    the lease goes straight back (an orphan now) and the connection opened ahead is
    closed, not left open to the upstream."""
    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0)) as up:
        memory = MemoryStore()
        await delivered_by(memory, "s001", url=up.url_for("s001"), through=5)
        taker = Taker(memory)
        entered, proceed = asyncio.Event(), asyncio.Event()

        async def take_when_told(claim: HandOver, timeout: float | None = None) -> Any:
            entered.set()
            await proceed.wait()
            return await memory.take_handed(claim, timeout=timeout)

        taker.store.take_handed = take_when_told  # type: ignore[attr-defined]
        async with taker.running():
            taker.offer("1:s:s001")
            async with asyncio.timeout(5):
                await entered.wait()
            assert up.stats()["streams"]["s001"]["connections"] == 1  # dialled ahead
            taker.reconciler.stop(release_by=SYSTEM_CLOCK.monotonic() + 5)
            proceed.set()
            await taker.acted_on()
        record = await memory.get("s001")
        assert record is not None
        assert (record.lease_owner, record.fence, record.lease_expires_at_ms,
                record.last_seq) == ("w2", 2, 0, 5)
        assert taker.metric("streamlease_handovers_total", outcome="handed_back") == 1
        assert not taker.reconciler.supervisors and taker.reconciler.unreleased == 0
        await until(lambda: up.stats()["streams"]["s001"]["connections"] == 0, timeout=1.0)

# == two workers, one shutting down ======================================================

MEMBER = MemberTimings(lease_s=3.0, heartbeat_s=0.25, safety_margin_s=0.5)


class Worker:
    """A whole worker but for the leader: its membership and its reconciler, real pumps."""

    def __init__(self, memory: MemoryStore, name: str) -> None:
        self.name = name
        self.store = FaultyStore(memory)
        self.metrics = Metrics()
        ctx = context(self.store, SYSTEM_CLOCK, self.metrics, leases=self.store, owner=name)
        box: list[Reconciler] = []
        self.membership = Membership(
            ctx, self.store, MembershipSettings(name, 10, MEMBER), Hooks(
                held=lambda: len(box[0].supervisors) if box else 0,
                fenced=lambda: box[0].member_lost(True) if box else None,
                self_fenced=lambda: box[0].member_lost(False) if box else None,
                fleet_changed=lambda: box[0].poke() if box else None,
                offers=lambda offers: box[0].offered(offers) if box else None))
        self.reconciler = Reconciler(ctx, ReconcilerSettings(
            reconcile_s=0.5, sweep_s=60.0, max_streams=10, acquire_per_cycle=10,
            stopped_check_s=MEMBER.heartbeat_s, min_hold_s=1000.0,
            supervisor=SupervisorSettings(
                timings=STREAM, allowed_urls=LOOPBACK,
                pump=PumpSettings(allowed_urls=LOOPBACK, batch_max_s=0.05, open_timeout_s=2.0),
                call_timeout_s=1.0, drain_timeout_s=2.0, handover_wait_s=5.0)),
            self.membership, tenancy.Hooks())
        box.append(self.reconciler)
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self.membership.register()
        self.tasks = [asyncio.create_task(self.membership.run()),
                      asyncio.create_task(self.reconciler.run())]

    async def stop(self) -> None:
        """SIGTERM's order (``streamlease.app``): draining in the row, every stream
        drained, then the row removed unless a lease may still name this worker."""
        self.membership.drain()
        self.reconciler.stop(release_by=SYSTEM_CLOCK.monotonic() + 10)
        await asyncio.wait_for(self.tasks[1], 15)
        if not self.reconciler.unreleased:
            await self.membership.leave()
        self.membership.stop()
        await asyncio.wait_for(self.tasks[0], 5)

    def sees(self, other: str) -> bool:
        return any(m.worker_id == other and m.status is MemberStatus.ACTIVE
                   for m in self.membership.view.members)

    def metric(self, name: str, **labels: str) -> float:
        return total(self.metrics, name, **labels)


async def test_a_worker_shutting_down_hands_its_stream_live_to_a_peer(
        caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM's path end to end: the holder offers the stream into the peer's row and
    goes on delivering; the peer's heartbeat reads the offer back, it dials ahead, takes
    the lease and serves from that connection. Every frame is in the events table once,
    in order, across the take; the holder neither flushes after it nor releases."""
    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0)) as up:
        memory = MemoryStore()
        await memory.put_started("s001", up.url_for("s001"))
        a, b = Worker(memory, "a"), Worker(memory, "b")
        await a.start()
        try:
            await until(lambda: "s001" in a.reconciler.supervisors)
            await until_async(lambda: _at_least(memory, "s001", 20))
            await b.start()
            await until(lambda: a.sees("b"))
            await a.stop()
            (handed,) = [r.__dict__["sl_fields"] for r in events(caplog, "lease.handed_over")]
            assert (handed["taker"], handed["reason"], handed["fence"]) == ("b", "shutdown", 1)
            await until(lambda: "s001" in b.reconciler.supervisors)
            record = await memory.get("s001")
            assert record is not None and (record.lease_owner, record.fence) == ("b", 2)
            taken_at = record.last_seq or 0
            # The offer is off the taker's row once acted on.
            await until(lambda: b.store.count("clear_offers") >= 1)
            rows = {m.worker_id: m for m in await memory.members()}
            assert rows["b"].offers == frozenset() and "a" not in rows
            await until_async(lambda: _at_least(memory, "s001", taken_at + 40))
        finally:
            for w in (a, b):
                if not all(t.done() for t in w.tasks):
                    await w.stop()
        got = await seqs(memory, "s001")
        assert got == list(range(1, len(got) + 1)), "a gap or a duplicate at the take"
        # The holder: handed over, not released, not lost.
        assert a.store.count("release") == 0
        assert a.metric("streamlease_lease_released_total", reason="shutdown") == 1
        assert a.metric("streamlease_lease_lost_total") == 0
        assert a.metric("streamlease_stale_writes_rejected_total") == 0
        assert a.metric("streamlease_handovers_total") == 0
        # The taker: one take, no resume read, one connection of its own (opened ahead).
        assert b.metric("streamlease_handovers_total", outcome="taken") == 1
        assert b.store.count("take_handed") == 1 and b.store.count("newest_event") == 0
        assert opened(up) == 2
        handed_how = [r.__dict__["sl_fields"]["how"] for r in events(caplog, "lease.acquired")]
        assert handed_how == ["hand-written", "handed"]
        # Nothing may still name the holder: it left the fleet as after a release.
        assert a.reconciler.unreleased == 0
