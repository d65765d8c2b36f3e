"""The processor API: your code on every held stream, with the fence and the checkpoint.

One processor instance serves one tenure of one stream (an acquisition: this worker, this
fence). The worker calls, in order and never concurrently:

* ``start(ctx)`` once, after the acquisition and before the first batch;
* ``process(batch, ctx)`` for each batch: the messages of the tenure in ``seq`` order, no
  gap and no duplicate within the tenure. When it returns, the batch is done: the worker
  checkpoints it (``last_seq`` on the stream item, a conditional write that names this
  worker and this fence, so a stale holder's checkpoint is refused). If it raises, the
  batch is retried (capped, interruptible backoff) up to ``STREAMLEASE_PROCESS_MAX_ATTEMPTS``
  times, then sent to ``STREAMLEASE_DEAD_LETTER`` or, without one, the stream stops with
  ``last_error`` set: a batch is never skipped silently;
* ``stop(ctx, reason)`` once, when the tenure ends, with ``reason`` one of ``drain`` (handed
  over to even out the fleet), ``stopped`` (``desired_state`` flipped to STOPPED),
  ``shutdown`` (the worker drains on SIGTERM), ``lost`` (the lease moved on: another holder
  may already be writing, so ``stop`` must not write anything), ``error`` (the stream cannot
  go on here: a failed batch, a bad item).

What it guarantees: with a processor that writes its output and then returns, every
message reaches it at least once; a batch is seen twice only across a takeover (the old
holder's output landed, its checkpoint did not) or when a ``process`` that raised is
retried (a batch ``process`` accepted is not processed again, even if its checkpoint
write is retried). Exactly once needs the output and the
checkpoint in one transaction: a processor whose destination has transactions sets
``commits_checkpoint = True``, writes its output together with its own record of
``(stream_id, fence, last_seq)``, conditioned on ``ctx.fence`` being the highest fence it
has seen for the stream and on ``ctx.checkpoint`` being the last seq it holds (the
expected previous checkpoint), and reports that record's ``last_seq`` from
``committed(ctx)``: a new holder resumes after it (Kafka Connect's exactly-once sources,
zombies fenced by epoch). The worker still moves ``last_seq`` on the stream item after each
batch, so ``ctl list`` and a resume read it. Such a processor may also define
``dead_lettered(batch, ctx)``: called once a batch that failed every attempt went to the
dead-letter output, it moves its own record's ``last_seq`` past the batch (under the fence),
as the worker does on the stream item.

A minimal processor::

    class Printer:
        async def start(self, ctx: Context) -> None:
            print("serving", ctx.stream_id, "after", ctx.resume_after)

        async def process(self, batch: Sequence[Message], ctx: Context) -> None:
            for message in batch:
                print(ctx.stream_id, message.seq, message.data)

        async def stop(self, ctx: Context, reason: str) -> None:
            print("stopped", ctx.stream_id, reason)

    def make() -> Printer:          # STREAMLEASE_SINK=python:mymodule:make
        return Printer()
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from streamlease.core.frames import Frame
from streamlease.core.upstream import BINARY_KEY, GAP_KEY, binary_payload, gap_body

STOP_REASONS = ("drain", "stopped", "shutdown", "lost", "error")


_UNPARSED: Any = object()


class Message:
    """One upstream message: its sequence number, the JSON object as parsed (``data``)
    and the frame's text exactly as received (``text``). ``data`` is parsed on first use
    (a processor that forwards ``text`` never pays for it, and a buffered batch holds
    text only)."""

    __slots__ = ("_data", "seq", "text")

    def __init__(self, seq: int, data: Any, text: str) -> None:
        self.seq = seq
        self.text = text
        self._data = data

    @classmethod
    def of_text(cls, seq: int, text: str) -> Message:
        return cls(seq, _UNPARSED, text)

    @classmethod
    def of_frames(cls, frames: Iterable[Frame]) -> list[Message]:
        """A batch's messages, unparsed (one call a batch, not one a message)."""
        return [cls(f.seq, _UNPARSED, f.text) for f in frames]

    @property
    def data(self) -> Any:
        if self._data is _UNPARSED:
            self._data = json.loads(self.text)
        return self._data

    @property
    def gap(self) -> dict[str, Any] | None:
        """The fields of a gap record (a feed that cannot replay may have lost messages
        just before this one: docs/profiles.md, Gap records), else None."""
        if GAP_KEY not in self.text:
            return None
        return gap_body(self._data_or_none())

    @property
    def bytes(self) -> bytes | None:
        """The payload of a binary frame (``binary: true`` profiles), else None."""
        if BINARY_KEY not in self.text:
            return None
        return binary_payload(self._data_or_none())

    def _data_or_none(self) -> Any:
        """``data``, or None for a text that is not JSON (it is then neither a gap record
        nor a binary frame, and asking must not raise)."""
        try:
            return self.data
        except (ValueError, RecursionError):
            return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and (self.seq, self.text) == (other.seq, other.text)

    def __hash__(self) -> int:
        return hash((self.seq, self.text))

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, text={self.text[:60]!r})"


@dataclass(slots=True)
class Context:
    """What a processor knows of its tenure. ``checkpoint`` is the last seq checkpointed
    for the stream (``resume_after`` at the start, then the last seq of each batch that
    completed): the expected previous checkpoint of the next batch."""

    stream_id: str
    fence: int
    owner: str
    item: Mapping[str, Any]
    resume_after: int
    checkpoint: int
    state: dict[str, Any] = field(default_factory=dict)  # the processor's own, per tenure
    failure: str | None = None  # set for a dead-letter output: why the batch failed


@runtime_checkable
class Processor(Protocol):
    async def start(self, ctx: Context) -> None: ...

    async def process(self, batch: Sequence[Message], ctx: Context) -> None: ...

    async def stop(self, ctx: Context, reason: str) -> None: ...


@runtime_checkable
class TransactionalProcessor(Processor, Protocol):
    """A processor that commits its output and the checkpoint in one transaction of its
    own (``commits_checkpoint = True``); ``committed(ctx)`` is the last seq it holds for
    ``ctx.stream_id`` (0 if none), read after ``start``."""

    commits_checkpoint: bool

    async def committed(self, ctx: Context) -> int: ...


ProcessorFactory = Callable[[], Processor]
