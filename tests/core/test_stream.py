"""The pump's protocol state machine: pure, table-driven, no event loop."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from streamlease.core.frames import MAX_SEQ, Frame, Malformed
from streamlease.core.stream import (
    BATCH_FILL_BYTES,
    FRAME_ITEM_BYTES,
    RateLimit,
    Reconnect,
    StreamMachine,
    StreamRules,
    Verdict,
    sink_retry_cap,
    stream_buffer_bytes,
)

A = Verdict.ACCEPTED
G = Verdict.GAP
D = Verdict.DUPLICATE
J = Verdict.JUMP
M = Verdict.MALFORMED
C = Verdict.CLOSING
BAD = Malformed("not JSON")

# first_batch_s = batch_max_s: these cases are about the steady state; the quick first
# batch of a connection has its own test.
RULES = StreamRules(batch_max_messages=1000, batch_max_bytes=10**9, batch_max_s=1.0,
                    first_batch_s=1.0, max_seq_jump=1000, stall_s=60.0, reconnect_base_s=1.0,
                    reconnect_cap_s=8.0, stable_after_s=5.0, log_every_s=5.0)


def machine(committed: int = 10, rules: StreamRules = RULES, now: float = 0.0) -> StreamMachine:
    m = StreamMachine(rules, committed, random.Random(7))
    assert m.connect(now) == committed + 1
    return m


def frame(seq: int, size: int = 10) -> Frame:
    return Frame(seq, "x" * size)


def feed(m: StreamMachine, items: list[int | Malformed], now: float = 0.0,
         size: int = 10) -> list[Verdict]:
    return [m.receive(BAD if isinstance(i, Malformed) else frame(i, size), size, now).verdict
            for i in items]


# -- sequence rules ------------------------------------------------------------------------


@dataclass(frozen=True)
class SeqCase:
    name: str
    committed: int
    seqs: list[int | Malformed]
    verdicts: list[Verdict]
    received: int


SEQ_CASES = [
    SeqCase("in order", 10, [11, 12, 13], [A, A, A], 13),
    SeqCase("first above from_seq is a gap", 10, [15, 16], [G, A], 16),
    SeqCase("a later skip is not a gap (seqs need only increase)", 10, [11, 15], [A, A], 15),
    SeqCase("the committed seq again is a duplicate", 10, [10, 11], [D, A], 11),
    SeqCase("an upstream replaying from earlier", 10, [5, 6, 11], [D, D, A], 11),
    SeqCase("a buffered seq again is a duplicate", 10, [11, 12, 12], [A, A, D], 12),
    SeqCase("a poisoned 2**63-1 is refused and the stream goes on", 10,
            [11, MAX_SEQ, 12, 13], [A, J, A, A], 13),
    SeqCase("a poisoned first frame is refused", 10, [MAX_SEQ, 11], [J, A], 11),
    SeqCase("a refused first frame leaves the gap check to the next", 10, [5000, 12],
            [J, G], 12),
    SeqCase("a jump of exactly max_seq_jump is accepted", 10, [11, 1011], [A, A], 1011),
    SeqCase("one more is refused", 10, [11, 1012], [A, J], 11),
    SeqCase("first frame: measured from from_seq - 1, within", 10, [1010], [G], 1010),
    SeqCase("first frame: measured from from_seq - 1, beyond", 10, [1011], [J], 10),
    SeqCase("a fresh stream asks from 1: a first seq over the limit is refused", 0,
            [1001, 1], [J, A], 1),
    SeqCase("an upstream that reset its numbering: only duplicates", 5000, [1, 2, 3],
            [D, D, D], 5000),
    SeqCase("malformed frames are dropped, the stream goes on", 10, [BAD, 11, BAD],
            [M, A, M], 11),
]


@pytest.mark.parametrize("case", SEQ_CASES, ids=lambda c: c.name)
def test_sequence_rules(case: SeqCase) -> None:
    m = machine(case.committed)
    assert feed(m, case.seqs) == case.verdicts
    assert m.received == case.received
    # Only accepted frames are ever written.
    m.flush()
    written = [f.seq for f in m.next_batch() or []]
    accepted = [s for s, v in zip(case.seqs, case.verdicts, strict=True) if v.accepted]
    assert written == accepted


def test_the_reference_of_each_verdict_names_the_highest_received() -> None:
    m = machine(10)
    got = [m.receive(frame(s), 1, 0.0) for s in (15, 12, 16, MAX_SEQ)]
    assert [(g.verdict, g.reference) for g in got] == [(G, 10), (D, 15), (A, 15), (J, 16)]


def test_a_reconnect_starts_from_what_the_sink_has() -> None:
    m = machine(10)
    feed(m, [11, 12])
    m.flush()
    batch = m.next_batch()
    assert batch is not None
    m.written(batch)
    step = m.disconnected("error", 1.0)
    assert step == Reconnect("error", step.delay_s if step else 0.0, 13)
    assert step is not None and 0.5 <= step.delay_s <= 1.0
    assert m.connect(2.0) == 13 and m.received == 12
    assert feed(m, [12, 14]) == [D, G]  # the first frame is compared with from_seq again


def test_connecting_with_unwritten_frames_is_refused() -> None:
    m = machine(10)
    feed(m, [11])
    m.disconnected("error", 1.0)
    with pytest.raises(RuntimeError):
        m.connect(2.0)


# -- batch triggers ------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchCase:
    name: str
    rules: StreamRules
    sizes: list[int]  # one frame each, seqs 11, 12, ...
    batches: list[list[int]]  # cut batches, in order
    left: list[int]  # still buffered


def rules(**kw: float) -> StreamRules:
    base = {"batch_max_messages": 1000, "batch_max_bytes": 10**9, "batch_max_s": 1.0,
            "first_batch_s": 1.0}
    base.update(kw)
    return StreamRules(**base)  # type: ignore[arg-type]


BATCH_CASES = [
    BatchCase("nothing is due below every cap", rules(), [10, 10], [], [11, 12]),
    BatchCase("full by count", rules(batch_max_messages=3), [1] * 7,
              [[11, 12, 13], [14, 15, 16]], [17]),
    BatchCase("the frame that would overflow the bytes cap starts the next batch",
              rules(batch_max_bytes=100), [40, 40, 40, 40, 40],
              [[11, 12], [13, 14]], [15]),
    BatchCase("a batch filled exactly to the bytes cap waits for the next frame",
              rules(batch_max_bytes=100), [50, 50], [], [11, 12]),
    BatchCase("a frame larger than the cap alone is a batch of one",
              rules(batch_max_bytes=100), [30, 150, 30], [[11], [12]], [13]),
    # Fill: each frame counts its text plus FRAME_ITEM_BYTES (12): 30 -> 42, 38 -> 50.
    BatchCase("the frame that would overflow the fill starts the next batch",
              rules(batch_fill_bytes=100), [30, 30, 30, 30, 30], [[11, 12], [13, 14]], [15]),
    BatchCase("a batch that reaches the fill exactly is cut at once",
              rules(batch_fill_bytes=100), [38, 38, 38], [[11, 12]], [13]),
    BatchCase("a frame that alone fills the unit is a batch of one, at once",
              rules(batch_fill_bytes=100), [10, 200, 10], [[11], [12]], [13]),
    BatchCase("the count cap cuts before the fill", rules(batch_fill_bytes=1000,
              batch_max_messages=2), [1, 1, 1], [[11, 12]], [13]),
]


@pytest.mark.parametrize("case", BATCH_CASES, ids=lambda c: c.name)
def test_batch_triggers(case: BatchCase) -> None:
    m = machine(10, case.rules)
    batches: list[list[int]] = []
    for i, size in enumerate(case.sizes):
        assert m.receive(frame(11 + i, size), size, 0.0).verdict.accepted
        assert m.pause_reading == (m.next_batch() is not None)  # read on only with none due
        while (batch := m.next_batch()) is not None:
            batches.append([f.seq for f in batch])
            m.written(batch)
        assert not m.pause_reading
    assert batches == case.batches
    m.flush()
    assert [f.seq for f in m.next_batch() or []] == case.left


def test_the_fill_counts_utf8_bytes_not_characters() -> None:
    ascii_, accented = "x" * 30, "\u00e9" * 30  # 30 and 60 bytes of UTF-8
    m = machine(10, rules(batch_fill_bytes=100))
    for seq in (11, 12):
        m.receive(Frame(seq, ascii_), 80, 0.0)
    assert m.next_batch() is None  # 2 x (30 + 12) = 84
    m.flush()
    m.written(m.next_batch() or [])
    for seq in (13, 14):
        m.receive(Frame(seq, accented), 80, 0.0)
    assert [f.seq for f in m.next_batch() or []] == [13]  # 72 + 72 > 100


@dataclass(frozen=True)
class RateCase:
    name: str
    rate_hz: float
    size: int  # bytes of each frame's text
    batch_len: int  # frames in each steady-state batch
    max_wait_s: float  # the longest any frame waited before its batch was cut (at most)


# The default rules (STREAMLEASE_BATCH_MAX_SECONDS 4.5, fill one write unit), 120 s of a stream
# arriving at a steady rate; the connection's first batch is cut at once (first_batch_s).
DEFAULT_WINDOW = StreamRules().batch_max_s
RATE_CASES = [
    RateCase("1 msg/s of 100 B: the window cuts 5 a batch", 1.0, 100, 5, DEFAULT_WINDOW),
    RateCase("one every 10 s: each waits out the window alone", 0.1, 100, 1, DEFAULT_WINDOW),
    RateCase("20 msg/s of 100 B: the write unit fills first, well within a second", 20.0, 100,
             BATCH_FILL_BYTES // (100 + FRAME_ITEM_BYTES), 0.5),
    RateCase("1000 msg/s of 10 B: cut by the fill within tens of milliseconds", 1000.0, 10,
             BATCH_FILL_BYTES // (10 + FRAME_ITEM_BYTES), 0.05),
    RateCase("1 msg/s of 2 KB: each frame fills its units alone, no wait", 1.0, 2000, 1, 0.0),
]


@pytest.mark.parametrize("case", RATE_CASES, ids=lambda c: c.name)
def test_batching_follows_the_rate(case: RateCase) -> None:
    """The batch grows with a slow stream up to the window and is cut by size on a fast one;
    no frame ever waits longer than the window."""
    rules_ = StreamRules()
    m = machine(0, rules_)
    arrived: dict[int, float] = {}
    batches: list[tuple[list[int], float]] = []  # (seqs, cut at)

    def collect(now: float) -> None:
        while (batch := m.next_batch()) is not None:
            batches.append(([f.seq for f in batch], now))
            m.written(batch)

    count = int(120 * case.rate_hz)
    for i in range(count):
        at = i / case.rate_hz
        while (deadline := m.flush_deadline()) is not None and deadline <= at:
            m.tick(deadline)
            collect(deadline)
        arrived[i + 1] = at
        m.receive(Frame(i + 1, "x" * case.size), case.size + 49, at)
        collect(at)
    steady = batches[1:-1]  # the first (first_batch_s) and the last may be partial
    assert steady and {len(seqs) for seqs, _ in steady} == {case.batch_len}
    waits = [cut - arrived[seqs[0]] for seqs, cut in batches]
    assert max(waits) <= case.max_wait_s <= rules_.batch_max_s
    assert batches[0][1] - arrived[1] <= rules_.first_batch_s


def test_stop_and_reconnect_flush_a_growing_batch_at_once() -> None:
    """A slow stream's batch waits for the window only while reading: stopping or
    reconnecting cuts it at once (the pump flushes before it closes)."""
    for request in ("stop", "reconnect"):
        slow = StreamRules(first_batch_s=60.0)
        m = machine(10, slow)
        feed(m, [11, 12], now=0.0)
        assert m.next_batch() is None and m.flush_deadline() == slow.batch_max_s
        m.stop() if request == "stop" else m.reconnect("url_changed")
        assert m.closing
        m.flush()
        assert [f.seq for f in m.next_batch() or []] == [11, 12]


@pytest.mark.parametrize(("name", "arrivals", "tick_at", "due"), [
    ("nothing buffered: no deadline", [], 5.0, None),
    ("before the oldest frame's deadline", [0.0, 0.9], 0.99, None),
    ("at the oldest frame's deadline", [0.0, 0.9], 1.0, [11, 12]),
    ("the deadline counts from the oldest frame, not the newest", [0.5, 1.4], 1.5, [11, 12]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_the_age_trigger(name: str, arrivals: list[float], tick_at: float,
                         due: list[int] | None) -> None:
    m = machine(10)
    for i, at in enumerate(arrivals):
        m.receive(frame(11 + i), 10, at)
    if arrivals:
        assert m.flush_deadline() == arrivals[0] + RULES.batch_max_s
    else:
        assert m.flush_deadline() is None
    m.tick(tick_at)
    batch = m.next_batch()
    assert (None if batch is None else [f.seq for f in batch]) == due


def test_a_flush_does_not_chase_new_arrivals() -> None:
    m = machine(10)
    feed(m, [11, 12])
    m.flush()
    feed(m, [13])  # arrives while the flushed batch is being written
    batch = m.next_batch()
    assert batch is not None and [f.seq for f in batch] == [11, 12]
    m.written(batch)
    assert m.committed == 12 and m.next_batch() is None and m.flush_deadline() is not None


def test_held_bytes_never_exceed_one_batch_when_each_frame_fits() -> None:
    m = machine(10, rules(batch_max_bytes=1000, batch_max_messages=50))
    rng = random.Random(3)
    for seq in range(11, 2000):
        size = rng.randint(1, 300)
        m.receive(frame(seq, size), size, 0.0)
        assert m.held_bytes <= 1000 + 300
        batch = m.next_batch()
        if batch is not None:
            assert sum(len(f.text) for f in batch) <= 1000 and len(batch) <= 50
            m.written(batch)
        assert m.held_bytes <= 1000


# -- stop, abort, reconnect -------------------------------------------------------------------


def test_stop_closes_flushes_and_connects_no_more() -> None:
    m = machine(10)
    feed(m, [11, 12])
    assert not m.pause_reading
    m.stop()
    assert m.closing and m.pause_reading
    assert feed(m, [13]) == [C]  # arrived during the close: asked for again next time
    m.flush()
    batch = m.next_batch()
    assert batch is not None and [f.seq for f in batch] == [11, 12]
    m.written(batch)
    assert m.disconnected("closed", 1.0) is None
    assert m.connect(2.0) is None


def test_abort_writes_nothing_more_but_counts_a_write_in_flight() -> None:
    m = machine(10, rules(batch_max_messages=2))
    feed(m, [11, 12, 13])
    in_flight = m.next_batch()
    assert in_flight is not None
    m.abort()
    assert m.closing and m.next_batch() is None
    m.flush()
    assert m.next_batch() is None  # no final flush
    m.written(in_flight)  # the sink took the write that was in flight
    assert m.committed == 12
    assert m.disconnected("closed", 1.0) is None and m.connect(2.0) is None


def test_stop_while_between_connections_ends_the_backoff() -> None:
    m = machine(10)
    assert m.disconnected("error", 0.5) is not None
    m.stop()
    assert m.connect(1.0) is None


@dataclass(frozen=True)
class ReconnectCase:
    name: str
    requested: str | None  # the supervisor's reconnect(reason), while connected
    ended: str  # how the connection ended by itself
    lived: float
    reason: str
    zero_delay: bool
    backoff_reset: bool


RECONNECT_CASES = [
    ReconnectCase("url change: at once, backoff reset", "url_changed", "closed", 0.1,
                  "url_changed", True, True),
    ReconnectCase("upstream error after a short life: backoff grows", None, "error", 0.1,
                  "error", False, False),
    ReconnectCase("a connection that lived past stable_after resets the backoff", None,
                  "error", 6.0, "error", False, True),
    ReconnectCase("refused connection", None, "connect_failed", 0.0, "connect_failed", False,
                  False),
]


@pytest.mark.parametrize("case", RECONNECT_CASES, ids=lambda c: c.name)
def test_reconnect_policy(case: ReconnectCase) -> None:
    m = StreamMachine(RULES, 10, random.Random(1))
    for i in range(3):  # three quick failures first: the backoff has grown
        m.connect(i)
        m.disconnected("connect_failed", i)
    m.connect(10.0)
    if case.requested:
        m.reconnect(case.requested)
        assert m.closing and m.pause_reading
    step = m.disconnected(case.ended, 10.0 + case.lived)
    assert step is not None and step.reason == case.reason and step.from_seq == 11
    if case.zero_delay:
        assert step.delay_s == 0
    nominal = RULES.reconnect_base_s if case.backoff_reset else RULES.reconnect_cap_s
    if not case.zero_delay:
        assert nominal / 2 <= step.delay_s <= nominal
    m.connect(20.0)
    assert not m.closing and not m.pause_reading  # the request was used up


def test_reconnect_between_connections_is_not_a_close_request() -> None:
    m = StreamMachine(RULES, 10)
    m.reconnect("url_changed")  # the next connection uses the new URL anyway
    assert not m.closing


def test_backoff_delays_grow_to_the_cap() -> None:
    m = StreamMachine(RULES, 0, random.Random(5))
    delays = []
    for i in range(6):
        m.connect(float(i))
        step = m.disconnected("connect_failed", float(i))
        assert step is not None
        delays.append(step.delay_s)
    for n, delay in enumerate(delays):
        nominal = min(RULES.reconnect_cap_s, RULES.reconnect_base_s * 2**n)
        assert nominal / 2 <= delay <= nominal


# -- sink retries ----------------------------------------------------------------------------


def test_sink_retry_waits_grow_to_the_heartbeat_cap_and_reset_after_a_write() -> None:
    """The cap is the member heartbeat, never the stream renewal interval (80 minutes)."""
    rules_ = rules(sink_retry_base_s=0.05, sink_retry_cap_s=sink_retry_cap(5.0))
    m = machine(10, rules_)
    feed(m, [11])
    m.flush()
    waits = [m.write_failed() for _ in range(40)]
    assert all(w is not None and w <= 5.0 for w in waits)
    assert max(w for w in waits if w is not None) > 2.5  # it does reach the cap's scale
    batch = m.next_batch()
    assert batch is not None
    m.written(batch)
    first = m.write_failed()
    assert first is not None and first <= 0.05  # a write that landed resets the backoff


@pytest.mark.parametrize(("heartbeat_s", "cap_s"), [(5.0, 5.0), (0.05, 0.1), (30.0, 30.0)])
def test_the_sink_retry_cap_is_one_heartbeat(heartbeat_s: float, cap_s: float) -> None:
    assert sink_retry_cap(heartbeat_s) == cap_s


def test_once_stopping_a_failed_write_is_tried_once_more_then_given_up() -> None:
    m = machine(10, rules(batch_max_messages=2, sink_retry_base_s=0.05))
    feed(m, [11, 12, 13])
    assert m.write_failed() is not None  # still reading: retried with backoff
    m.stop()
    m.flush()
    assert m.write_failed() == 0.05  # one more try, soon
    assert m.write_failed() is None  # then the drain does not wait out the outage
    assert m.give_up() == 3
    assert m.next_batch() is None and m.held_frames == 0 and m.committed == 10
    assert m.disconnected("closed", 1.0) is None and m.connect(2.0) is None


# -- stalls ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StallCase:
    name: str
    committed: int
    events: list[tuple[float, int | Malformed]]  # (time, seq)
    reports: list[str | None]  # each problem change, in order ("" = any text)
    final: str | None = None  # a fragment of the problem at the end; None: no problem
    mentions: list[str] = field(default_factory=list)


STALL_CASES = [
    StallCase("progress from the start: one 'no problem' report", 10,
              [(0, 11), (1, 12)], [None]),
    StallCase("a numbering reset: reported once the duplicates last stall_s", 5000,
              [(0, 1), (30, 2), (59, 3), (60, 4), (61, 5), (90, 6)], [""],
              "duplicates", ["at or below 5000"]),
    StallCase("a poisoned seq alone is one refused frame, not a stall", 10,
              [(0, MAX_SEQ), (1, 11), (2, 12)], [None]),
    StallCase("only refused jumps", 10, [(0, 5000), (61, 6000)], [""],
              "STREAMLEASE_MAX_SEQ_JUMP=1000 above 10"),
    StallCase("a new kind of refusal changes the problem once", 5000,
              [(0, 1), (61, 2), (62, 9000), (63, 9001), (64, 3)], ["", ""],
              "duplicates", ["STREAMLEASE_MAX_SEQ_JUMP"]),
    StallCase("only malformed frames", 10, [(0, BAD), (70, BAD)], [""], "malformed"),
    StallCase("real progress clears it", 5000,
              [(0, 1), (61, 2), (62, 5001), (63, 5002)], ["", None]),
    StallCase("progress within stall_s: never a problem", 5000,
              [(0, 1), (59, 2), (59.5, 5001), (100, 3), (130, 4)], [None]),
    StallCase("the clock restarts after progress", 5000,
              [(0, 1), (59, 5001), (60, 2), (119, 3), (120, 4)], [None, ""], "duplicates"),
]


@pytest.mark.parametrize("case", STALL_CASES, ids=lambda c: c.name)
def test_stall_reports(case: StallCase) -> None:
    m = machine(case.committed)
    reports: list[str | None] = []
    for now, item in case.events:
        got = m.receive(BAD if isinstance(item, Malformed) else frame(item), 10, now)
        if got.problem_changed:
            reports.append(m.problem)
        if (batch := m.next_batch()) is not None:
            m.written(batch)
    assert len(reports) == len(case.reports)
    for got_text, want in zip(reports, case.reports, strict=True):
        assert (got_text is None) == (want is None)
    if case.final is None:
        assert m.problem is None
    else:
        assert m.problem is not None and case.final in m.problem
        for fragment in case.mentions:
            assert fragment in m.problem


def test_a_problem_survives_a_reconnect_and_is_not_reported_again() -> None:
    m = machine(5000)
    feed(m, [1], now=0.0)
    assert m.receive(frame(2), 10, 61.0).problem_changed
    m.disconnected("error", 62.0)
    m.connect(63.0)
    assert not m.receive(frame(3), 10, 64.0).problem_changed
    assert m.problem is not None


def test_an_idle_stream_is_not_stalled() -> None:
    m = machine(10)
    feed(m, [11], now=0.0)
    m.tick(1000.0)
    assert m.problem is None


# -- rate-limited logs -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "times", "expected"), [
    ("the first is logged", [0.0], [0]),
    ("then quiet within the period", [0.0, 1.0, 4.9], [0, None, None]),
    ("then one line naming the suppressed", [0.0, 1.0, 2.0, 5.0], [0, None, None, 2]),
    ("after a quiet period, logged again with none suppressed", [0.0, 100.0], [0, 0]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_rate_limit(name: str, times: list[float], expected: list[int | None]) -> None:
    limit = RateLimit(5.0)
    assert [limit.allow(t) for t in times] == expected


def test_duplicates_and_jumps_are_logged_rate_limited_each_on_its_own() -> None:
    m = machine(10)
    logs = [(g.verdict, g.log) for g in
            (m.receive(frame(s), 10, t) for t, s in [(0, 5), (1, 6), (1, MAX_SEQ), (6, 7)])]
    assert logs == [(D, 0), (D, None), (J, 0), (D, 1)]


# -- memory ------------------------------------------------------------------------------------


def test_the_buffer_bound_of_one_stream() -> None:
    # queue (4 frames) + one read + one partial frame + the frame in hand as text + a batch
    assert stream_buffer_bytes(1000, batch_max_bytes=5000, queue_high=4) == (
        4 * 1000 + 256 * 1024 + 1000 + 4 * 1000 + 5000)
    assert stream_buffer_bytes(262_144) < 4 * 2**20


def test_a_connections_first_batch_is_cut_at_once_then_batches_wait_as_usual() -> None:
    machine = StreamMachine(StreamRules(batch_max_s=0.5, first_batch_s=0.02), 10)
    assert machine.connect(0.0) == 11
    machine.receive(Frame(11, "{}"), 2, now=0.0)
    assert machine.flush_deadline() == 0.02  # the replay after a takeover goes at once
    machine.tick(0.02)
    batch = machine.next_batch()
    assert batch is not None
    machine.written(batch)
    machine.receive(Frame(12, "{}"), 2, now=1.0)
    assert machine.flush_deadline() == 1.5  # then the usual wait
