"""The fleet table's items <-> model values, and the membership rules as conditions.

One table, keyed ``Pk`` (S) + ``Sk`` (S), holds the fleet's own state; the partition
says what an item is, so each kind is read with one Query:

| Pk | Sk | item |
|---|---|---|
| ``MEMBER`` | worker id | a member row: epoch, heartbeat counter, status, streams held |
| ``MEMBER`` | ``HIGH_WATER_SK`` | the highest epoch any deleted member row carried |
| ``MEMBER`` | ``LAYOUT_SK`` | how many keys member rows spread over (``core.layout``) |
| ``MEMBER#<n>`` | worker id | a member row in key ``n`` of a spread layout |
| ``MEMBER`` / ``MEMBER#<n>`` | ``REPLICA_SK`` | a spread layout: the leader's bulletin, copied |
| ``LEADER`` | lease name | a leader lease: owner, fence, heartbeat counter, expiry |
| ``LEADER`` | ``FENCE_MARK_SK`` + lease name | the highest fence that lease ever handed out |
| ``JOB`` | job name | a singleton job: schedule, command, timeout, catch-up |
| ``RUN#<job>`` | slot (ISO 8601 UTC) | one run of one slot: fence, runner, times, outcome |

Pure: no botocore, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from streamlease.core import layout
from streamlease.core.jobs import MAX_TIMEOUT_S, Job, JobRun, RunOutcome, UnreadableJob
from streamlease.core.leadership import LeaderRecord
from streamlease.core.membership import MemberRecord, MemberStatus, next_epoch
from streamlease.core.schedule import checked
from streamlease.store.codec import Expr, n, s
from streamlease.store.protocols import Heartbeat

PK = "Pk"
SK = "Sk"
MEMBER_PK = "MEMBER"
LEADER_PK = "LEADER"

# Member rows.
EPOCH = "epoch"
HEARTBEAT = "heartbeat"
STATUS = "status"
STREAMS = "streams"
CAPACITY = "capacity"
HEARTBEAT_AT = "heartbeat_at_ms"  # the member's own wall clock: for people only
STARTED_AT = "started_at_ms"
RELEASED = "released"  # N 0/1: a DEAD member's streams were released on its behalf
HANDOFFS = "handoffs"  # N: bumped whenever the member hands streams over
FENCED_BY = "fenced_by"
FENCED_AT = "fenced_at_ms"
INCARNATION = "incarnation"  # S: a nonce per process, written by each registration
BULLETIN = "bulletin"  # S: the leader's bulletin (JSON, ``core.bulletin``), leader's row only
READS_LAYOUT = "reads_layout"  # S: the incarnation of a process that reads spread layouts
# SS: streams a peer hands this member, each "<fence>:<s|r>:<stream_id>" (``core.handover``)
OFFERS = "offers"
# The layout item and the bulletin replicas.
SHARDS = "shards"  # N: the layout (``core.layout``)
LEADER = "leader"  # S: a replica's leader
LEADER_SHARD = "leader_shard"  # N: the key of the leader's own row
LEADER_FENCE = "leader_fence"  # N: the leader lease's fence when the replica was written
# S: the leader's status (not ``status``: a replica must never decode as a member row)
LEADER_STATUS = "leader_status"
# The epoch high-water item, the layout item and the replicas share the member partitions
# (one Query and the same IAM scope as the rows) under sort keys no worker id can take:
# worker ids are printable, and these start with a control character. They have no
# status, so none decodes as a member.
HIGH_WATER_SK = "\x7fepoch-high-water"
LAYOUT_SK = "\x7flayout"
REPLICA_SK = "\x7fbulletin"

Item = dict[str, Any]


def member_key(worker_id: str, shard: int = 0) -> Item:
    return {PK: s(layout.partition(shard)), SK: s(worker_id)}


def layout_key() -> Item:
    return {PK: s(MEMBER_PK), SK: s(LAYOUT_SK)}


def replica_key(shard: int) -> Item:
    return {PK: s(layout.partition(shard)), SK: s(REPLICA_SK)}


def decode_layout(item: Mapping[str, Any] | None) -> int:
    """The layout in the layout item (1 if it does not exist or is unreadable)."""
    return layout.valid_shards(_int(item, SHARDS, 1)) if item else 1


def spread_expr(shards: int) -> Expr:
    """Move the layout up to ``shards``; never down (a layout already that large fails)."""
    return Expr(condition="attribute_not_exists(#shards) OR #shards < :shards",
                update="SET #shards = :shards", names={"#shards": SHARDS},
                values={":shards": n(shards)})


def encode_replica(shard: int, replica: layout.Replica) -> Item:
    return {**replica_key(shard), LEADER: s(replica.leader), LEADER_SHARD: n(replica.shard),
            EPOCH: n(replica.epoch), HEARTBEAT: n(replica.heartbeat),
            LEADER_FENCE: n(replica.fence), SHARDS: n(replica.shards),
            BULLETIN: s(replica.bulletin), LEADER_STATUS: s(replica.status.value),
            HANDOFFS: n(replica.handoffs)}


def replica_condition(fence: int) -> Expr:
    """A replica is replaced only by a leader under the same or a newer lease fence: a
    deposed leader's late write does not hide its successor's bulletin."""
    return Expr(condition="attribute_not_exists(#fence) OR #fence <= :fence",
                names={"#fence": LEADER_FENCE}, values={":fence": n(fence)})


def decode_replica(item: Mapping[str, Any] | None) -> layout.Replica | None:
    """A bulletin replica (None if absent or unreadable)."""
    if not item or _str(item, SK) != REPLICA_SK:
        return None
    leader, bulletin = _str(item, LEADER), _str(item, BULLETIN)
    shard = _int(item, LEADER_SHARD, -1)
    status = _str(item, LEADER_STATUS)
    if not leader or bulletin is None or not 0 <= shard < layout.MAX_SHARDS or \
            status is None or status not in MemberStatus.__members__:
        return None
    return layout.Replica(leader=leader, shard=shard, epoch=_int(item, EPOCH),
                          heartbeat=_int(item, HEARTBEAT), fence=_int(item, LEADER_FENCE),
                          shards=layout.valid_shards(_int(item, SHARDS, 1)),
                          bulletin=bulletin, status=MemberStatus(status),
                          handoffs=_int(item, HANDOFFS))


def high_water_key() -> Item:
    return {PK: s(MEMBER_PK), SK: s(HIGH_WATER_SK)}


def decode_high_water(item: Mapping[str, Any] | None) -> int:
    """The epoch high-water mark (0 if the item does not exist or is unreadable)."""
    return max(0, _int(item, EPOCH)) if item else 0


def _int(item: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = item.get(name)
    if isinstance(value, Mapping) and isinstance(value.get("N"), str):
        try:
            return int(value["N"])
        except ValueError:
            return default
    return default


def _str(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    if isinstance(value, Mapping) and isinstance(value.get("S"), str):
        return str(value["S"])
    return None


def decode_member(item: Mapping[str, Any]) -> MemberRecord | None:
    """A member row, or None if the item is not one (or is unreadable)."""
    shard = layout.shard_of_partition(_str(item, PK) or "")
    if shard is None:
        return None
    worker_id = _str(item, SK)
    status_text = _str(item, STATUS)
    if not worker_id or status_text is None or status_text not in MemberStatus.__members__:
        return None
    heartbeat_at = _int(item, HEARTBEAT_AT, -1)
    return MemberRecord(
        worker_id=worker_id,
        epoch=_int(item, EPOCH),
        heartbeat=_int(item, HEARTBEAT),
        status=MemberStatus(status_text),
        streams=_int(item, STREAMS),
        capacity=_int(item, CAPACITY),
        heartbeat_at_ms=None if heartbeat_at < 0 else heartbeat_at,
        released=_int(item, RELEASED) == 1,
        handoffs=_int(item, HANDOFFS),
        incarnation=_str(item, INCARNATION),
        fenced_by=_str(item, FENCED_BY),
        bulletin=_str(item, BULLETIN),
        shard=shard,
        reads_layout=_str(item, READS_LAYOUT),
        offers=offers_of(item),
    )


def offers_of(item: Mapping[str, Any]) -> frozenset[str]:
    """A member row's offers (empty if it has none, or they are not a string set)."""
    value = item.get(OFFERS, {}).get("SS")
    return frozenset(v for v in value if isinstance(v, str)) if isinstance(value, list) \
        else frozenset()


_NAMES = {
    "#epoch": EPOCH, "#hb": HEARTBEAT, "#status": STATUS, "#streams": STREAMS,
    "#cap": CAPACITY, "#hbat": HEARTBEAT_AT, "#started": STARTED_AT, "#released": RELEASED,
    "#handoffs": HANDOFFS, "#by": FENCED_BY, "#at": FENCED_AT, "#inc": INCARNATION,
    "#bulletin": BULLETIN, "#layout": READS_LAYOUT, "#offers": OFFERS,
}


def _names(*placeholders: str) -> dict[str, str]:
    return {p: _NAMES[p] for p in placeholders}


def register_expr(capacity: int, now_ms: int, status: MemberStatus, incarnation: str,
                  high_water: int | None = None) -> Expr:
    """A new incarnation: the epoch moves past every earlier one of this worker id (so
    their conditional writes fail), the counter restarts, and the row names this process
    (``incarnation``), so an earlier incarnation that is still alive can tell a duplicate
    worker id from a peer's fence.

    Two forms of ``next_epoch``, each conditioned on the case it covers, so the epoch never
    goes back: ``high_water`` None moves an existing row's epoch on by one (fails if there
    is no row); a number creates a missing row (never written, or deleted after a clean
    exit) one above both the wall clock and that high-water mark (fails if the row exists
    meanwhile). The caller tries the first, and on failure reads the mark and tries the
    second: a row deleted after the first failed raised the mark before it was deleted."""
    if high_water is None:
        condition = "attribute_exists(#epoch)"
        epoch = "#epoch = #epoch + :one"
        values: dict[str, Any] = {":one": n(1)}
    else:
        condition = "attribute_not_exists(#epoch)"
        epoch = "#epoch = :epoch"
        values = {":epoch": n(next_epoch(None, high_water, now_ms))}
    return Expr(
        condition=condition,
        update=(f"SET {epoch}, #hb = :zero, "
                "#status = :status, #streams = :zero, #cap = :cap, #hbat = :now, "
                "#started = :now, #released = :zero, #handoffs = :zero, #inc = :inc, "
                "#layout = :inc REMOVE #by, #at, #offers"),
        names=_names("#epoch", "#hb", "#status", "#streams", "#cap", "#hbat", "#started",
                     "#released", "#handoffs", "#by", "#at", "#inc", "#layout", "#offers"),
        values={**values, ":zero": n(0), ":status": s(status.value),
                ":cap": n(capacity), ":now": n(now_ms), ":inc": s(incarnation)},
    )


def high_water_expr(deleted_epoch: int) -> Expr:
    """Raise the high-water mark to an epoch about to be deleted; a mark already at or
    above it fails the condition, which is fine (``raised_high_water``: never lower)."""
    return Expr(
        condition="attribute_not_exists(#epoch) OR #epoch < :epoch",
        update="SET #epoch = :epoch",
        names=_names("#epoch"),
        values={":epoch": n(deleted_epoch)},
    )


def heartbeat_expr(beat: Heartbeat) -> Expr:
    """Counter + 1, only under this member's epoch: a fenced member's heartbeat fails.
    The leader's heartbeat also writes its bulletin; any other member's removes one it
    wrote while it led."""
    values = {":epoch": n(beat.epoch), ":one": n(1), ":status": s(beat.status.value),
              ":streams": n(beat.streams), ":cap": n(beat.capacity),
              ":handoffs": n(beat.handoffs), ":now": n(beat.now_wall_ms)}
    update = ("SET #hb = #hb + :one, #status = :status, #streams = :streams, #cap = :cap, "
              "#handoffs = :handoffs, #hbat = :now")
    if beat.bulletin is None:
        update += " REMOVE #bulletin"
    else:
        update += ", #bulletin = :bulletin"
        values[":bulletin"] = s(beat.bulletin)
    return Expr(
        condition="#epoch = :epoch", update=update,
        names=_names("#epoch", "#hb", "#status", "#streams", "#cap", "#handoffs", "#hbat",
                     "#bulletin"),
        values=values,
    )


def offer_expr(epoch: int, offer: str) -> Expr:
    """A peer hands a stream to this member (``core.handover``): the offer joins the row's
    set, if the row is still the incarnation the peer saw and is taking streams."""
    return Expr(
        condition="#epoch = :epoch AND #status = :active",
        update="ADD #offers :offer",
        names=_names("#epoch", "#status", "#offers"),
        values={":epoch": n(epoch), ":active": s(MemberStatus.ACTIVE.value),
                ":offer": {"SS": [offer]}},
    )


def clear_offers_expr(epoch: int, offers: Iterable[str]) -> Expr:
    """The member has acted on ``offers``: they leave its row's set."""
    return Expr(
        condition="#epoch = :epoch AND attribute_exists(#offers)",
        update="DELETE #offers :done",
        names=_names("#epoch", "#offers"),
        values={":epoch": n(epoch), ":done": {"SS": sorted(offers)}},
    )


def fence_expr(seen: MemberRecord, by: str, now_ms: int) -> Expr:
    """Declare a member dead: its epoch moves on, conditioned on exactly what the peer
    observed (epoch and counter), so one peer wins and a member that heartbeated in the
    meantime is left alone."""
    return Expr(
        condition="#epoch = :epoch AND #hb = :hb AND #status <> :dead",
        update="SET #epoch = :next, #status = :dead, #released = :zero, #by = :by, #at = :now",
        names=_names("#epoch", "#hb", "#status", "#released", "#by", "#at"),
        values={":epoch": n(seen.epoch), ":hb": n(seen.heartbeat), ":next": n(seen.epoch + 1),
                ":dead": s(MemberStatus.DEAD.value), ":zero": n(0), ":by": s(by),
                ":now": n(now_ms)},
    )


def released_expr(epoch: int) -> Expr:
    """A DEAD member's streams are all released (its row can be forgotten later)."""
    return Expr(
        condition="#epoch = :epoch AND #status = :dead",
        update="SET #released = :one",
        names=_names("#epoch", "#status", "#released"),
        values={":epoch": n(epoch), ":dead": s(MemberStatus.DEAD.value), ":one": n(1)},
    )


def leave_condition(epoch: int) -> Expr:
    return Expr(condition="#epoch = :epoch", names=_names("#epoch"),
                values={":epoch": n(epoch)})


# Leader leases.
OWNER = "owner"
FENCE = "fence"
EXPIRES = "expires_at_ms"  # the holder's own clock: 0 means resigned
ACQUIRED_AT = "acquired_at_ms"


# Each lease's fence high-water item shares the LEADER partition (the same IAM scope as the
# lease itself) under a sort key no lease can take: the mark's sort keys start with a
# control character, and ``leader_key`` refuses lease names that do. It has no owner and
# never decodes as a lease.
FENCE_MARK_SK = "\x7ffence-high-water#"


def leader_key(name: str) -> Item:
    if name.startswith(FENCE_MARK_SK[0]):
        raise ValueError(f"leader lease names may not start with {FENCE_MARK_SK[0]!r} "
                         f"(reserved for the fleet table's own items): {name!r}")
    return {PK: s(LEADER_PK), SK: s(name)}


def fence_mark_key(name: str) -> Item:
    """The key of the item holding lease ``name``'s fence high-water mark."""
    return {PK: s(LEADER_PK), SK: s(FENCE_MARK_SK + name)}


def decode_fence_mark(item: Mapping[str, Any] | None) -> int:
    """A lease's fence high-water mark (0 if the item does not exist or is unreadable)."""
    return max(0, _int(item, FENCE)) if item else 0


def decode_leader(item: Mapping[str, Any]) -> LeaderRecord | None:
    name = _str(item, SK)
    if _str(item, PK) != LEADER_PK or name is None or name.startswith(FENCE_MARK_SK[0]):
        return None
    return LeaderRecord(name=name, owner=_str(item, OWNER), fence=_int(item, FENCE),
                        heartbeat=_int(item, HEARTBEAT), expires_at_ms=_int(item, EXPIRES))


_LEADER_NAMES = {"#pk": PK, "#owner": OWNER, "#fence": FENCE, "#hb": HEARTBEAT,
                 "#exp": EXPIRES, "#at": ACQUIRED_AT}


def leader_acquire_expr(owner: str, ttl_ms: int, now_ms: int, seen: LeaderRecord | None,
                        fence: int) -> Expr:
    """Take the lease if it is exactly as seen: absent; resigned under the fence seen; or
    held with the owner, fence and counter seen (observed unchanged for a time to live).
    The lease gets ``fence`` (``next_fence``: the caller knows the fence seen, or that
    there is none, because the condition pins it)."""
    values: dict[str, Any] = {":me": s(owner), ":exp": n(now_ms + ttl_ms), ":zero": n(0),
                              ":now": n(now_ms), ":next": n(fence)}
    if seen is None:
        condition = "attribute_not_exists(#pk)"
    elif seen.resigned:
        condition = "#fence = :fence AND (#exp = :zero OR attribute_not_exists(#owner))"
        values[":fence"] = n(seen.fence)
    else:
        condition = "#owner = :owner AND #fence = :fence AND #hb = :hb"
        values.update({":owner": s(seen.owner or ""), ":fence": n(seen.fence),
                       ":hb": n(seen.heartbeat)})
    update = "SET #owner = :me, #fence = :next, #hb = :zero, #exp = :exp, #at = :now"
    return Expr(condition=condition, update=update,
                names=_used(_LEADER_NAMES, condition, update), values=values)


@dataclass(frozen=True)
class LeaderAcquisition:
    """One attempt at a leader lease: ``leader_acquire_expr``'s arguments."""

    owner: str
    ttl_ms: int
    now_ms: int
    seen: LeaderRecord | None
    fence: int


def leader_acquire_item(table: str, name: str, attempt: LeaderAcquisition) -> dict[str, Any]:
    """The lease's part of an acquisition (``leader_acquire_expr``), as a transaction
    item: it goes together with ``fence_mark_item`` for the same fence."""
    lease = leader_acquire_expr(attempt.owner, attempt.ttl_ms, attempt.now_ms, attempt.seen,
                                attempt.fence)
    return {"Update": {"TableName": table, "Key": leader_key(name), **lease.update_kwargs()}}


def fence_mark_item(table: str, name: str, fence: int) -> dict[str, Any]:
    """Raise lease ``name``'s fence high-water mark to ``fence``, in the same transaction
    as the acquisition that hands it out, so the mark never lags. It fails if the mark is
    already at or above ``fence`` (the lease's fence was set below it by hand; never
    lowered): the caller reads the mark and tries again above it."""
    mark = Expr(
        condition="attribute_not_exists(#fence) OR #fence < :next",
        update="SET #fence = :next",
        names={"#fence": FENCE},
        values={":next": n(fence)},
    )
    return {"Update": {"TableName": table, "Key": fence_mark_key(name), **mark.update_kwargs()}}


def _used(names: dict[str, str], *texts: str) -> dict[str, str]:
    """The placeholders that appear in these expressions (DynamoDB refuses unused ones)."""
    return {k: v for k, v in names.items() if any(re.search(re.escape(k) + r"\b", t)
                                                   for t in texts)}


def leader_renew_expr(owner: str, fence: int, ttl_ms: int, now_ms: int) -> Expr:
    return Expr(
        condition="#owner = :me AND #fence = :fence AND #exp <> :zero",
        update="SET #hb = #hb + :one, #exp = :exp",
        names={k: _LEADER_NAMES[k] for k in ("#owner", "#fence", "#exp", "#hb")},
        values={":me": s(owner), ":fence": n(fence), ":zero": n(0), ":one": n(1),
                ":exp": n(now_ms + ttl_ms)},
    )


def leader_resign_expr(owner: str, fence: int) -> Expr:
    return Expr(
        condition="#owner = :me AND #fence = :fence",
        update="SET #exp = :zero",
        names={k: _LEADER_NAMES[k] for k in ("#owner", "#fence", "#exp")},
        values={":me": s(owner), ":fence": n(fence), ":zero": n(0)},
    )


def leader_check(name: str, fence: int, table: str) -> dict[str, Any]:
    """The ConditionCheck that fences a write: the lease still carries this fence."""
    return {"ConditionCheck": {
        "TableName": table, "Key": leader_key(name),
        "ConditionExpression": "#fence = :fence",
        "ExpressionAttributeNames": {"#fence": FENCE},
        "ExpressionAttributeValues": {":fence": n(fence)},
    }}


# Jobs and their runs.
JOB_PK = "JOB"
RUN_PREFIX = "RUN#"
CRON = "cron"
EVERY_MS = "every_ms"
COMMAND = "command"
TIMEOUT_S = "timeout_s"
CATCH_UP = "catch_up"  # N 0/1
UPDATED_AT = "updated_at_ms"
RUNNER = "runner"
STARTED = "started_at_ms"
FINISHED = "finished_at_ms"
OUTCOME = "outcome"
EXIT_CODE = "exit_code"
OUTPUT = "output"


def job_key(name: str) -> Item:
    return {PK: s(JOB_PK), SK: s(name)}


def run_key(job: str, slot: str) -> Item:
    return {PK: s(RUN_PREFIX + job), SK: s(slot)}


def encode_job(job: Job) -> Item:
    item: Item = {**job_key(job.name), COMMAND: s(job.command),
                  CATCH_UP: n(1 if job.catch_up else 0), UPDATED_AT: n(job.updated_at_ms)}
    if job.schedule.cron is not None:
        item[CRON] = s(job.schedule.cron)
    if job.schedule.every_ms is not None:
        item[EVERY_MS] = n(job.schedule.every_ms)
    if job.timeout_s is not None:
        item[TIMEOUT_S] = {"N": repr(float(job.timeout_s))}
    return item


def decode_job(item: Mapping[str, Any]) -> Job | UnreadableJob | None:
    """A job item; ``UnreadableJob`` saying why if it cannot be run as stored (edited by
    hand: no command, a bad schedule or timeout); None if it is not a job item at all."""
    name = _str(item, SK)
    if _str(item, PK) != JOB_PK or not name:
        return None
    command = _str(item, COMMAND)
    if command is None or not command.strip():
        return UnreadableJob(name, "no command (a string attribute 'command')")
    every = item.get(EVERY_MS)
    if every is not None and (not isinstance(every, Mapping) or _int(item, EVERY_MS, -1) < 0):
        return UnreadableJob(name, "every_ms is not a whole number of milliseconds")
    try:
        schedule = checked(_str(item, CRON), None if every is None else _int(item, EVERY_MS))
    except ValueError as exc:
        return UnreadableJob(name, f"bad schedule: {exc}")
    timeout: float | None = None
    if TIMEOUT_S in item:
        raw = item[TIMEOUT_S].get("N") if isinstance(item[TIMEOUT_S], Mapping) else None
        try:
            timeout = float(raw) if isinstance(raw, str) else None
        except ValueError:
            timeout = None
        if timeout is None or not 0 < timeout <= MAX_TIMEOUT_S:
            return UnreadableJob(name, f"timeout_s must be a number above 0 and at most "
                                       f"{MAX_TIMEOUT_S}")
    return Job(name=name, schedule=schedule, command=command, timeout_s=timeout,
               catch_up=_int(item, CATCH_UP) == 1, updated_at_ms=_int(item, UPDATED_AT))


def encode_run(run: JobRun) -> Item:
    item: Item = {**run_key(run.job, run.slot), FENCE: n(run.fence), RUNNER: s(run.runner),
                  STARTED: n(run.started_at_ms)}
    if run.finished_at_ms is not None:
        item[FINISHED] = n(run.finished_at_ms)
    if run.outcome is not None:
        item[OUTCOME] = s(run.outcome.value)
    if run.exit_code is not None:
        item[EXIT_CODE] = n(run.exit_code)
    if run.output:
        item[OUTPUT] = s(run.output)
    return item


def decode_run(item: Mapping[str, Any]) -> JobRun | None:
    pk, slot = _str(item, PK), _str(item, SK)
    if pk is None or not pk.startswith(RUN_PREFIX) or slot is None:
        return None
    outcome = _str(item, OUTCOME)
    finished = _int(item, FINISHED, -1)
    exit_code = item.get(EXIT_CODE)
    return JobRun(
        job=pk[len(RUN_PREFIX):], slot=slot, fence=_int(item, FENCE),
        runner=_str(item, RUNNER) or "", started_at_ms=_int(item, STARTED),
        finished_at_ms=None if finished < 0 else finished,
        outcome=_outcome(outcome),
        exit_code=_int(item, EXIT_CODE) if isinstance(exit_code, Mapping) else None,
        output=_str(item, OUTPUT) or "",
    )


_RUN_NAMES = {"#pk": PK, "#runner": RUNNER, "#fence": FENCE, "#outcome": OUTCOME,
              "#finished": FINISHED, "#exit": EXIT_CODE, "#output": OUTPUT}


def finish_expr(run: JobRun) -> Expr:
    """Record a run's end, only on the runner's own claim and only once (a new leader may
    have marked it abandoned meanwhile)."""
    sets = ["#outcome = :outcome", "#finished = :finished", "#output = :output"]
    values: dict[str, Any] = {":runner": s(run.runner), ":fence": n(run.fence),
                              ":outcome": s((run.outcome or RunOutcome.FAILED).value),
                              ":finished": n(run.finished_at_ms or 0),
                              ":output": s(run.output)}
    if run.exit_code is not None:
        sets.append("#exit = :exit")
        values[":exit"] = n(run.exit_code)
    condition = ("attribute_exists(#pk) AND #runner = :runner AND #fence = :fence AND "
                 "attribute_not_exists(#outcome)")
    update = "SET " + ", ".join(sets)
    return Expr(condition=condition, update=update,
                names=_used(_RUN_NAMES, condition, update), values=values)


def abandon_expr(fence: int, now_ms: int) -> Expr:
    """A run whose runner went away without an outcome: mark it, if still as seen."""
    condition = "#fence = :fence AND attribute_not_exists(#outcome)"
    update = "SET #outcome = :abandoned, #finished = :now"
    return Expr(condition=condition, update=update,
                names=_used(_RUN_NAMES, condition, update),
                values={":fence": n(fence), ":abandoned": s(RunOutcome.ABANDONED.value),
                        ":now": n(now_ms)})


def _outcome(text: str | None) -> RunOutcome | None:
    try:
        return RunOutcome(text) if text is not None else None
    except ValueError:
        return None
