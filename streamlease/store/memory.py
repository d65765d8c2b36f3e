"""The stores in memory, with DynamoDB's semantics: for fast tests and simulations.

Items are kept in DynamoDB's own JSON form and read through ``streamlease.store.codec``, so
wrongly typed attributes behave as they do in the table: a condition comparing a string
with a number is false, and a write that gives an index key the wrong type is refused.
Each method checks its condition and applies its write without awaiting in between, so on
one event loop every call is atomic, and a sink batch is all or nothing.

Its indexes lag as DynamoDB's do (``index_lag_s`` + ``uniform(0, index_lag_jitter_s)``,
drawn for each read; 0 by default): ``orphans``, ``held_stopped`` and ``owned_by``, the
calls the DynamoDB store answers from an index, see the table as it was that long ago on
the store's clock, and only what the index projects (``schema``): a record from the
orphan index has no ``last_seq``, one from the owner index only its keys.

Its eventually consistent reads are stale as DynamoDB's may be (``stale_reads_s``, 0 by
default, as the embedded server's ``--stale-reads-ms``): ``check_many`` sees each item as
it was ``uniform(0, stale_reads_s)`` ago, drawn for each item (DynamoDB answers each from
one of its replicas), so it can return an item's previous version, or none for an item
created in that window; so do a member row read without ``consistent`` and a leader
lease's calm read (``consistent=False``). With 0 they return every item as it is now.
Every other read is current, as the DynamoDB store's consistent reads are.

It has no failure modes of its own: tests wrap it to inject throttling, timeouts and
lost answers.

``MemoryTables`` holds the data, a class for each role works on it, and ``MemoryStore``
plays every role but the leader's and the jobs' (``MemoryLeader``, ``MemoryJobs``).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from streamlease.core import layout
from streamlease.core.fenced import HashSet, PutItem, Transaction
from streamlease.core.frames import Frame
from streamlease.core.handover import declined_text
from streamlease.core.jobs import Job, JobList, JobRun, RunOutcome
from streamlease.core.layout import Replica
from streamlease.core.leadership import LeaderRecord, next_fence, raised_fence_mark
from streamlease.core.lease import (
    CleanRelease,
    LeaseTimings,
    RenewOutcome,
    can_take_over,
    expiry_for,
    takeover_threshold_ms,
)
from streamlease.core.membership import (
    HeartbeatOutcome,
    MemberRecord,
    MemberStatus,
    next_epoch,
    raised_high_water,
)
from streamlease.core.model import (
    EventMark,
    OwnedStream,
    StreamRecord,
    Tenure,
    error_text,
    stream_key,
)
from streamlease.errors import StaleFence, StoreError, TableMissing, WriteRefused
from streamlease.store import codec, fleetcodec, schema
from streamlease.store.protocols import (
    Acquired,
    ForceReleased,
    HandOver,
    Heartbeat,
    HeartbeatResult,
    RenewResult,
    SinkOutcome,
    Stores,
    TakeOver,
)
from streamlease.store.versions import MAX_LAG_S, IndexLag, VersionLog

Item = dict[str, Any]
K = TypeVar("K")
V = TypeVar("V")
FLEET_TABLE = "fleet"  # the name fenced writes use for the in-memory fleet table
INDEX_KEYS = {codec.DESIRED_STATE: "S", codec.LEASE_EXPIRES: "N", codec.LEASE_OWNER: "S",
              codec.FENCE: "N"}


def _projections() -> dict[str, frozenset[str]]:
    """Index name -> the attributes it holds, from the table definition DynamoDB gets."""
    table = schema.streams_table("streams")
    keys = [k["AttributeName"] for k in table["KeySchema"]]
    found = {}
    for index in table["GlobalSecondaryIndexes"]:
        names = keys + [k["AttributeName"] for k in index["KeySchema"]]
        projection = index["Projection"]
        if projection["ProjectionType"] == "ALL":
            raise ValueError(f"index {index['IndexName']}: ALL is not modelled here")
        names += projection.get("NonKeyAttributes", [])
        found[index["IndexName"]] = frozenset(names)
    return found


PROJECTIONS = _projections()

# Stores built without an explicit lag get this one. Production code never relies on it;
# the test suite sets it so that every MemoryStore lags its indexes as DynamoDB does.
DEFAULT_INDEX_LAG = IndexLag()
DEFAULT_STALE_READS_S = 0.0  # likewise, the staleness of eventually consistent reads
DEFAULT_SEED: int | None = None  # the jitter's seed for stores built without an rng


class Monotonic(Protocol):
    def monotonic(self) -> float: ...


class _LoopTime:
    """Without an injected clock, lag is measured on the running event loop's clock
    (virtual time under a virtual-time test loop, as the worker's own clock is there)."""

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()


class MemoryTables:
    """The tables every role reads and writes, and how a write is kept for the reads that
    lag (``VersionLog``)."""

    def __init__(self, clock: Monotonic | None = None, *, index_lag_s: float | None = None,
                 index_lag_jitter_s: float | None = None, stale_reads_s: float | None = None,
                 rng: random.Random | None = None) -> None:
        """``index_lag_s``/``index_lag_jitter_s``/``stale_reads_s``: see the module doc
        (None: the values of ``DEFAULT_INDEX_LAG`` and ``DEFAULT_STALE_READS_S``, no lag
        unless a test suite sets them). ``clock`` measures the lag (default: the running
        loop's time); ``rng`` draws the jitter and the staleness."""
        default = DEFAULT_INDEX_LAG
        self.index_lag = IndexLag(default.fixed_s if index_lag_s is None else index_lag_s,
                                  default.jitter_s if index_lag_jitter_s is None
                                  else index_lag_jitter_s)
        stale = DEFAULT_STALE_READS_S if stale_reads_s is None else stale_reads_s
        if not 0.0 <= stale <= MAX_LAG_S:  # also refuses nan
            raise ValueError(f"stale reads must be 0-{MAX_LAG_S:g} s, got {stale!r}")
        self.stale_reads_s = stale
        self.clock: Monotonic = clock or _LoopTime()
        self.rng = rng or random.Random(DEFAULT_SEED)
        # The past, as far back as any lagging read may look.
        self._versions: VersionLog[str, Item] = VersionLog(max(self.index_lag.max_s, stale))
        self._member_versions: VersionLog[str, MemberRecord] = VersionLog(stale)
        self._leader_versions: VersionLog[str, LeaderRecord] = VersionLog(stale)
        self.items: dict[str, Item] = {}  # Pk -> streams item
        self.events: dict[str, dict[int, Item]] = {}  # Pk -> Sk -> events item
        self.events_ttl_s = 0  # STREAMLEASE_EVENTS_TTL_SECONDS (items are kept, as DynamoDB
        # keeps an expired item until its TTL sweep gets to it)
        self.members_by_id: dict[str, MemberRecord] = {}  # one row per worker id, any key
        self.shards = 1  # the member layout (``core.layout``)
        self.replicas: dict[int, Replica] = {}  # key -> the leader's bulletin, copied
        self._replica_versions: VersionLog[int, Replica] = VersionLog(stale)
        self.epoch_high_water = 0  # the highest epoch any deleted member row carried
        self.leaders: dict[str, LeaderRecord] = {}
        self.leader_fence_marks: dict[str, int] = {}  # lease name -> highest fence handed out
        self.jobs: dict[str, Job] = {}
        self.runs: dict[tuple[str, str], JobRun] = {}
        self.written: dict[str, dict[str, Any]] = {}  # fenced writes: table/key -> key -> item
        self.tables_created = False
        self.calls: list[str] = []  # method names, in call order (for tests)

    def _called(self, name: str) -> None:
        self.calls.append(name)

    def _set(self, item: Item, changes: Item) -> None:
        _check_index_keys({**item, **changes})
        self._remember(item[codec.PK]["S"])
        item.update(changes)

    def _remember(self, pk: str) -> None:
        """Keep the item as it is before a write, for index reads and stale reads that
        lag (a shallow copy: writes replace attribute values, never change them)."""
        if self._versions.window_s > 0:
            before = self.items.get(pk)
            self._versions.record(pk, dict(before) if before is not None else None,
                                  self.clock.monotonic())

    def _index_read(self, index: str) -> list[Item]:
        """The items an index read returns: the table as it was a lag ago, each item
        cut to what the index projects."""
        items: Mapping[str, Item] = self.items
        if self.index_lag.enabled:
            now = self.clock.monotonic()
            self._versions.prune(now)
            past = self._versions.as_of(now - self.index_lag.draw(self.rng))
            if past:
                then = dict(self.items)
                for pk, version in past.items():
                    if version is None:
                        then.pop(pk, None)
                    else:
                        then[pk] = version
                items = then
        keep = PROJECTIONS[index]
        return [{k: v for k, v in item.items() if k in keep} for item in items.values()]

    def _row(self, worker_id: str, shard: int) -> MemberRecord | None:
        """The row of ``worker_id`` if it lives under ``shard`` (a write under another key
        finds no row, as on DynamoDB)."""
        row = self.members_by_id.get(worker_id)
        return row if row is not None and row.shard == shard else None

    def _read(self, versions: VersionLog[K, V], table: dict[K, V], key: K,
              consistent: bool) -> V | None:
        """``table[key]``, or for an eventually consistent read (``stale_reads_s``) the
        version it had ``uniform(0, stale_reads_s)`` ago (kept by ``_write``)."""
        current = table.get(key)
        if consistent or not self.stale_reads_s:
            return current
        now = self.clock.monotonic()
        versions.prune(now)
        older, before = versions.version_at(
            key, now - self.rng.uniform(0.0, self.stale_reads_s))
        return before if older else current

    def _write(self, versions: VersionLog[K, V], table: dict[K, V], key: K,
               value: V | None) -> None:
        """Write (None: delete) ``table[key]``, keeping the version it replaces for
        eventually consistent reads (``stale_reads_s``)."""
        if self.stale_reads_s:
            versions.record(key, table.get(key), self.clock.monotonic())
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value

    def _put_member(self, worker_id: str, row: MemberRecord | None) -> None:
        self._write(self._member_versions, self.members_by_id, worker_id, row)

    def _put_leader(self, name: str, record: LeaderRecord) -> None:
        self._write(self._leader_versions, self.leaders, name, record)


class MemoryLeases(MemoryTables):
    """``LeaseStore``: the streams table's leases, as the DynamoDB store's conditions
    decide."""

    async def acquire(self, stream_id: str, owner: str, now_wall_ms: int,
                      timings: LeaseTimings, timeout: float | None = None,
                      epoch: int = 0) -> Acquired | None:
        self._called("acquire")
        item = self.items.get(stream_key(stream_id))
        expiry = expiry_for(now_wall_ms, timings)
        threshold = takeover_threshold_ms(now_wall_ms, timings)
        if item is None or _s(item, codec.DESIRED_STATE) != "STARTED":
            return None
        if codec.LEASE_EXPIRES in item:
            current = _n(item, codec.LEASE_EXPIRES)
            if current is None or current >= threshold:
                return _resent_acquire(item, owner, expiry)
        if codec.LAST_SEQ in item and _n(item, codec.LAST_SEQ) is None:
            return None  # a wrongly typed checkpoint: the condition refuses it
        fence = _n(item, codec.FENCE)
        if codec.FENCE in item and fence is None:
            raise StoreError("ValidationException: fence is not a number")
        self._set(item, {codec.LEASE_OWNER: codec.s(owner), codec.LEASE_EXPIRES: codec.n(expiry),
                         codec.FENCE: codec.n((fence or 0) + 1),
                         codec.LEASE_EPOCH: codec.n(epoch)})
        record = _record(item)
        return Acquired(Tenure(stream_id, owner, (fence or 0) + 1, record.last_seq, expiry,
                               epoch), record)

    async def renew(self, tenure: Tenure, now_wall_ms: int, timings: LeaseTimings,
                    timeout: float | None = None) -> RenewResult:
        self._called("renew")
        item = self.items.get(stream_key(tenure.stream_id))
        if not _holds(item, tenure) or _n(item, codec.LEASE_EXPIRES) == 0:
            return RenewResult(RenewOutcome.LOST)
        assert item is not None
        expiry = expiry_for(now_wall_ms, timings)
        self._set(item, {codec.LEASE_EXPIRES: codec.n(expiry)})
        return RenewResult(RenewOutcome.RENEWED, _record(item), expiry)

    async def release(self, tenure: Tenure, timeout: float | None = None,
                      trace_parent: str | None = None,
                      clean: CleanRelease | None = None) -> bool:
        self._called("release")
        item = self.items.get(stream_key(tenure.stream_id))
        if not _holds(item, tenure):
            return False
        assert item is not None
        mark = {codec.CLEAN_RELEASE: codec.clean_release_value(clean)} if clean else {}
        self._set(item, {codec.LEASE_EXPIRES: codec.n(0), **_trace_parent(trace_parent),
                         **mark})
        return True

    async def advance(self, tenure: Tenure, fence: int, last_seq: int,
                      timeout: float | None = None) -> Tenure | None:
        self._called("advance")
        item = self.items.get(stream_key(tenure.stream_id))
        if not _holds(item, tenure):
            return None
        assert item is not None
        self._set(item, {codec.FENCE: codec.n(fence), codec.LAST_SEQ: codec.n(last_seq)})
        return dataclasses.replace(tenure, fence=fence, last_seq=last_seq)

    async def checkpoint(self, tenure: Tenure, prev_seq: int, last_seq: int,
                         timeout: float | None = None) -> SinkOutcome:
        self._called("checkpoint")
        item = self.items.get(stream_key(tenure.stream_id))
        at = _n(item, codec.LAST_SEQ) or 0
        if not _holds(item, tenure) or at != prev_seq:
            old = _record(item) if item is not None else None
            return codec.refused_batch(["ConditionalCheckFailed"], old, tenure, prev_seq + 1,
                                       last_seq)
        assert item is not None
        self._set(item, {codec.LAST_SEQ: codec.n(last_seq)})
        return SinkOutcome.COMMITTED

    async def orphans(self, threshold_ms: int, limit: int,
                      timeout: float | None = None) -> list[StreamRecord]:
        self._called("orphans")
        return self._index("STARTED", lambda expiry: expiry < threshold_ms, limit)

    async def held_stopped(self, now_wall_ms: int, limit: int,
                           timeout: float | None = None) -> list[StreamRecord]:
        self._called("held_stopped")
        return self._index("STOPPED", lambda expiry: expiry > now_wall_ms, limit)

    def _index(self, state: str, keep: Callable[[int], bool], limit: int) -> list[StreamRecord]:
        found = []
        for item in self._index_read(codec.INDEX_NAME):
            expiry = _n(item, codec.LEASE_EXPIRES)
            record = codec.decode_record(item)
            if record is not None and record.desired_state == state and expiry is not None \
                    and keep(expiry):
                found.append((expiry, record))
        found.sort(key=lambda pair: pair[0])  # the index's range-key order
        return [record for _, record in found[:limit]]

    async def check(self, stream_id: str, timeout: float | None = None) -> StreamRecord | None:
        self._called("check")
        item = self.items.get(stream_key(stream_id))
        return _record(item) if item is not None else None

    async def check_many(self, stream_ids: Sequence[str], *,
                         timeout: float | None = None) -> dict[str, StreamRecord | None]:
        self._called("check_many")
        now = self.clock.monotonic() if self.stale_reads_s else 0.0
        if self.stale_reads_s:
            self._versions.prune(now)
        found: dict[str, StreamRecord | None] = {}
        for sid in dict.fromkeys(stream_ids):
            pk = stream_key(sid)
            item = self.items.get(pk)
            if self.stale_reads_s:
                older, before = self._versions.version_at(
                    pk, now - self.rng.uniform(0.0, self.stale_reads_s))
                if older:
                    item = before
            # As DynamoDB's: an item whose key is not a stream's reads as None.
            found[sid] = codec.decode_record(item) if item is not None else None
        return found

    async def owned_by(self, owner: str, timeout: float | None = None) -> list[OwnedStream]:
        self._called("owned_by")
        return [OwnedStream(r.stream_id, r.fence)
                for r in _records(self._index_read(codec.OWNER_INDEX_NAME))
                if r.lease_owner == owner and r.fence is not None]

    async def release_for(self, stream_id: str, owner: str, fence: int, fenced_epoch: int,
                          timeout: float | None = None,
                          trace_parent: str | None = None) -> bool:
        self._called("release_for")
        item = self.items.get(stream_key(stream_id))
        if item is None or _s(item, codec.LEASE_OWNER) != owner or \
                _n(item, codec.FENCE) != fence or _n(item, codec.LEASE_EXPIRES) == 0:
            return False
        epoch = _n(item, codec.LEASE_EPOCH)
        if codec.LEASE_EPOCH in item and (epoch is None or epoch >= fenced_epoch):
            return False
        self._set(item, {codec.LEASE_EXPIRES: codec.n(0), codec.FENCE: codec.n(fence + 1),
                         **_trace_parent(trace_parent)})
        return True

    async def take_over(self, claim: TakeOver, timeout: float | None = None) -> Acquired | None:
        self._called("take_over")
        item = self.items.get(stream_key(claim.stream_id))
        if item is None:
            return None
        owner, epoch = claim.owner, claim.epoch
        expiry = expiry_for(claim.now_wall_ms, claim.timings)
        if codec.LAST_SEQ in item and _n(item, codec.LAST_SEQ) is None:
            return None  # a wrongly typed checkpoint: the condition refuses it
        if codec.LEASE_EPOCH in item and _n(item, codec.LEASE_EPOCH) is None:
            return None  # a wrongly typed epoch compares false on DynamoDB too
        if codec.FENCE in item and _n(item, codec.FENCE) is None:
            raise StoreError("ValidationException: fence is not a number")
        if not can_take_over(_record(item), claim.dead_owner, claim.fenced_epoch):
            return _resent_acquire(item, owner, expiry)
        fence = _n(item, codec.FENCE)
        if fence is None:
            raise StoreError("ValidationException: fence is not a number")
        return self._pass_lease(item, claim.stream_id, owner, epoch, expiry, fence + 1)

    def _pass_lease(self, item: Item, stream_id: str, owner: str, epoch: int, expiry: int,
                    fence: int) -> Acquired:
        """A held lease passes to ``owner`` under ``fence`` (a take-over, a hand-over)."""
        self._set(item, {codec.LEASE_OWNER: codec.s(owner), codec.LEASE_EXPIRES: codec.n(expiry),
                         codec.FENCE: codec.n(fence), codec.LEASE_EPOCH: codec.n(epoch)})
        record = _record(item)
        return Acquired(Tenure(stream_id, owner, fence, record.last_seq, expiry, epoch), record)

    async def take_handed(self, claim: HandOver,
                          timeout: float | None = None) -> Acquired | None:
        self._called("take_handed")
        item = self.items.get(stream_key(claim.stream_id))
        if item is None:
            return None
        owner, epoch = claim.owner, claim.epoch
        expiry = expiry_for(claim.now_wall_ms, claim.timings)
        if codec.LAST_SEQ in item and _n(item, codec.LAST_SEQ) is None:
            return None  # a wrongly typed checkpoint: the condition refuses it
        record = _record(item)
        if not (record.started and record.lease_owner == claim.holder
                and record.fence == claim.fence and record.lease_expires_at_ms != 0
                and record.lease_expires_at_ms is not None):
            return _resent_acquire(item, owner, expiry)
        return self._pass_lease(item, claim.stream_id, owner, epoch, expiry, claim.fence + 1)

    async def decline(self, stream_id: str, holder: str, fence: int, taker: str,
                      timeout: float | None = None) -> None:
        self._called("decline")
        item = self.items.get(stream_key(stream_id))
        record = _record(item) if item is not None else None
        if item is not None and record is not None and record.lease_owner == holder \
                and record.fence == fence:
            self._set(item, {codec.HANDOVER_DECLINED: codec.s(declined_text(fence, taker))})

    async def scan_pages(self, timeout: float | None = None,
                         page_size: int = 500) -> AsyncIterator[list[StreamRecord]]:
        records = _records(list(self.items.values()))
        for start in range(0, max(1, len(records)), page_size):
            self._called("scan")
            yield records[start:start + page_size]

    async def adopt(self, stream_id: str, timeout: float | None = None) -> bool:
        self._called("adopt")
        item = self.items.get(stream_key(stream_id))
        if item is None or codec.LEASE_EXPIRES in item:
            return False
        self._set(item, {codec.LEASE_EXPIRES: codec.n(0)})
        return True

    async def record_error(self, stream_id: str, message: str, at_ms: int,
                           timeout: float | None = None) -> None:
        self._called("record_error")
        item = self.items.get(stream_key(stream_id))
        if item is not None:
            self._set(item, {codec.LAST_ERROR: codec.s(error_text(message)),
                             codec.LAST_ERROR_AT: codec.n(at_ms)})


class MemorySink(MemoryTables):
    """``Sink``: fenced batches into the events table, the checkpoint moved with them."""

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> SinkOutcome:
        self._called("write_batch")
        if not frames:
            return SinkOutcome.COMMITTED
        chunks = codec.chunk_frames(frames)
        if len(chunks) + 1 > codec.MAX_TRANSACT_ACTIONS:
            raise ValueError(f"batch of {len(frames)} frames needs {len(chunks)} items")
        first, last = frames[0].seq, frames[-1].seq
        pk = stream_key(tenure.stream_id)
        item = self.items.get(pk)
        checkpoint_ok = _holds(item, tenure) and (
            _n(item, codec.LAST_SEQ) == prev_seq if prev_seq
            else (item is not None and (codec.LAST_SEQ not in item
                                        or _n(item, codec.LAST_SEQ) == 0)))
        existing = self.events.setdefault(pk, {})
        codes = ["None" if checkpoint_ok else "ConditionalCheckFailed"]
        codes += ["ConditionalCheckFailed" if c[0].seq in existing else "None" for c in chunks]
        if any(code != "None" for code in codes):
            old = _record(item) if item is not None else None
            return codec.refused_batch(codes, old, tenure, first, last)
        assert item is not None
        self._set(item, {codec.LAST_SEQ: codec.n(last)})
        for chunk in chunks:
            existing[chunk[0].seq] = codec.event_item(tenure.stream_id, tenure.fence, chunk,
                                                      now_wall_ms, self.events_ttl_s)
        return SinkOutcome.COMMITTED

    async def open(self, tenure: Tenure, record: StreamRecord) -> int:
        return 0

    async def close(self, tenure: Tenure, reason: str) -> None:
        return None

    async def settle(self, tenure: Tenure, timeout: float | None = None) -> None:
        return None

    async def newest_event(self, stream_id: str,
                           timeout: float | None = None) -> EventMark | None:
        self._called("newest_event")
        items = self.events.get(stream_key(stream_id))
        if not items:
            return None
        return codec.decode_event_mark(items[max(items)])


class MemoryFleet(MemoryTables):
    """``FleetStore``: member rows, the layout and the bulletin replicas."""

    async def register(self, worker_id: str, capacity: int, now_wall_ms: int,
                       status: MemberStatus = MemberStatus.ACTIVE,
                       timeout: float | None = None, incarnation: str = "") -> MemberRecord:
        self._called("register")
        old = self.members_by_id.get(worker_id)
        epoch = next_epoch(old.epoch if old else None, self.epoch_high_water, now_wall_ms)
        # An existing row is moved on under its key; a new one goes where the layout says.
        shard = old.shard if old else layout.shard_of(worker_id, self.shards)
        record = MemberRecord(worker_id, epoch, 0, status, 0, capacity, now_wall_ms,
                              incarnation=incarnation, shard=shard, reads_layout=incarnation)
        self._put_member(worker_id, record)
        return record

    async def heartbeat(self, beat: Heartbeat, timeout: float | None = None) -> HeartbeatResult:
        self._called("heartbeat")
        old = self._row(beat.worker_id, beat.shard)
        if old is None or old.epoch != beat.epoch:
            return HeartbeatResult(HeartbeatOutcome.FENCED)
        new = dataclasses.replace(old, heartbeat=old.heartbeat + 1, status=beat.status,
                                  streams=beat.streams, capacity=beat.capacity,
                                  handoffs=beat.handoffs, heartbeat_at_ms=beat.now_wall_ms,
                                  bulletin=beat.bulletin)
        self._put_member(beat.worker_id, new)
        return HeartbeatResult(HeartbeatOutcome.RENEWED, new.heartbeat, offers=new.offers)

    async def offer(self, worker_id: str, epoch: int, offer: str, shard: int = 0,
                    timeout: float | None = None) -> bool:
        self._called("offer")
        old = self._row(worker_id, shard)
        if old is None or old.epoch != epoch or old.status is not MemberStatus.ACTIVE:
            return False
        self._put_member(worker_id, dataclasses.replace(old, offers=old.offers | {offer}))
        return True

    async def clear_offers(self, worker_id: str, epoch: int, offers: Sequence[str],
                           shard: int = 0, timeout: float | None = None) -> None:
        self._called("clear_offers")
        old = self._row(worker_id, shard)
        if offers and old is not None and old.epoch == epoch and old.offers:
            self._put_member(worker_id,
                             dataclasses.replace(old, offers=old.offers - set(offers)))

    async def member(self, worker_id: str, timeout: float | None = None,
                     consistent: bool = True, shard: int = 0) -> MemberRecord | None:
        self._called("member")
        row = self._read(self._member_versions, self.members_by_id, worker_id, consistent)
        return row if row is not None and row.shard == shard else None

    async def members(self, timeout: float | None = None) -> list[MemberRecord]:
        return (await self.roster(timeout))[0]

    async def roster(self, timeout: float | None = None) -> tuple[list[MemberRecord], int]:
        self._called("members")
        return sorted(self.members_by_id.values(), key=lambda m: m.worker_id), self.shards

    async def spread(self, shards: int, timeout: float | None = None) -> bool:
        self._called("spread")
        shards = layout.valid_shards(shards)
        if shards <= self.shards:
            return False
        self.shards = shards
        return True

    async def publish(self, replica: Replica, shards: int,
                      timeout: float | None = None) -> int:
        self._called("publish")
        written = 0
        for shard in range(layout.valid_shards(shards)):
            old = self.replicas.get(shard)
            if old is not None and old.fence > replica.fence:
                continue  # a newer leader's
            self._write(self._replica_versions, self.replicas, shard, replica)
            written += 1
        return written

    async def replica(self, shard: int, timeout: float | None = None) -> Replica | None:
        self._called("replica")
        return self._read(self._replica_versions, self.replicas, shard, consistent=False)

    async def fence(self, seen: MemberRecord, by: str, now_wall_ms: int,
                    timeout: float | None = None) -> MemberRecord | None:
        self._called("fence")
        old = self._row(seen.worker_id, seen.shard)
        if old is None or old.key != seen.key or old.status is MemberStatus.DEAD:
            return None
        new = dataclasses.replace(old, epoch=old.epoch + 1, status=MemberStatus.DEAD,
                                  released=False, fenced_by=by)
        self._put_member(seen.worker_id, new)
        return new

    async def mark_released(self, worker_id: str, epoch: int,
                            timeout: float | None = None, shard: int = 0) -> bool:
        self._called("mark_released")
        old = self._row(worker_id, shard)
        if old is None or old.epoch != epoch or old.status is not MemberStatus.DEAD:
            return False
        self._put_member(worker_id, dataclasses.replace(old, released=True))
        return True

    async def leave(self, worker_id: str, epoch: int, timeout: float | None = None,
                    shard: int = 0) -> bool:
        self._called("leave")
        self.epoch_high_water = raised_high_water(self.epoch_high_water, epoch)
        old = self._row(worker_id, shard)
        if old is None or old.epoch != epoch:
            return False
        self._put_member(worker_id, None)
        return True


class MemoryAdmin(MemoryTables):
    """``AdminStore``: what operators and tests do to the tables."""

    async def create_tables(self) -> list[str]:
        created = [] if self.tables_created else ["streams", "events"]
        self.tables_created = True
        return created

    async def check_tables(self) -> list[str]:
        if not self.tables_created:
            raise TableMissing("ResourceNotFoundException (run `streamlease table create`)")
        return []

    async def get(self, stream_id: str) -> StreamRecord | None:
        item = self.items.get(stream_key(stream_id))
        return _record(item) if item is not None else None

    async def list_streams(self) -> list[StreamRecord]:
        return sorted(_records(self.items.values()), key=lambda r: r.stream_id)

    async def put_started(self, stream_id: str, ws_url: str,
                          profile: str | None = None) -> StreamRecord:
        pk = stream_key(stream_id)
        self._remember(pk)
        item = self.items.setdefault(pk, {codec.PK: codec.s(pk)})
        changes = {codec.DESIRED_STATE: codec.s("STARTED"), codec.WS_URL: codec.s(ws_url)}
        if profile is not None:
            changes[codec.PROFILE] = codec.s(profile)
        if codec.LEASE_EXPIRES not in item:
            changes[codec.LEASE_EXPIRES] = codec.n(0)
        self._set(item, changes)
        return _record(item)

    async def set_state(self, stream_id: str, state: str) -> StreamRecord | None:
        item = self.items.get(stream_key(stream_id))
        if item is None:
            return None
        self._set(item, {codec.DESIRED_STATE: codec.s(state)})
        return _record(item)

    async def force_release(self, stream_id: str, expect_owner: str | None = None,
                            expect_fence: int | None = None) -> ForceReleased:
        item = self.items.get(stream_key(stream_id))
        if item is None:
            return ForceReleased(False, None)
        if (expect_owner is not None and _s(item, codec.LEASE_OWNER) != expect_owner) or \
                (expect_fence is not None and _n(item, codec.FENCE) != expect_fence):
            return ForceReleased(False, _record(item))
        fence = _n(item, codec.FENCE) or 0
        self._set(item, {codec.LEASE_EXPIRES: codec.n(0), codec.FENCE: codec.n(fence + 1)})
        item.pop(codec.TRACE_PARENT, None)  # an earlier release's context is not this one's
        return ForceReleased(True, _record(item))

    async def put_item(self, item: dict[str, Any]) -> None:
        _check_index_keys(item)
        self._remember(item[codec.PK]["S"])
        self.items[item[codec.PK]["S"]] = copy.deepcopy(item)

    async def delete(self, stream_id: str) -> None:
        """Delete a stream's item (an operator's hand; no store role offers it)."""
        pk = stream_key(stream_id)
        self._remember(pk)
        self.items.pop(pk, None)

    async def read_events(self, stream_id: str) -> AsyncIterator[Frame]:
        for item in self._event_items(stream_id):
            for frame in codec.decode_event_item(item):
                yield frame

    async def event_fences(self, stream_id: str) -> list[int]:
        return [int(item[codec.EV_FENCE]["N"]) for item in self._event_items(stream_id)]

    def _event_items(self, stream_id: str) -> Iterable[Item]:
        items = self.events.get(stream_key(stream_id), {})
        return [items[sk] for sk in sorted(items)]


class MemoryStore(MemoryLeases, MemorySink, MemoryFleet, MemoryAdmin):
    """One object playing every role (``stores()`` hands it out as ``Stores``)."""

    def stores(self) -> Stores:
        return Stores(leases=self, sink=self, admin=self, fleet=self,
                      leader=MemoryLeader(self), jobs=MemoryJobs(self))


class MemoryLeader:
    """``LeaderBackend`` over a MemoryStore's data (leases named like the fleet's)."""

    conditional_puts = True

    def __init__(self, store: MemoryTables) -> None:
        self.store = store

    async def read(self, name: str, timeout: float | None = None,
                   consistent: bool = True) -> LeaderRecord | None:
        self.store._called("leader_read" if consistent else "leader_read_eventual")
        return self.store._read(self.store._leader_versions, self.store.leaders, name,
                                consistent)

    async def acquire(self, name: str, owner: str, ttl_s: float, seen: LeaderRecord | None,
                      now_wall_ms: int, timeout: float | None = None) -> int | None:
        old = self.store.leaders.get(name)
        if seen is None:
            ok = old is None
        elif seen.resigned:
            ok = old is not None and old.fence == seen.fence and old.resigned
        else:
            ok = old is not None and old.key == seen.key
        if not ok:
            return None
        # As on DynamoDB: the fence moves past the lease's own and its high-water mark
        # (kept apart from the record, so it survives the record's loss), and the mark
        # is raised to it in the same step.
        mark = self.store.leader_fence_marks.get(name, 0)
        fence = next_fence(old.fence if old is not None else None, mark, now_wall_ms)
        self.store._put_leader(name, LeaderRecord(name, owner, fence, 0,
                                                  now_wall_ms + round(ttl_s * 1000)))
        self.store.leader_fence_marks[name] = raised_fence_mark(mark, fence)
        return fence

    async def renew(self, name: str, owner: str, fence: int, ttl_s: float, now_wall_ms: int,
                    timeout: float | None = None) -> HeartbeatOutcome:
        old = self.store.leaders.get(name)
        if old is None or old.owner != owner or old.fence != fence or old.resigned:
            return HeartbeatOutcome.FENCED
        self.store._put_leader(name, dataclasses.replace(
            old, heartbeat=old.heartbeat + 1, expires_at_ms=now_wall_ms + round(ttl_s * 1000)))
        return HeartbeatOutcome.RENEWED

    async def resign(self, name: str, owner: str, fence: int,
                     timeout: float | None = None) -> bool:
        old = self.store.leaders.get(name)
        if old is None or old.owner != owner or old.fence != fence:
            return False
        self.store._put_leader(name, dataclasses.replace(old, expires_at_ms=0))
        return True

    async def fenced_write(self, name: str, fence: int, write: Any,
                           timeout: float | None = None) -> None:
        self.store._called("fenced_write")
        current = self.store.leaders.get(name)
        puts: list[tuple[str, str, Item, str | None]]
        if isinstance(write, HashSet):
            puts = [(write.key, write.field, {"value": write.value}, None)]
        elif isinstance(write, PutItem):
            puts = [(write.table, _item_key(write.item), write.item, write.condition)]
        elif isinstance(write, Transaction):
            puts = []
            for action in write.actions:
                (kind, body), = action.items()
                if kind != "Put":
                    raise TypeError(f"the in-memory store applies Put actions only, not {kind}")
                puts.append((body["TableName"], _item_key(body["Item"]), body["Item"],
                             body.get("ConditionExpression")))
        else:
            raise TypeError(f"cannot apply {type(write).__name__}")
        if current is None or current.fence != fence:
            raise StaleFence(f"lease {name}: fence {fence} is no longer current")
        for table, key, item, condition in puts:
            if condition is not None and self._exists(table, key, item):
                if "attribute_not_exists" not in condition:
                    raise TypeError("the in-memory store knows attribute_not_exists only")
                raise WriteRefused("the write's own condition failed")
        for table, key, item, _ in puts:
            run = fleetcodec.decode_run(item) if table == FLEET_TABLE else None
            if run is not None:
                self.store.runs[(run.job, run.slot)] = run
            else:
                self.store.written.setdefault(table, {})[key] = copy.deepcopy(item)

    def _exists(self, table: str, key: str, item: Item) -> bool:
        run = fleetcodec.decode_run(item) if table == FLEET_TABLE else None
        if run is not None:
            return (run.job, run.slot) in self.store.runs
        return key in self.store.written.get(table, {})


class MemoryJobs:
    """``JobStore`` over a MemoryStore's data."""

    def __init__(self, store: MemoryTables) -> None:
        self.store = store

    async def put_job(self, job: Job) -> bool:
        new = job.name not in self.store.jobs
        self.store.jobs[job.name] = job
        return new

    async def get_job(self, name: str) -> Job | None:
        return self.store.jobs.get(name)

    async def list_jobs(self, timeout: float | None = None) -> JobList:
        return JobList(sorted(self.store.jobs.values(), key=lambda j: j.name), [])

    async def remove_job(self, name: str) -> bool:
        return self.store.jobs.pop(name, None) is not None

    def claim_write(self, run: JobRun) -> PutItem:
        return PutItem(FLEET_TABLE, fleetcodec.encode_run(run), "attribute_not_exists(#pk)",
                       {"#pk": fleetcodec.PK})

    async def claim_run(self, run: JobRun, timeout: float | None = None) -> bool:
        if (run.job, run.slot) in self.store.runs:
            return False
        self.store.runs[(run.job, run.slot)] = run
        return True

    async def finish_run(self, run: JobRun, timeout: float | None = None) -> bool:
        old = self.store.runs.get((run.job, run.slot))
        if old is None or old.runner != run.runner or old.fence != run.fence or \
                old.outcome is not None:
            return False
        self.store.runs[(run.job, run.slot)] = run
        return True

    async def abandon_run(self, job: str, slot: str, fence: int, now_wall_ms: int,
                          timeout: float | None = None) -> bool:
        old = self.store.runs.get((job, slot))
        if old is None or old.fence != fence or old.outcome is not None:
            return False
        self.store.runs[(job, slot)] = dataclasses.replace(
            old, outcome=RunOutcome.ABANDONED, finished_at_ms=now_wall_ms)
        return True

    async def runs(self, job: str, last: int, timeout: float | None = None) -> list[JobRun]:
        found = sorted((r for (j, _), r in self.store.runs.items() if j == job),
                       key=lambda r: r.slot, reverse=True)
        return found[:last]


def _s(item: Item | None, name: str) -> str | None:
    value = (item or {}).get(name)
    return value["S"] if isinstance(value, dict) and isinstance(value.get("S"), str) else None


def _n(item: Item | None, name: str) -> int | None:
    value = (item or {}).get(name)
    if isinstance(value, dict) and isinstance(value.get("N"), str):
        try:
            return int(value["N"])
        except ValueError:
            return None
    return None


def _trace_parent(trace_parent: str | None) -> Item:
    """A release's ``trace_parent``, as the codec's expressions write it (only if given)."""
    return {} if trace_parent is None else {codec.TRACE_PARENT: codec.s(trace_parent)}


def _holds(item: Item | None, tenure: Tenure) -> bool:
    return _s(item, codec.LEASE_OWNER) == tenure.owner and _n(item, codec.FENCE) == tenure.fence


def _record(item: Item) -> StreamRecord:
    record = codec.decode_record(item)
    assert record is not None
    return record


def _item_key(item: Item) -> str:
    """An item's identity for the in-memory tables: its Pk and Sk, if any."""
    return "|".join(str(item[k]) for k in ("Pk", "Sk") if k in item)


def _records(items: Iterable[Item]) -> list[StreamRecord]:
    """Stream items only (``CONN#<id>`` keys), as the Scan reads them."""
    return [r for r in map(codec.decode_record, items) if r is not None]


def _resent_acquire(item: Item, owner: str, expiry: int) -> Acquired | None:
    """An acquire that already applied (its answer lost, the request sent again)."""
    record = _record(item)
    if record.lease_owner == owner and record.lease_expires_at_ms == expiry and record.fence:
        return Acquired(Tenure(record.stream_id, owner, record.fence, record.last_seq, expiry,
                               record.lease_epoch or 0), record)
    return None


def _check_index_keys(item: Item) -> None:
    for name, kind in INDEX_KEYS.items():
        value = item.get(name)
        if isinstance(value, dict) and value and next(iter(value)) != kind:
            raise StoreError(f"ValidationException: Type mismatch for Index Key {name} "
                             f"Expected: {kind}")
