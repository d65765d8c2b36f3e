"""Processors behind the worker's ``Sink``: one instance per tenure, a fenced checkpoint.

``ProcessorSink`` adapts a processor factory (``streamlease.processor``) to the ``Sink``
the pump writes through. ``open`` makes the tenure's processor and calls ``start``;
``write_batch`` calls ``process`` and then checkpoints the batch on the stream item with a
conditional write naming this owner and fence (the lease store's ``checkpoint``), so a
stale holder's checkpoint is refused like its sink write would be; ``close`` calls
``stop``.

The checkpoint is written while the pump reads the next batch: ``write_batch`` returns
once ``process`` did, and the next ``write_batch`` (or ``settle``, after the pump's final
flush) first waits for it, so a batch is processed only once the one before it is
checkpointed, as if each write had waited, and a refused or failed checkpoint surfaces
there (a retriable failure is retried by the pump, the batch not processed again). The
stream reads on during the round trip instead of idling through it.

A processor that commits its own checkpoint (``commits_checkpoint``) is asked
after ``start`` how far it got, and the tenure resumes after that.

A batch whose ``process`` raises is retried: the first failures raise ``ProcessorFailed``
(retriable: the pump backs off, interruptibly, and sends the same batch again); after
``max_attempts`` it goes to the dead-letter output, if there is one, and is checkpointed
past; otherwise ``SinkGaveUp`` stops the stream here with ``last_error`` set. A batch is
never skipped silently. A built-in output whose destination does not answer or throttles
(``StoreUnavailable``, ``StoreThrottled``) is not failing the batch: that is retried by the
pump, with backoff, without counting an attempt. A processor that commits its own
checkpoint and has a ``dead_lettered(batch, ctx)`` method is told once its batch went to
the dead-letter output, so that its checkpoint moves past the batch as the stream item's
does (without it, the next batch would find that checkpoint behind: ``SinkConflict``).

A built-in output that counts events of its own (``Metered``: the MongoDB output's bad
input) is handed the worker's ``Metrics`` before ``start``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from streamlease.core.frames import Frame
from streamlease.core.model import EventMark, StreamRecord, Tenure
from streamlease.errors import (
    ProcessorFailed,
    SinkConflict,
    SinkGaveUp,
    StaleFence,
    StoreThrottled,
    StoreUnavailable,
)
from streamlease.logs import event
from streamlease.metrics import Metrics
from streamlease.processor import Context, Message, Processor, ProcessorFactory
from streamlease.store.protocols import LeaseStore, SinkOutcome


@dataclass
class _Open:
    processor: Processor
    ctx: Context
    failing: int | None = None  # first seq of the batch that keeps failing
    attempts: int = 0
    # The last seq ``process`` accepted in this tenure. A checkpoint write that failed
    # after it (a timeout, throttling) is retried with the same batch: that batch is not
    # processed again, so a duplicate can only come from another tenure.
    processed: int = 0
    dead_letter: _Open | None = None
    # The last batch's checkpoint in flight (prev_seq, last_seq, the write), if any.
    pending: tuple[int, int, asyncio.Task[SinkOutcome]] | None = None


@runtime_checkable
class Metered(Protocol):
    """A processor that counts what happens inside it in the worker's metrics."""

    def use_metrics(self, metrics: Metrics) -> None: ...


@dataclass(frozen=True)
class ProcessingSettings:
    kind: str  # the sink kind, a metric label (``python``, ``file``, ...)
    max_attempts: int = 5


def messages(frames: list[Frame]) -> list[Message]:
    return Message.of_frames(frames)


@dataclass
class ProcessorSink:
    """A ``Sink`` over a processor factory; ``checkpoints`` is the lease store."""

    factory: ProcessorFactory
    checkpoints: LeaseStore
    metrics: Metrics
    settings: ProcessingSettings
    dead_letter: ProcessorFactory | None = None
    _open: dict[tuple[str, int], _Open] = field(default_factory=dict)

    async def newest_event(self, stream_id: str,
                           timeout: float | None = None) -> EventMark | None:
        return None  # no events table: a processor's own checkpoint comes from ``open``

    async def open(self, tenure: Tenure, record: StreamRecord) -> int:
        after = tenure.last_seq or 0
        ctx = Context(stream_id=tenure.stream_id, fence=tenure.fence, owner=tenure.owner,
                      item=dict(record.attributes), resume_after=after, checkpoint=after)
        processor = self.factory()
        if isinstance(processor, Metered):
            processor.use_metrics(self.metrics)
        await processor.start(ctx)
        # Started: from here on ``close`` stops it, whatever fails next.
        self._open[(tenure.stream_id, tenure.fence)] = _Open(processor, ctx)
        committed = 0
        if getattr(processor, "commits_checkpoint", False):
            committed = int(await processor.committed(ctx))  # type: ignore[attr-defined]
            if committed > after:
                ctx.resume_after = ctx.checkpoint = committed
        return committed if committed > after else 0

    async def close(self, tenure: Tenure, reason: str) -> None:
        entry = self._open.pop((tenure.stream_id, tenure.fence), None)
        if entry is None:
            return
        if entry.pending is not None:
            # Settled by the pump unless the tenure ended without its final flush (lost,
            # an error): the write is sent either way; its outcome is the sink's.
            with contextlib.suppress(Exception):
                await entry.pending[2]
            entry.pending = None
        for name, one in (("processor", entry), ("dead letter", entry.dead_letter)):
            if one is None:
                continue
            try:
                await one.processor.stop(one.ctx, reason)
            except Exception:
                self.metrics.task_crashed("pump")
                event(logging.ERROR, "processor.stop_failed", f"the {name}'s stop raised",
                      stream=tenure.stream_id, fence=tenure.fence, reason=reason,
                      exc_info=True)

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> SinkOutcome:
        if not frames:
            return SinkOutcome.COMMITTED
        entry = self._open.get((tenure.stream_id, tenure.fence))
        if entry is None:
            raise SinkGaveUp(f"stream {tenure.stream_id}: no processor open for fence "
                             f"{tenure.fence}")
        await self._settle(entry, tenure, timeout)
        last = frames[-1].seq
        ctx = entry.ctx
        ctx.checkpoint = prev_seq
        if last > entry.processed:
            batch = messages(frames)
            try:
                await entry.processor.process(batch, ctx)
            except (StaleFence, SinkConflict):
                # The destination knows a newer fence, or its checkpoint is not where this
                # tenure left it: retrying cannot help; the tenure stops now.
                raise
            except Exception as exc:
                if isinstance(exc, StoreUnavailable | StoreThrottled) and \
                        not isinstance(exc, ProcessorFailed):
                    # A built-in output's destination did not answer (the outcome unknown)
                    # or asked to slow down: not the batch's fault, so no attempt counts
                    # against it and it is never dead-lettered for it; the pump tries
                    # again with backoff for as long as the tenure lasts.
                    raise
                await self._failed(entry, tenure, batch, exc)
            entry.failing, entry.attempts = None, 0
            entry.processed = last
        entry.pending = (prev_seq, last, asyncio.ensure_future(
            self.checkpoints.checkpoint(tenure, prev_seq, last, timeout)))
        return SinkOutcome.COMMITTED

    async def settle(self, tenure: Tenure, timeout: float | None = None) -> None:
        entry = self._open.get((tenure.stream_id, tenure.fence))
        if entry is not None:
            await self._settle(entry, tenure, timeout)

    async def _settle(self, entry: _Open, tenure: Tenure, timeout: float | None) -> None:
        """The last batch's checkpoint landed: wait for it; if it failed, write it again
        (raising, as ``write_batch`` would, when that fails too)."""
        if entry.pending is None:
            return
        prev_seq, last, task = entry.pending
        try:
            await asyncio.shield(task)
        except (StoreThrottled, StoreUnavailable):
            # Its outcome unknown or refused for load: once more now (a checkpoint that
            # landed answers ALREADY_COMMITTED); a failure again goes to the pump, which
            # retries with backoff and calls back here first.
            entry.pending = (prev_seq, last, asyncio.ensure_future(
                self.checkpoints.checkpoint(tenure, prev_seq, last, timeout)))
            await asyncio.shield(entry.pending[2])
        except BaseException:
            if task.done():
                entry.pending = None  # refused for good (a stale fence): the tenure ends
            raise
        entry.pending = None
        entry.ctx.checkpoint = last

    async def _failed(self, entry: _Open, tenure: Tenure, batch: list[Message],
                      exc: Exception) -> None:
        """Count a failed attempt; raise to retry, or dead-letter the batch (returns), or
        give up."""
        first, last = batch[0].seq, batch[-1].seq
        if entry.failing != first:
            entry.failing, entry.attempts = first, 0
        entry.attempts += 1
        error = f"{type(exc).__name__}: {exc}"[:300]
        event(logging.WARNING, "processor.failed", "processing a batch failed",
              stream=tenure.stream_id, fence=tenure.fence, first_seq=first, last_seq=last,
              attempt=entry.attempts, max_attempts=self.settings.max_attempts, error=error)
        if entry.attempts < self.settings.max_attempts:
            raise ProcessorFailed(f"processor failed on seq {first}..{last} (attempt "
                                  f"{entry.attempts}): {error}") from exc
        if self.dead_letter is None:
            raise SinkGaveUp(f"processor failed {entry.attempts} times on seq {first}..{last}"
                             f" and there is no dead-letter sink: {error}") from exc
        try:
            if entry.dead_letter is None:
                ctx = replace(entry.ctx, state={})
                dead = self.dead_letter()
                await dead.start(ctx)
                entry.dead_letter = _Open(dead, ctx)
            entry.dead_letter.ctx.failure = error
            await entry.dead_letter.processor.process(batch, entry.dead_letter.ctx)
        except Exception as dead_exc:
            raise SinkGaveUp(f"processor failed {entry.attempts} times on seq {first}..{last}"
                             f" and the dead-letter sink failed too: {dead_exc!r}") from exc
        self.metrics.dead_lettered(self.settings.kind, len(batch))
        event(logging.ERROR, "processor.dead_lettered",
              "a batch failed every attempt; sent to the dead-letter sink and skipped",
              stream=tenure.stream_id, fence=tenure.fence, first_seq=first, last_seq=last,
              attempts=entry.attempts, error=error)
        skipped = getattr(entry.processor, "dead_lettered", None)
        if getattr(entry.processor, "commits_checkpoint", False) and skipped is not None:
            # Its own checkpoint moves past the batch too (a failure here is retried: the
            # batch fails again and is dead-lettered again, at least once).
            await skipped(batch, entry.ctx)

