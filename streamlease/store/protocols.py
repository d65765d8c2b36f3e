"""What the worker needs from storage, as narrow protocols, and the values they return.

Six roles, each a handful of methods, each with a DynamoDB implementation
(``streamlease.store.dynamodb``) and an in-memory one with the same semantics
(``streamlease.store.memory``); one contract suite (tests/store) runs against both.

* ``LeaseStore`` — the control plane a worker runs on: acquire, renew, release, the
  orphan query, the sweep, ``last_error``.
* ``Sink`` — the fenced data plane: one transaction per batch, refused for a stale fence.
* ``FleetStore`` — member rows: register, heartbeat, read the fleet, fence a dead member.
* ``LeaderBackend`` — named leader leases and fenced writes (``streamlease.leader``).
* ``JobStore`` — singleton jobs and one run record per slot.
* ``AdminStore`` — what operators and tests do: create tables, upsert and flip streams, force
  releases, read the sink back.

A failed condition is a value, not an exception: ``acquire`` returns None, ``renew``
returns ``LOST``, ``release`` returns False. Everything else raises ``streamlease.errors``.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamlease.core.fenced import PutItem
from streamlease.core.frames import Frame
from streamlease.core.jobs import Job, JobList, JobRun, UnreadableJob
from streamlease.core.layout import Replica
from streamlease.core.leadership import LeaderRecord
from streamlease.core.lease import CleanRelease, LeaseTimings, RenewOutcome
from streamlease.core.membership import HeartbeatOutcome, MemberRecord, MemberStatus
from streamlease.core.model import EventMark, OwnedStream, StreamRecord, Tenure
from streamlease.store.feedcheckpoints import FeedCheckpointStore


@dataclass(frozen=True)
class Acquired:
    tenure: Tenure
    record: StreamRecord


@dataclass(frozen=True)
class RenewResult:
    outcome: RenewOutcome
    record: StreamRecord | None = None
    expires_at_ms: int | None = None
    error: str | None = None


class SinkOutcome(enum.Enum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"  # an earlier attempt of this batch landed


@dataclass(frozen=True)
class ForceReleased:
    changed: bool
    record: StreamRecord | None  # after the write if changed, else as found (None: missing)


@dataclass(frozen=True)
class TakeOver:
    """A survivor's claim on a fenced member's stream (``LeaseStore.take_over``): the
    lease passes from ``dead_owner``, if it was taken under an epoch older than
    ``fenced_epoch``, to ``owner`` under its own member ``epoch``."""

    stream_id: str
    dead_owner: str
    fenced_epoch: int
    owner: str
    now_wall_ms: int
    timings: LeaseTimings
    epoch: int = 0


@dataclass(frozen=True)
class HandOver:
    """A taker's claim on a stream its live holder offered it (``LeaseStore.take_handed``,
    ``streamlease.core.handover``): the lease passes from ``holder`` under ``fence`` to
    ``owner`` under its own member ``epoch``, fence + 1."""

    stream_id: str
    holder: str
    fence: int
    owner: str
    now_wall_ms: int
    timings: LeaseTimings
    epoch: int = 0


@dataclass(frozen=True)
class Heartbeat:
    """What one heartbeat writes into a member row (``FleetStore.heartbeat``): under
    ``epoch``, in the row under key ``shard``; ``bulletin`` None leaves it none."""

    worker_id: str
    epoch: int
    status: MemberStatus
    streams: int
    capacity: int
    handoffs: int
    now_wall_ms: int
    bulletin: str | None = None
    shard: int = 0


@dataclass(frozen=True)
class HeartbeatResult:
    outcome: HeartbeatOutcome
    heartbeat: int | None = None  # the counter as written (RENEWED)
    error: str | None = None
    offers: frozenset[str] = frozenset()  # the row's offers after the write (RENEWED)


class LeaseStore(Protocol):
    async def acquire(self, stream_id: str, owner: str, now_wall_ms: int,
                      timings: LeaseTimings, timeout: float | None = None,
                      epoch: int = 0) -> Acquired | None:
        """Take a free or expired lease (fence + 1), stamped with the owner's member
        epoch. None if the condition failed."""

    async def renew(self, tenure: Tenure, now_wall_ms: int, timings: LeaseTimings,
                    timeout: float | None = None) -> RenewResult:
        """Extend a lease this tenure still holds; the item as it now is."""

    async def release(self, tenure: Tenure, timeout: float | None = None,
                      trace_parent: str | None = None,
                      clean: CleanRelease | None = None) -> bool:
        """Expiry 0, owner and fence kept (and ``trace_parent`` and the ``clean`` mark
        stored with it, if given). False if the lease had moved on."""

    async def advance(self, tenure: Tenure, fence: int, last_seq: int,
                      timeout: float | None = None) -> Tenure | None:
        """Move a just-acquired tenure's fence and checkpoint forward (never back) to where
        the sink already is. None if the lease moved on meanwhile."""

    async def checkpoint(self, tenure: Tenure, prev_seq: int, last_seq: int,
                         timeout: float | None = None) -> SinkOutcome:
        """Move ``last_seq`` from ``prev_seq`` to ``last_seq`` if the item still names this
        owner and fence (the checkpoint of an output that is not the events table).
        ALREADY_COMMITTED if it is already there; StaleFence if the fence moved on;
        SinkConflict if the checkpoint is somewhere else."""

    async def orphans(self, threshold_ms: int, limit: int,
                      timeout: float | None = None) -> list[StreamRecord]:
        """STARTED streams whose lease expired before ``threshold_ms`` (the index)."""

    async def held_stopped(self, now_wall_ms: int, limit: int,
                           timeout: float | None = None) -> list[StreamRecord]:
        """STOPPED streams whose lease is still live: their holders must release them."""

    async def check(self, stream_id: str, timeout: float | None = None) -> StreamRecord | None:
        """The item as it is now (a consistent read): a holder's cheap check-in."""

    async def check_many(self, stream_ids: Sequence[str], *,
                         timeout: float | None = None) -> dict[str, StreamRecord | None]:
        """Many items in one eventually consistent read (DynamoDB: ``BatchGetItem``, 100
        keys a request, half the read units of ``check``): every id asked for (once, if
        repeated) -> its item, None if it has none (or its key is not a stream's).

        Eventually consistent: an item may come back as it was shortly before a write that
        already succeeded (this worker's own acquire or renew included), an item created
        moments ago may read as None, and one deleted moments ago as it was. A holder
        takes what it reads as a hint and confirms with ``check`` before giving anything
        up.

        All or nothing: every id is in the answer, or it raises (StoreThrottled when
        DynamoDB kept leaving keys unprocessed, StoreUnavailable on a timeout, as
        ``check``). ``timeout`` bounds the whole read, retries included (None: the
        store's call timeout)."""

    async def owned_by(self, owner: str, timeout: float | None = None) -> list[OwnedStream]:
        """Streams whose ``lease_owner`` is this worker (the owner index), held or not."""

    async def release_for(self, stream_id: str, owner: str, fence: int, fenced_epoch: int,
                          timeout: float | None = None,
                          trace_parent: str | None = None) -> bool:
        """Release a fenced member's stream on its behalf: expiry 0 and fence + 1 (and
        ``trace_parent`` stored with it, if given), if the owner and fence are as seen, the
        lease is held, and it was taken under an epoch older than ``fenced_epoch``. False
        if any of that no longer holds."""

    async def take_over(self, claim: TakeOver, timeout: float | None = None) -> Acquired | None:
        """Take a fenced member's stream straight over (``can_take_over``): owner, expiry
        and epoch become the claim's, fence + 1, in one conditional write. None if the
        stream is not (or no longer) leased to an incarnation older than
        ``claim.fenced_epoch``."""

    async def take_handed(self, claim: HandOver,
                          timeout: float | None = None) -> Acquired | None:
        """Take a stream its live holder offered: owner, expiry and epoch become the
        claim's, fence + 1, in one conditional write, if the item is STARTED and still
        held by ``claim.holder`` under ``claim.fence``. None otherwise."""

    async def decline(self, stream_id: str, holder: str, fence: int, taker: str,
                      timeout: float | None = None) -> None:
        """``taker`` will not take the stream ``holder`` offered it under ``fence``: said on
        the item (``codec.HANDOVER_DECLINED``) while the holder still holds it so."""

    def scan_pages(self, timeout: float | None = None,
                   page_size: int = 500) -> AsyncIterator[list[StreamRecord]]:
        """Every stream item, including those the index cannot see (the sweep), a page at
        a time: the table is never held in memory. ``timeout`` bounds each page's read."""

    async def adopt(self, stream_id: str, timeout: float | None = None) -> bool:
        """Give a hand-written item ``lease_expires_at_ms = 0``. False if it had one."""

    async def record_error(self, stream_id: str, message: str, at_ms: int,
                           timeout: float | None = None) -> None:
        """Write ``last_error`` (truncated, see ``codec.error_text``) and its time."""


class Sink(Protocol):
    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> SinkOutcome:
        """Deliver ``frames`` after ``prev_seq`` in one transaction, or raise StaleFence."""

    async def newest_event(self, stream_id: str,
                           timeout: float | None = None) -> EventMark | None:
        """The highest seq and fence already in the sink for this stream."""

    async def open(self, tenure: Tenure, record: StreamRecord) -> int:
        """A tenure begins (its processor's ``start``): the last seq the sink holds for
        the stream beyond the item's checkpoint, or 0 (only outputs that commit their
        own checkpoint know one)."""

    async def close(self, tenure: Tenure, reason: str) -> None:
        """The tenure ended (its processor's ``stop``); ``reason`` is one of
        ``streamlease.processor.STOP_REASONS``. Never raises."""

    async def settle(self, tenure: Tenure, timeout: float | None = None) -> None:
        """Finish what the last ``write_batch`` left in flight (a processor's checkpoint,
        written while the pump reads on); raises as ``write_batch`` would. The pump calls
        it after its final flush."""


class FleetStore(Protocol):
    """Member rows in the fleet table, spread over one or more keys (``core.layout``)."""

    async def register(self, worker_id: str, capacity: int, now_wall_ms: int,
                       status: MemberStatus = MemberStatus.ACTIVE,
                       timeout: float | None = None, incarnation: str = "") -> MemberRecord:
        """A new incarnation of this worker: a new epoch (above every earlier one, also
        if the row was deleted, whatever the wall clock says), counter 0, and the
        registering process's ``incarnation`` nonce in the row. An existing row of this
        worker id is moved on under its key; a new one is created under the key the
        layout gives it (the record's ``shard``)."""

    async def heartbeat(self, beat: Heartbeat, timeout: float | None = None) -> HeartbeatResult:
        """Counter + 1 under ``beat.epoch``; FENCED if the epoch moved on. The row carries
        ``beat``'s values afterwards (its bulletin: None, no bulletin)."""

    async def offer(self, worker_id: str, epoch: int, offer: str, shard: int = 0,
                    timeout: float | None = None) -> bool:
        """Add ``offer`` to the member's offers (its heartbeat reads them back), if its row
        is still under ``epoch`` and ACTIVE. False otherwise."""

    async def clear_offers(self, worker_id: str, epoch: int, offers: Sequence[str],
                           shard: int = 0, timeout: float | None = None) -> None:
        """Take ``offers`` off the member's row (under ``epoch``; nothing if it moved on)."""

    async def member(self, worker_id: str, timeout: float | None = None,
                     consistent: bool = True, shard: int = 0) -> MemberRecord | None:
        """One member row (None if it does not exist); ``consistent=False``: an eventually
        consistent read, half the read units, possibly a moment old."""

    async def members(self, timeout: float | None = None) -> list[MemberRecord]:
        """Every member row under every key of the layout (``roster``), consistently."""

    async def roster(self, timeout: float | None = None) -> tuple[list[MemberRecord], int]:
        """Every member row, sorted by worker id, and the layout they were read under: one
        consistent Query per key (the ``MEMBER`` key's answer carries the layout)."""

    async def spread(self, shards: int, timeout: float | None = None) -> bool:
        """Move the layout up to ``shards`` keys (False: it is already that large)."""

    async def publish(self, replica: Replica, shards: int,
                      timeout: float | None = None) -> int:
        """Write ``replica`` into each of ``shards`` keys, except where a replica under a
        newer leader fence is already; how many were written. Raises StoreError if any
        write failed (after trying every key)."""

    async def replica(self, shard: int, timeout: float | None = None) -> Replica | None:
        """The bulletin replica in key ``shard`` (eventually consistent; None if none)."""

    async def fence(self, seen: MemberRecord, by: str, now_wall_ms: int,
                    timeout: float | None = None) -> MemberRecord | None:
        """Declare ``seen`` dead (epoch + 1, DEAD) if it is still exactly as seen; the row
        as fenced, or None if it changed (it lives, or another peer fenced it)."""

    async def mark_released(self, worker_id: str, epoch: int,
                            timeout: float | None = None, shard: int = 0) -> bool:
        """A DEAD member's streams are all released."""

    async def leave(self, worker_id: str, epoch: int, timeout: float | None = None,
                    shard: int = 0) -> bool:
        """Remove this incarnation's row (a clean exit, every stream released)."""


class LeaderBackend(Protocol):
    """Where named leases live. Every method is one atomic, conditional operation."""

    #: Whether ``fenced_write`` applies a ``PutItem`` with a condition of its own, in
    #: the same atomic step as the fence check (DynamoDB and the in-memory store; not
    #: Redis, whose fenced writes are hash sets).
    conditional_puts: bool

    async def read(self, name: str, timeout: float | None = None,
                   consistent: bool = True) -> LeaderRecord | None:
        """The lease as it is; None if absent or expired. ``consistent`` False allows a
        read a moment stale where the backend offers one for less (DynamoDB: half the
        read units); a backend without that reads consistently anyway."""

    async def acquire(self, name: str, owner: str, ttl_s: float, seen: LeaderRecord | None,
                      now_wall_ms: int, timeout: float | None = None) -> int | None:
        """Take the lease if it is still exactly as ``seen`` (None: absent); the new
        fence (above every earlier one), or None if the condition failed."""

    async def renew(self, name: str, owner: str, fence: int, ttl_s: float, now_wall_ms: int,
                    timeout: float | None = None) -> HeartbeatOutcome:
        """Extend it while it is still this owner's under this fence (RENEWED), or report
        it gone (FENCED), or that the outcome is unknown."""

    async def resign(self, name: str, owner: str, fence: int,
                     timeout: float | None = None) -> bool:
        """Free it now (the fence stays) if still this holder's."""

    async def fenced_write(self, name: str, fence: int, write: Any,
                           timeout: float | None = None) -> None:
        """Apply ``write`` only if the lease still carries ``fence``, atomically. Raises
        StaleFence if it does not, WriteRefused if the write's own condition failed,
        TypeError for a write this backend cannot apply."""


class JobStore(Protocol):
    """Jobs and their runs in the fleet table."""

    async def put_job(self, job: Job) -> bool:
        """Upsert; True if it was new."""

    async def get_job(self, name: str) -> Job | UnreadableJob | None:
        """The job, ``UnreadableJob`` if its item cannot be run as stored, None if absent."""

    async def list_jobs(self, timeout: float | None = None) -> JobList:
        """Every job, sorted by name, and the job items that cannot be run as stored."""

    async def remove_job(self, name: str) -> bool:
        """False if there was no such job. Its run records stay."""

    def claim_write(self, run: JobRun) -> PutItem:
        """The conditional put that claims a slot (for a fenced write through the leader
        lease: claimed only while the lease carries the claim's fence)."""

    async def claim_run(self, run: JobRun, timeout: float | None = None) -> bool:
        """Claim a slot without the fence check (a leader lease outside this table);
        False if the slot was already claimed."""

    async def finish_run(self, run: JobRun, timeout: float | None = None) -> bool:
        """Record the outcome, on this runner's own claim, once."""

    async def abandon_run(self, job: str, slot: str, fence: int, now_wall_ms: int,
                          timeout: float | None = None) -> bool:
        """Mark a run whose runner went away (still without an outcome) abandoned."""

    async def runs(self, job: str, last: int, timeout: float | None = None) -> list[JobRun]:
        """The latest ``last`` runs of a job, newest first."""


class AdminStore(Protocol):
    async def create_tables(self) -> list[str]: ...

    async def check_tables(self) -> list[str]:
        """TableMissing (naming the fix) unless every table and index this version needs
        is there; advice about what works but costs more (an older index projection)."""

    async def get(self, stream_id: str) -> StreamRecord | None: ...

    async def list_streams(self) -> list[StreamRecord]: ...

    async def put_started(self, stream_id: str, ws_url: str,
                          profile: str | None = None) -> StreamRecord:
        """Upsert as STARTED; a new item gets ``lease_expires_at_ms`` 0 (free now). With
        ``profile``, the item's ``profile`` is set too; without, it is left as it is."""

    async def set_state(self, stream_id: str, state: str) -> StreamRecord | None: ...

    async def force_release(self, stream_id: str, expect_owner: str | None = None,
                            expect_fence: int | None = None) -> ForceReleased: ...

    def read_events(self, stream_id: str) -> AsyncIterator[Frame]: ...

    async def event_fences(self, stream_id: str) -> list[int]: ...

    async def put_item(self, item: dict[str, Any]) -> None:
        """A raw streams-table item (DynamoDB JSON), as an operator writes one by hand."""


@dataclass(frozen=True)
class Stores:
    """One backend's three roles, as a worker or a command opens them."""

    leases: LeaseStore
    sink: Sink
    admin: AdminStore
    fleet: FleetStore
    leader: LeaderBackend
    jobs: JobStore
    # Where the change feed's reader checkpoints (None: this backend has no change feed).
    feed_checkpoints: FeedCheckpointStore | None = None
