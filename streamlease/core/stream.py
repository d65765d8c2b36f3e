"""The pump's protocol decisions as a state machine: frames and clock readings in, decisions out.

Like websockets' sans-I/O protocol, this module never awaits and never reads a clock: the
asyncio pump (``streamlease.pump``) feeds it what happened — a connection opened or ended, a frame
arrived, time passed, a batch was written, the supervisor asked to stop — and carries out
what it decides: which ``from_seq`` to ask for, which frames go into which batch and when a
batch is due, what is dropped and logged, whether and when to reconnect.

Sequence rules (docs/operating.md, Bad input):

* ``received`` is the highest seq accepted so far (buffered or written). At the start of a
  connection it equals ``committed``, and the connection asks for ``from_seq = committed + 1``.
* A frame with ``seq <= received`` is a duplicate: dropped and counted.
* A frame with ``seq > received + max_seq_jump`` is refused as malformed: a poisoned number
  (``2**63 - 1``) accepted once would turn every later real frame into a duplicate, forever,
  because ``last_seq`` never decreases. A refused frame is never delivered; the next
  connection asks for the same ``from_seq`` again, so a wrongly refused jump only stalls.
* The first frame accepted on a connection above ``from_seq`` is a gap: delivered, counted.
* A stream that, for ``stall_s``, receives frames but can deliver none of them (duplicates,
  refused jumps, malformed frames) has a *problem*, reported once per change; the next
  accepted frame (real progress) clears it. A stream that receives nothing is idle, not stalled.

Batches follow the stream's rate (README, Batching). A frame is buffered; a batch is cut

* when it *fills* what one write buys: the next frame would take the batch's item size (the
  frames' UTF-8 text plus ``FRAME_ITEM_BYTES`` each, about what they add to a DynamoDB events
  item) over ``batch_fill_bytes``, or a frame alone reaches it. The default is one DynamoDB
  write unit (1 KB) less the events item's own attributes: every sink write pays for the
  checkpoint plus whole kilobytes of events item, so a batch that fills its kilobyte is
  written at once, and a fast stream flushes by size long before the window;
* when it holds ``batch_max_messages``, or the next frame would take it over
  ``batch_max_bytes`` (memory): the caps;
* when its oldest frame has waited ``batch_max_s``, the latency bound (the connection's
  first batch waits at most ``first_batch_s``): a slow stream's batch grows for that long,
  so at 1 msg/s one write carries about ``batch_max_s`` messages instead of one;
* at once when a connection ends, on stop and on reconnect (flush), unless aborted.

Sink retries (docs/operating.md, Overload): a write that fails without an answer (throttled,
unavailable, timed out; not a stale fence) is retried with capped exponential backoff and
jitter. The cap is on the member heartbeat's scale (``STREAMLEASE_MEMBER_HEARTBEAT_SECONDS``),
never the stream lease's renewal interval (minutes): a sink that comes back is written to
within a heartbeat. A stop (drain) does not wait out an outage: once stopping, a failed
write is tried once more after ``sink_retry_base_s``, then the held frames are given up.
Nothing is lost: ``last_seq`` did not move, so the next holder asks for them again.

This module imports nothing impure (tests/core/test_purity.py).
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass, field

from streamlease.core.backoff import Backoff
from streamlease.core.frames import Frame, Malformed

# websockets' receive queue, in frames (high, low): reading from the socket pauses once
# more than ``high`` frames wait and resumes at ``low``. Small, because it is multiplied
# by the frame cap and the number of streams; frames that do not fit wait in the kernel.
RECEIVE_QUEUE = (4, 1)
# The most one socket read hands to the protocol at once (asyncio: 256 KiB; uvloop: 256,000
# bytes). Frames parsed from one read are all queued, even past the high-water mark.
READ_CHUNK_BYTES = 256 * 1024
# A batch's frames, counted as the memory their text takes (1, 2 or 4 bytes a character).
# UTF-8 takes at most twice that, so a batch stays far under DynamoDB's 4 MB transaction.
BATCH_MAX_BYTES = 800_000
# DynamoDB bills a write per started kilobyte of item (a write request unit; twice that inside
# a transaction). What a frame adds to an events item besides its text: a list element for its
# text and one for its seq number (1 byte each), the number itself (up to 11 bytes below 10**20).
WRITE_UNIT_BYTES = 1024
FRAME_ITEM_BYTES = 12
# An events item's own attributes (names, the stream key ``CONN#<id>``, first and last seq,
# fence, write time, expiry, two list headers): about 90 bytes plus the stream id. Reserving
# 190 keeps an item that fills ``BATCH_FILL_BYTES`` within one write unit for stream ids up to
# 100 bytes (tests/store/test_codec.py checks it against DynamoDB's size rules).
EVENTS_ITEM_RESERVE = 190
BATCH_FILL_BYTES = WRITE_UNIT_BYTES - EVENTS_ITEM_RESERVE
# A frame's text may take up to 4 bytes a character in memory, and its UTF-8 on the wire
# at least one byte a character: the frame being handled can take 4 x its wire size.
TEXT_EXPANSION = 4


def stream_buffer_bytes(max_frame_bytes: int, batch_max_bytes: int = BATCH_MAX_BYTES,
                        queue_high: int = RECEIVE_QUEUE[0]) -> int:
    """The most one held stream can keep buffered, in bytes.

    websockets' queue before it pauses the socket (``queue_high`` frames, plus whatever the
    last read held), one incomplete frame in its parser, the frame being handled (as text),
    and the batch.
    """
    return (queue_high * max_frame_bytes + READ_CHUNK_BYTES + max_frame_bytes
            + TEXT_EXPANSION * max_frame_bytes + batch_max_bytes)


@dataclass(frozen=True)
class StreamRules:
    """What the machine needs to decide; seconds as float."""

    batch_max_messages: int = 200
    batch_max_bytes: int = BATCH_MAX_BYTES
    batch_max_s: float = 4.5  # STREAMLEASE_BATCH_MAX_SECONDS: the latency bound
    batch_fill_bytes: int = BATCH_FILL_BYTES
    # A connection's first batch (the replay after a takeover, a hand-over or a reconnect)
    # waits at most this long: a stream that changed hands delivers again at once.
    first_batch_s: float = 0.02
    max_seq_jump: int = 1_000_000_000
    # A feed that cannot replay numbers its messages from wherever it is (an exchange's
    # update ids are often past 10**10): the first number a stream ever accepts is not held
    # to ``max_seq_jump`` (from 0), every later one is.
    unanchored: bool = False
    stall_s: float = 60.0
    reconnect_base_s: float = 0.1
    reconnect_cap_s: float = 30.0
    stable_after_s: float = 5.0  # a connection that lived this long resets the backoff
    log_every_s: float = 5.0  # rate limit of the warnings about dropped frames
    # Sink retries: the first waits about ``sink_retry_base_s``; none waits more than
    # ``sink_retry_cap_s``, the member heartbeat (see ``sink_retry_cap``).
    sink_retry_base_s: float = 0.05
    sink_retry_cap_s: float = 5.0


def sink_retry_cap(heartbeat_s: float) -> float:
    """The longest wait between two tries of a failed sink write: one member heartbeat
    (``STREAMLEASE_MEMBER_HEARTBEAT_SECONDS``), at least 0.1 s.

    The heartbeat is how fast the worker notices anything else (a lost membership, a
    STOPPED stream, a peer's death), so a sink outage ends for a stream within one
    heartbeat of the sink's return. The stream lease's renewal interval (minutes) says how
    often a lease is written, nothing about how quickly a stream should resume."""
    return max(0.1, heartbeat_s)


class Verdict(enum.StrEnum):
    """What became of one received frame."""

    ACCEPTED = "accepted"
    GAP = "gap"  # accepted: the connection's first frame, above the from_seq asked for
    DUPLICATE = "duplicate"  # seq at or below the highest received: dropped
    JUMP = "jump"  # seq more than max_seq_jump above the highest received: refused
    MALFORMED = "malformed"  # not a JSON object with an integer seq: dropped
    CLOSING = "closing"  # arrived after a close was asked for: dropped, asked for again

    @property
    def accepted(self) -> bool:
        return self in (Verdict.ACCEPTED, Verdict.GAP)


# The verdicts that leave a receiving stream without progress, in the order a problem
# names them.
REFUSED = (Verdict.DUPLICATE, Verdict.JUMP, Verdict.MALFORMED)
_ACCEPTED, _GAP = Verdict.ACCEPTED, Verdict.GAP  # the per-frame path avoids enum lookups


class Phase(enum.StrEnum):
    """Where the pump is with its upstream connection."""

    IDLE = "idle"  # no connection: before the first, or between two (backoff)
    OPEN = "open"  # connecting or connected, reading
    DONE = "done"  # stopped or aborted: no further connection


class Ending(enum.StrEnum):
    STOP = "stop"  # graceful: close, flush what is held, finish
    ABORT = "abort"  # ownership is gone: close, write nothing more, finish


@dataclass(slots=True)
class Received:
    """The machine's answer to one frame (a plain slotted class: one is made per frame)."""

    verdict: Verdict
    seq: int | None  # None for a malformed frame
    reference: int  # the highest seq received before it (from_seq - 1 on a connection's first)
    log: int | None = None  # None: stay quiet; else log, naming this many suppressed since
    problem_changed: bool = False  # ``StreamMachine.problem`` changed: report it


@dataclass(frozen=True)
class Reconnect:
    """A connection ended; connect again after ``delay_s`` (counted under ``reason``)."""

    reason: str
    delay_s: float
    from_seq: int


@dataclass
class RateLimit:
    """The first event is logged, then at most one a ``period`` naming how many were not."""

    period: float
    next_at: float = float("-inf")
    suppressed: int = 0

    def allow(self, now: float) -> int | None:
        """None: stay quiet. Otherwise log now; the count is how many were suppressed."""
        if now < self.next_at:
            self.suppressed += 1
            return None
        self.next_at = now + self.period
        count, self.suppressed = self.suppressed, 0
        return count


@dataclass
class _Stall:
    """Frames received since the last accepted one, none of them deliverable."""

    since: float
    kinds: set[Verdict] = field(default_factory=set)


class StreamMachine:
    """One held stream's protocol state: sequence numbers, the batch, the connection's phase.

    Inputs: ``connect``, ``receive``, ``tick``, ``flush``, ``written``, ``disconnected``,
    and the supervisor's ``stop``, ``abort`` and ``reconnect``. Outputs: their return
    values, ``next_batch`` (the batch to write now, if any), ``flush_deadline`` (when to
    call ``tick``), ``closing`` (close the connection now) and ``problem``.
    """

    def __init__(self, rules: StreamRules, committed: int,
                 rng: random.Random | None = None) -> None:
        self.rules = rules
        self._max_jump = rules.max_seq_jump
        self._unanchored = rules.unanchored
        self._max_bytes = rules.batch_max_bytes
        self._max_messages = rules.batch_max_messages
        self._fill = rules.batch_fill_bytes
        self.committed = committed  # highest seq the sink has taken
        self.received = committed  # highest seq accepted (buffered or committed)
        self.phase = Phase.IDLE
        self.ending: Ending | None = None
        self.problem: str | None = None
        # Stop reading now: a batch waits to be written, or the connection must close.
        # A plain attribute, read once per frame; kept current by ``_update``.
        self.pause_reading = False
        self._reconnect_reason: str | None = None
        self._asked = committed + 1
        self._first = True  # no frame accepted on this connection yet
        self._first_batch = True  # the connection's first batch not cut yet
        self._started = 0.0
        rng = rng or random.Random()
        self._backoff = Backoff(rules.reconnect_base_s, rules.reconnect_cap_s, rng)
        self._sink_backoff = Backoff(rules.sink_retry_base_s, rules.sink_retry_cap_s, rng)
        self._failed_while_stopping = False
        self._buffer: list[Frame] = []
        self._buffer_bytes = 0
        self._buffer_fill = 0  # the buffered frames' item size (see ``batch_fill_bytes``)
        self._oldest_at = 0.0
        self._outbox: list[list[Frame]] = []
        self._outbox_bytes: list[int] = []
        self._stall: _Stall | None = None
        self._progressed = False
        self._logs: dict[Verdict, RateLimit] = {}  # made on first use: most streams need none

    # -- what the pump reads ---------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """The open connection must be closed now (stop, abort, or a reconnect asked for)."""
        return self.ending is not None or self._reconnect_reason is not None

    @property
    def held_frames(self) -> int:
        """Frames held: buffered, or cut and not yet written."""
        return len(self._buffer) + sum(len(batch) for batch in self._outbox)

    @property
    def held_bytes(self) -> int:
        """What the frames held take: buffered, or cut and not yet written."""
        return self._buffer_bytes + sum(self._outbox_bytes)

    def flush_deadline(self) -> float | None:
        """When the oldest buffered frame has waited long enough; None with nothing buffered."""
        if not self._buffer:
            return None
        wait = self.rules.batch_max_s
        if self._first_batch:
            wait = min(wait, self.rules.first_batch_s)
        return self._oldest_at + wait

    def next_batch(self) -> list[Frame] | None:
        """The batch to write now (oldest first), or None. Nothing after an abort."""
        if self.ending is Ending.ABORT or not self._outbox:
            return None
        return self._outbox[0]

    # -- the supervisor's requests ---------------------------------------------------------

    def stop(self) -> None:
        """Graceful: close, flush what is held, connect no more."""
        if self.ending is None:
            self.ending = Ending.STOP
        self._update()

    def abort(self) -> None:
        """Ownership is gone: close, and start no further write (one in flight may finish)."""
        self.ending = Ending.ABORT
        self._buffer.clear()
        self._buffer_bytes = 0
        self._buffer_fill = 0
        self._update()

    def reconnect(self, reason: str) -> None:
        """Close, flush, and connect again at once (e.g. a new URL)."""
        if self.phase is Phase.OPEN:
            self._reconnect_reason = reason
            self._update()

    # -- the connection --------------------------------------------------------------------

    def connect(self, now: float) -> int | None:
        """A connection is about to be opened: the ``from_seq`` to ask for, or None when the
        pump is done. What the last connection held has been written (flush before reconnect),
        so the new one resumes right after what the sink has."""
        if self.ending is not None:
            self.phase = Phase.DONE
            return None
        if self._buffer or self._outbox:
            raise RuntimeError("connect with frames not yet written")
        self.phase = Phase.OPEN
        self._reconnect_reason = None  # the new connection already uses the newest URL
        self.received = self.committed
        self._asked = self.committed + 1
        self._first = True
        self._first_batch = True
        self._started = now
        self._update()
        return self._asked

    def disconnected(self, reason: str, now: float) -> Reconnect | None:
        """The connection ended and what it held was written. None: the pump is done.

        A reconnect asked for names the reason (``url_changed``: at once, backoff reset);
        otherwise the backoff grows, and resets after a connection that lived
        ``stable_after_s``."""
        requested, self._reconnect_reason = self._reconnect_reason, None
        self._update()
        if self.ending is not None:
            self.phase = Phase.DONE
            return None
        self.phase = Phase.IDLE
        reason = requested or reason
        if reason == "url_changed" or now - self._started > self.rules.stable_after_s:
            self._backoff.reset()
        delay = 0.0 if reason == "url_changed" else self._backoff.next_delay()
        return Reconnect(reason, delay, self.committed + 1)

    # -- frames ----------------------------------------------------------------------------

    def receive(self, frame: Frame | Malformed, size: int, now: float) -> Received:
        """One frame from the upstream; ``size`` is what its text takes in memory.

        Called for every frame: kept lean (about a microsecond)."""
        reference = self.received
        if self.ending is not None or self._reconnect_reason is not None:
            seq = None if isinstance(frame, Malformed) else frame.seq
            return Received(Verdict.CLOSING, seq, reference)
        if isinstance(frame, Malformed):
            return self._refuse(Verdict.MALFORMED, None, reference, now)
        seq = frame.seq
        if seq <= reference:
            return self._refuse(Verdict.DUPLICATE, seq, reference, now)
        if seq - reference > self._max_jump and not (self._unanchored and reference == 0):
            return self._refuse(Verdict.JUMP, seq, reference, now)
        verdict = _ACCEPTED
        if self._first:
            self._first = False
            if seq > self._asked:
                verdict = _GAP
        self.received = seq
        # Into the batch. The frame that would take it over the bytes cap or the fill starts
        # the next one, so a batch goes over either only when a single frame does.
        text = frame.text
        fill = (len(text) if text.isascii() else len(text.encode())) + FRAME_ITEM_BYTES
        buffer = self._buffer
        if not buffer:
            self._oldest_at = now
        elif (self._buffer_bytes + size > self._max_bytes
              or self._buffer_fill + fill > self._fill):
            self._cut()
            buffer = self._buffer
            self._oldest_at = now
        buffer.append(frame)
        self._buffer_bytes += size
        self._buffer_fill += fill
        if len(buffer) >= self._max_messages or self._buffer_fill >= self._fill:
            self._cut()
        if self._stall is None and self._progressed:
            return Received(verdict, seq, reference)
        # Real progress: the end of a stall, or this pump's first delivery.
        self._stall = None
        self.problem = None
        self._progressed = True
        return Received(verdict, seq, reference, problem_changed=True)

    def tick(self, now: float) -> None:
        """Time passed: cut the batch if its oldest frame has waited ``batch_max_s``."""
        deadline = self.flush_deadline()
        if deadline is not None and now >= deadline:
            self._cut()

    def flush(self) -> None:
        """Cut whatever is buffered (a connection ended, or the pump stops); not after an
        abort. Frames that arrive later wait for the next trigger: a flush never chases
        new arrivals."""
        if self.ending is not Ending.ABORT and self._buffer:
            self._cut()

    def written(self, batch: list[Frame]) -> None:
        """The sink took ``batch`` (also after an abort: a write in flight may land)."""
        if self._outbox and self._outbox[0] is batch:
            self._outbox.pop(0)
            self._outbox_bytes.pop(0)
        self.committed = max(self.committed, batch[-1].seq)
        self._sink_backoff.reset()
        self._update()

    def write_failed(self) -> float | None:
        """The batch from ``next_batch`` was not taken, outcome unknown (throttled,
        unavailable, timed out): how long to wait before trying it again, or None to give
        up the frames held (see ``give_up``).

        While reading, the wait grows up to ``sink_retry_cap_s``; the pump wakes from it
        on stop, abort and reconnect. Once stopping, the first failure is retried after
        ``sink_retry_base_s`` and the next gives up: a drain does not wait out an outage."""
        if self.ending is Ending.STOP:
            if self._failed_while_stopping:
                return None
            self._failed_while_stopping = True
            return self.rules.sink_retry_base_s
        return self._sink_backoff.next_delay()

    def give_up(self) -> int:
        """Drop every frame held, unwritten (stopping, and the sink does not answer): the
        number dropped. ``committed`` stays, so the next connection, here or at the next
        holder, asks for them again."""
        dropped = self.held_frames
        self._buffer.clear()
        self._buffer_bytes = 0
        self._buffer_fill = 0
        self._outbox.clear()
        self._outbox_bytes.clear()
        self._update()
        return dropped

    # -- internals -------------------------------------------------------------------------

    def _cut(self) -> None:
        self._first_batch = False
        self._outbox.append(self._buffer)
        self._outbox_bytes.append(self._buffer_bytes)
        self._buffer = []
        self._buffer_bytes = 0
        self._buffer_fill = 0
        self.pause_reading = True

    def _update(self) -> None:
        self.pause_reading = (self.ending is not None or self._reconnect_reason is not None
                              or bool(self._outbox))

    def _refuse(self, verdict: Verdict, seq: int | None, reference: int,
                now: float) -> Received:
        stall = self._stall
        if stall is None:
            stall = self._stall = _Stall(now)
        stall.kinds.add(verdict)
        changed = False
        if now - stall.since >= self.rules.stall_s:
            problem = self._describe(stall)
            changed = problem != self.problem
            self.problem = problem
        limit = self._logs.get(verdict)
        if limit is None:
            limit = self._logs[verdict] = RateLimit(self.rules.log_every_s)
        return Received(verdict, seq, reference, limit.allow(now), changed)

    def _describe(self, stall: _Stall) -> str:
        what = {
            Verdict.DUPLICATE: f"duplicates (seq at or below {self.received})",
            Verdict.JUMP: f"seqs more than STREAMLEASE_MAX_SEQ_JUMP={self.rules.max_seq_jump}"
                          f" above {self.received}",
            Verdict.MALFORMED: "malformed frames",
        }
        kinds = ", ".join(what[v] for v in REFUSED if v in stall.kinds)
        return (f"upstream stalled: for {self.rules.stall_s:g} s it sent only frames that "
                f"cannot be delivered: {kinds}; nothing delivered after seq {self.received}")
