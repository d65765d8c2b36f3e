"""The capacity model: every request the control plane makes at steady state, counted from
the code, per table and per partition-key value, against DynamoDB's limits. What it
assumes, and why one partition-key value counts as one partition, is in
docs/performance.md ("Capacity model").

``KINDS`` is the one place that says what the code does: change the entry when the code
changes. Unit rules (DynamoDB's): a read unit covers 4 KB strongly consistent, 8 KB
eventually consistent (index queries and scans here are), summed per Query or Scan page;
a write unit covers 1 KB of the larger of the item before and after; a write that moves
an index's key is a delete and a put in that index.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from streamlease import feed as _feed
from streamlease import membership as _membership
from streamlease import reconciler as _reconciler
from streamlease import sweep as _sweep_module
from streamlease.config import DEFAULTS, WorkerConfig
from streamlease.core import bulletin, layout
from streamlease.core import handover as _handover
from streamlease.core.membership import MemberTimings
from streamlease.store import codec, fleetcodec
from streamlease.store.dynamodb import leases as _leases

KEY_READ_LIMIT = 3000.0  # read units/s one partition serves
KEY_WRITE_LIMIT = 1000.0  # write units/s one partition serves
TABLE_QUOTA = 40_000.0  # default read and write units/s per table or index (adjustable)
BUDGET = 0.5  # every key stays under half its limit
INDEX_WRITES_PER_LEASE_WRITE = 2  # the range key moves: delete + put
DEFAULT_MAX_STREAMS = int(DEFAULTS["STREAMLEASE_MAX_STREAMS"])
DEFAULT_CONFIG = WorkerConfig.from_env({})
DEFAULT_TIMINGS = DEFAULT_CONFIG.timings
SCALES = (1_000, 10_000, 100_000, 1_000_000)
READ_UNIT = 4096
WRITE_UNIT = 1024
PAGE_BYTES = 1 << 20  # a Query or Scan page returns at most 1 MB
SCAN_PAGE = 500  # DynamoLeaseStore.scan / owned_by page_size
# USD per request unit: DynamoDB on-demand, us-east-1, standard table class (the November
# 2024 price list).
PRICE_READ = 0.125 / 1e6
PRICE_WRITE = 0.625 / 1e6
SECONDS_PER_MONTH = 30 * 86400
MAX_SEARCH = 100_000_000  # streams: a key not past its budget below this is "never"

# -- item sizes -------------------------------------------------------------------------

WORKER_ID = "0123456789abcdef0123456789abcdef"  # an ECS task id: the default worker id
STREAM_ID = "5f0c7a1e-2b3d-4c5e-8f90-123456789abc"  # operators choose; a UUID here
WS_URL = f"wss://feeds.example.com/v1/streams/{STREAM_ID}"
NOW_MS = 1_780_123_456_789  # no trailing zeros: a number is billed by its digits


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def item_bytes(item: Mapping[str, Any]) -> int:
    """An item's size as DynamoDB bills it: each attribute's name plus its value (a string
    in UTF-8, a number one byte per two significant digits plus one)."""
    total = 0
    for name, value in item.items():
        total += len(name.encode())
        if "S" in value:
            total += len(value["S"].encode())
        elif "N" in value:
            digits = value["N"].lstrip("-").replace(".", "").strip("0") or "0"
            total += (len(digits) + 1) // 2 + 1
        else:
            total += 1  # BOOL / NULL
    return total


def member_row() -> dict[str, Any]:
    """A live member row as ``fleetcodec.register_expr`` and ``heartbeat_expr`` leave it
    (a day of heartbeats)."""
    f = fleetcodec
    return {f.PK: _s(f.MEMBER_PK), f.SK: _s(WORKER_ID), f.EPOCH: _n(NOW_MS),
            f.HEARTBEAT: _n(17_280), f.STATUS: _s("ACTIVE"), f.STREAMS: _n(100),
            f.CAPACITY: _n(100), f.HEARTBEAT_AT: _n(NOW_MS), f.STARTED_AT: _n(NOW_MS),
            f.RELEASED: _n(0), f.HANDOFFS: _n(12), f.INCARNATION: _s("0123456789abcdef"),
            f.READS_LAYOUT: _s("0123456789abcdef")}


def leader_member_row() -> dict[str, Any]:
    """The leader's member row: a live row with its bulletin at steady state (no deal, no
    donor: a fenced member's deal adds about 25 bytes per survivor while it lasts; every
    member short of its capacity, so the bulletin names its most takers)."""
    taker = bulletin.Taker(WORKER_ID, NOW_MS, 63, 99, 100)
    news = bulletin.Bulletin(gen=4_321, level=100, total=100_000, deficit=0, below=0,
                             active=1_000, draining=False,
                             statuses=(("ACTIVE", 1_000),),
                             takers=(taker,) * bulletin.MAX_TAKERS)
    return {**member_row(), fleetcodec.BULLETIN: _s(bulletin.encode(news))}


def replica_item() -> dict[str, Any]:
    """A spread layout's copy of the leader's bulletin in one member key."""
    news = leader_member_row()[fleetcodec.BULLETIN]["S"]
    return fleetcodec.encode_replica(1, layout.Replica(
        leader=WORKER_ID, shard=0, epoch=NOW_MS, heartbeat=17_280, fence=1234, shards=64,
        bulletin=news))


def high_water_item() -> dict[str, Any]:
    return {**fleetcodec.high_water_key(), fleetcodec.EPOCH: _n(NOW_MS)}


def leader_item() -> dict[str, Any]:
    f = fleetcodec
    return {**f.leader_key("fleet"), f.OWNER: _s(WORKER_ID), f.FENCE: _n(1234),
            f.HEARTBEAT: _n(17_280), f.EXPIRES: _n(NOW_MS), f.ACQUIRED_AT: _n(NOW_MS)}


def stream_item() -> dict[str, Any]:
    """A held stream's item: the contract's attributes plus the holder's epoch."""
    c = codec
    return {**c.key(STREAM_ID), c.DESIRED_STATE: _s("STARTED"), c.WS_URL: _s(WS_URL),
            c.LEASE_OWNER: _s(WORKER_ID), c.LEASE_EXPIRES: _n(NOW_MS), c.FENCE: _n(42),
            c.LAST_SEQ: _n(1_234_567_890), c.LEASE_EPOCH: _n(NOW_MS)}


def orphan_index_entry() -> dict[str, Any]:
    """The stream's entry in the orphan index: keys, ``Pk`` and ``INDEX_PROJECTED``."""
    item = stream_item()
    keep = {codec.PK, codec.DESIRED_STATE, codec.LEASE_EXPIRES, *codec.INDEX_PROJECTED}
    return {k: v for k, v in item.items() if k in keep}


def owner_index_entry() -> dict[str, Any]:
    """KEYS_ONLY: the owner, the fence and ``Pk``."""
    item = stream_item()
    return {k: v for k, v in item.items() if k in (codec.PK, codec.LEASE_OWNER, codec.FENCE)}


@dataclass(frozen=True)
class Sizes:
    """Bytes per item, from the representative items above."""

    member_row: int
    leader_row: int
    replica: int
    high_water: int
    leader: int
    stream: int
    orphan_entry: int
    owner_entry: int

    @classmethod
    def from_codecs(cls) -> Sizes:
        return cls(*(item_bytes(build()) for build in (
            member_row, leader_member_row, replica_item, high_water_item, leader_item,
            stream_item, orphan_index_entry, owner_index_entry)))


SIZES = Sizes.from_codecs()


def read_units(nbytes: float, consistent: bool) -> float:
    """One read (a GetItem, or one page of a Query or Scan) of ``nbytes`` in all."""
    units = max(1, math.ceil(nbytes / READ_UNIT))
    return float(units) if consistent else units / 2


def paged_read_units(items: float, size: int, consistent: bool,
                     per_page: int | None = None) -> tuple[float, float]:
    """(requests, read units) of reading ``items`` items of ``size`` bytes page by page
    (``per_page`` items a page at most, else 1 MB). DynamoDB returns a last, empty page
    when a page ends exactly at its limit; counted."""
    fit = max(1, PAGE_BYTES // size)
    page = min(per_page, fit) if per_page else fit
    full, rest = divmod(math.ceil(items), page)
    pages = full + 1 if per_page else full + (1 if rest or not full else 0)
    units = full * read_units(page * size, consistent) + \
        (read_units(rest * size, consistent) if pages > full else 0.0)
    return float(pages), units


def write_units(nbytes: int) -> float:
    return float(max(1, math.ceil(nbytes / WRITE_UNIT)))


# -- settings and the fleet's shape -----------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """The settings the rates depend on (defaults: the worker's own, from ``DEFAULTS``)."""

    # The member lease and heartbeat (STREAMLEASE_MEMBER_*, derived from the contract's
    # lease and heartbeat when unset): what member rows, the leader lease and reads run on.
    lease_s: float = DEFAULT_TIMINGS.lease_s
    heartbeat_s: float = DEFAULT_TIMINGS.heartbeat_s
    contract_lease_s: float = float(DEFAULTS["STREAMLEASE_LEASE_SECONDS"])  # the audit's scale
    reconcile_s: float = float(DEFAULTS["STREAMLEASE_RECONCILE_SECONDS"])
    sweep_s: float = float(DEFAULTS["STREAMLEASE_SWEEP_SECONDS"])
    stream_renew_s: float = DEFAULT_CONFIG.stream_renew_s
    stream_check_s: float = float(DEFAULTS["STREAMLEASE_STREAM_CHECK_SECONDS"])
    max_streams: int = DEFAULT_MAX_STREAMS
    deploys_per_day: float = 1.0  # each moves every stream once
    # The share of moves made live (make before break: an offer, the taker's take; the
    # events-table output, the default); the rest are a release and an acquisition.
    handed_share: float = 1.0
    # STREAMLEASE_CHANGE_FEED (on where the table has a stream, as `table create` and the
    # terraform give it): the leader tails the stream and the polls it replaces rest.
    change_feed: bool = DEFAULTS["STREAMLEASE_CHANGE_FEED"] == "on"
    jobs: int = 0  # job definitions the leader lists (their runs depend on their schedules)
    members_per_key: int = DEFAULT_CONFIG.members_per_key  # STREAMLEASE_MEMBERS_PER_KEY

    @property
    def observe_s(self) -> float:
        """Member reads and the leader campaign (``MemberTimings.observe_s``)."""
        return MemberTimings(self.lease_s, self.heartbeat_s, 0.0).observe_s

    @property
    def leader_row_s(self) -> float:
        """How often a member reads the leader's row (``Listener.read_s`` while the
        change feed is live: its notices reach members within a second)."""
        return min(self.observe_s, FEED_READ_S) if self.change_feed else self.observe_s

    @property
    def orphan_query_s(self) -> float:
        """A settled worker's orphan query (``Reconciler._next_pause``)."""
        return self.reconcile_s * (FEED_QUIET_FACTOR if self.change_feed else 1)

    @property
    def sweep_every_s(self) -> float:
        return self.sweep_s * (BACKSTOP_FACTOR if self.change_feed else 1)

    @property
    def audit_s(self) -> float:
        return 1.6 * self.contract_lease_s  # streamlease/app.py build_settings: audit_s

    @property
    def fast_poll_s(self) -> float:
        """The orphan poll while a peer drains or has just handed streams over
        (``Reconciler._next_pause``)."""
        return max(0.02, min(self.reconcile_s, self.heartbeat_s) / 5)

    @property
    def checks_per_renewal(self) -> int:
        """Check-ins between two renewals: a renewal reads the item too and pushes the
        next check one interval on (``Supervisor._heartbeat_loop``)."""
        return max(0, math.ceil(self.stream_renew_s / self.stream_check_s) - 1)


@dataclass(frozen=True)
class Shape:
    """A fleet: ``streams`` held by ``workers``.

    ``first_interval``: every stream was acquired less than one renewal interval ago (no
    renewal yet; checked every ``stream_check_s``), as in a short load-test window.
    ``churn_per_stream_s``: acquisitions (and as many releases) per stream-second; None
    takes the settings' rolling deploys."""

    streams: int
    workers: int
    settings: Settings = field(default_factory=Settings)
    sizes: Sizes = field(default_factory=lambda: SIZES)
    first_interval: bool = False
    churn_per_stream_s: float | None = None

    @classmethod
    def at(cls, streams: int, settings: Settings | None = None, **kw: Any) -> Shape:
        """``streams`` on as few workers as hold them (``max_streams`` each)."""
        s = settings or Settings()
        return cls(streams, max(1, math.ceil(streams / s.max_streams)), s, **kw)

    @property
    def per_worker(self) -> float:
        return self.streams / self.workers

    @property
    def keys(self) -> int:
        """The member keys the leader spreads the rows over (``layout.shards_for``)."""
        return layout.shards_for(self.workers, 1, self.settings.members_per_key)

    @property
    def bulletin_bytes(self) -> int:
        """The item a member reads for the bulletin: the leader's row in one key, else
        its key's replica."""
        return self.sizes.leader_row if self.keys == 1 else self.sizes.replica

    @property
    def churn(self) -> float:
        """Acquisitions per second, fleet-wide (releases: as many)."""
        per = self.churn_per_stream_s if self.churn_per_stream_s is not None else \
            self.settings.deploys_per_day / 86400
        return self.streams * per


# -- the request kinds ------------------------------------------------------------------

# The worker's own constants, so the model follows the code.
FEED_READ_S = _membership.FEED_READ_S
HANDOFF_READ_S = _membership.HANDOFF_READ_S
HANDOFF_READS_FOR_S = _membership.HANDOFF_READS_FOR_S
HANDOFF_READS_PER_S = _membership.HANDOFF_READS_PER_S
FEED_QUIET_FACTOR = _reconciler.FEED_QUIET_FACTOR
BACKSTOP_FACTOR = _sweep_module.BACKSTOP_FACTOR
FEED_POLL_S = _feed.FeedSettings().poll_s
BATCH_GET_KEYS = _leases.BATCH_GET_KEYS
OFFER_CHECK_S = _handover.OFFER_CHECK_S
# One offer in the taker's row: the attribute and a string of the set.
OFFER_BYTES = len(fleetcodec.OFFERS) + len(_handover.Offer(STREAM_ID, 42, False).text)

FLEET = "fleet table"
MEMBER_KEYS = "MEMBER keys"  # MEMBER, and MEMBER#<n> once the rows spread
STREAMS = "streams table"
STATE_INDEX = "streams: desired_state index"
OWNER_INDEX = "streams: owner index"

Rate = Callable[[Shape], float]


def _zero(_: Shape) -> float:
    return 0.0


def _handoff_reads_s(f: Shape) -> float:
    """Reads of the leader's row beyond the regular ones while hand-offs' notices flow
    (``Listener.handoff_read_s``)."""
    if not f.settings.change_feed:
        return 0.0
    faster = max(HANDOFF_READ_S, (f.workers - 1) / HANDOFF_READS_PER_S)
    extra = max(0.0, 1 / faster - 1 / f.settings.leader_row_s)
    drains_s = f.workers * f.settings.deploys_per_day / 86400
    return HANDOFF_READS_FOR_S * (f.churn + drains_s * (f.workers - 1)) * extra


def _one(_: Shape) -> float:
    return 1.0


def _released(f: Shape) -> float:
    """Moves made by a release and an acquisition, a second, fleet-wide."""
    return f.churn * (1 - f.settings.handed_share)


def _handed(f: Shape) -> float:
    """Moves made live (an offer and a take), a second, fleet-wide."""
    return f.churn * f.settings.handed_share


def _holder_reads(f: Shape) -> float:
    """A holder's reads of the item while its offer is out: one every ``OFFER_CHECK_S``
    until the take, which follows the taker's next member heartbeat (half an interval
    on average), and the one that sees it."""
    return f.settings.heartbeat_s / 2 / OFFER_CHECK_S + 1


@dataclass(frozen=True)
class Kind:
    """One kind of request (or of index write a request causes).

    ``per_s``: how many a second, fleet-wide; per one: ``requests`` sent (pages; 0 for an
    index write, which is part of its table write's request), ``items`` read, read and
    write units. ``spread``: which partition-key values share the load — ``one`` (all on
    ``key``), ``stream`` (each stream's own key), ``worker`` (each worker's own key),
    ``member key`` (the member keys, evenly: ``Shape.keys``)."""

    name: str
    code: str
    operation: str  # the request as ``streamlease_dynamodb_requests_total`` labels it
    table: str
    key: str
    spread: str
    rate: str  # the rate in words
    per_s: Rate
    requests: Rate = _one
    items: Rate = _zero
    read_units: Rate = _zero
    write_units: Rate = _zero
    fast_per_s: Rate | None = None  # while the reconciler polls fast (hand-overs)


def _member_query(f: Shape) -> tuple[float, float]:
    """(requests, read units) of the leader's read of every member key: one Query per
    key, each of W / keys rows, one more row (the epoch high-water and layout items in
    ``MEMBER``, counted as a row each there: they are smaller) and, spread, the key's
    replica."""
    spread = f.keys > 1
    rows = (f.workers + 1 + spread) / f.keys  # + the high-water item (and the layout item)
    nbytes = rows * f.sizes.member_row + (f.sizes.replica if spread else 0)
    pages, units = paged_read_units(rows + spread, nbytes / (rows + spread), consistent=True)
    return f.keys * pages, f.keys * units


def _campaign_reads(f: Shape) -> tuple[float, float]:
    """Leader-lease reads a second: the successor's (consistent, every observe_s) and the
    calm ones of the other members that do not lead (once a lease, eventually
    consistent: ``LeaderLease.acquire``)."""
    return (min(1, f.workers - 1) / f.settings.observe_s,
            max(0, f.workers - 2) / (f.settings.lease_s + f.settings.observe_s))


def _campaign_read_units(f: Shape) -> float:
    """Read units per campaign read, averaged over the consistent and the calm ones."""
    urgent, calm = _campaign_reads(f)
    if not urgent + calm:
        return 0.0
    return (urgent * read_units(f.sizes.leader, True)
            + calm * read_units(f.sizes.leader, False)) / (urgent + calm)


def _audit(f: Shape) -> tuple[float, float]:
    return paged_read_units(f.per_worker, f.sizes.owner_entry, False, SCAN_PAGE)


def _sweep(f: Shape) -> tuple[float, float]:
    return paged_read_units(f.streams, f.sizes.stream, False, SCAN_PAGE)


def _moved(entry: int) -> float:
    """Write units of an index entry whose key changes: a delete and a put."""
    return INDEX_WRITES_PER_LEASE_WRITE * write_units(entry)


def _renewals(f: Shape) -> float:
    return 0.0 if f.first_interval else f.streams / f.settings.stream_renew_s


def _feed_shards(f: Shape) -> float:
    """DynamoDB Streams shards: about one per table partition; a partition holds 10 GB,
    so one shard until the table is that large."""
    return float(max(1, math.ceil(f.streams * f.sizes.stream / 10e9)))


def _feed_polls(f: Shape) -> float:
    return _feed_shards(f) / FEED_POLL_S if f.settings.change_feed else 0.0


KINDS: tuple[Kind, ...] = (
    # The worker's own row, conditioned on its epoch; early beats (a changed count, a
    # hand-over) are coalesced, and there are none at steady state.
    Kind("member heartbeat",
         "membership/row.py OwnRow._heartbeat; store/dynamodb/fleet.py heartbeat",
         "update_item", FLEET, MEMBER_KEYS, "member key", "W / heartbeat",
         per_s=lambda f: f.workers / f.settings.heartbeat_s,
         write_units=lambda f: write_units(f.sizes.member_row)),
    # The leader's consistent Query of every member key (one, Pk = MEMBER, until the fleet
    # passes STREAMLEASE_MEMBERS_PER_KEY rows a key), jittered 10 %: it is the fleet's only
    # watcher, and composes the bulletin from them.
    Kind("member read, leader (observe)",
         "membership/observe.py Watcher.observe_all; store/dynamodb/fleet.py roster",
         "query", FLEET, MEMBER_KEYS, "member key",
         "2 / observe_s (leader) x keys; reads all W rows",
         per_s=lambda f: 2 / f.settings.observe_s,
         requests=lambda f: _member_query(f)[0],
         items=lambda f: f.workers + 1.0 + (1 + f.keys if f.keys > 1 else 0),
         read_units=lambda f: _member_query(f)[1]),
    # Every other worker reads the bulletin: the leader's row, or its own key's copy once
    # spread; faster while the change feed is live, as its notices ride the bulletin.
    Kind("member read, others (leader's row)",
         "membership/observe.py Watcher._observe_leader; "
         "store/dynamodb/fleet.py member, replica",
         "get_item", FLEET, MEMBER_KEYS, "member key",
         f"(W - 1) / min(observe_s, {FEED_READ_S:g} s) with the change feed, else / "
         "observe_s; one item (its key's replica once spread), eventually consistent",
         per_s=lambda f: (f.workers - 1) / f.settings.leader_row_s,
         items=_one, read_units=lambda f: read_units(f.bulletin_bytes, False)),
    # After a notice for it (one per acquisition: the taker's offer) and while anyone
    # drains (each worker once a deploy), a member reads the leader's row faster, spread so
    # the fleet adds at most HANDOFF_READS_PER_S (none past a few hundred members).
    Kind("member read, hand-offs (leader's row)",
         "membership/observe.py Watcher.observe_loop, Listener.handoff_read_s", "get_item",
         FLEET, MEMBER_KEYS, "member key",
         f"({HANDOFF_READS_FOR_S:g} s x (acquisitions/s + W x drains/s x (W - 1))) x "
         f"(1 / max({HANDOFF_READ_S:g} s, (W - 1) / {HANDOFF_READS_PER_S:g}/s) - 1 / "
         "leader-row interval), with the change feed",
         per_s=lambda f: _handoff_reads_s(f),
         items=_one, read_units=lambda f: read_units(f.bulletin_bytes, False)),
    # Once the rows spread, a conditional PutItem of each heartbeat's bulletin per key.
    Kind("bulletin replicas",
         "membership/bulletin.py Publisher.replica_loop; store/dynamodb/fleet.py publish",
         "put_item", FLEET, MEMBER_KEYS, "member key", "keys / heartbeat once spread (leader)",
         per_s=lambda f: f.keys / f.settings.heartbeat_s if f.keys > 1 else 0.0,
         write_units=lambda f: write_units(f.sizes.replica)),
    # The successor the bulletin names reads the lease consistently; the other ACTIVE
    # workers calmly (Listener.campaign_urgent), while the leader's row shows it alive.
    Kind("leader campaign read", "leadership.py run; leader.py LeaderLease.acquire/_try",
         "get_item", FLEET, "LEADER (fleet)", "one",
         "1 / observe_s consistent + (W - 2) / (lease + observe_s) eventually consistent",
         per_s=lambda f: sum(_campaign_reads(f)),
         items=_one, read_units=_campaign_read_units),
    Kind("leader renewal", "leader.py LeaderLease._renew", "update_item", FLEET,
         "LEADER (fleet)", "one", "1 / heartbeat",
         per_s=lambda f: 1 / f.settings.heartbeat_s,
         write_units=lambda f: write_units(f.sizes.leader)),
    # A consistent Query of Pk = JOB every refresh_s (= heartbeat). Runs follow the jobs'
    # schedules, not the fleet, and are not counted.
    Kind("job list", "jobs.py JobRunner._refresh; store/dynamodb/jobs.py list_jobs", "query",
         FLEET, "JOB", "one", "1 / heartbeat (leader)",
         per_s=lambda f: 1 / f.settings.heartbeat_s,
         items=lambda f: float(f.settings.jobs),
         read_units=lambda f: read_units(f.settings.jobs * 200, True)),
    # None in a stream's first interval (``Shape.first_interval``).
    Kind("stream renewal", "heartbeat.py _renew_once; store/dynamodb/leases.py renew",
         "update_item", STREAMS, "each stream", "stream", "N / stream_renew",
         per_s=_renewals, write_units=lambda f: write_units(f.sizes.stream)),
    # A renewal changes the orphan index's range key: a delete and a put under STARTED.
    Kind("stream renewal: index entry moves", "store/schema.py (range key lease_expires_at_ms)",
         "-", STATE_INDEX, "STARTED", "one", "2 x renewals",
         per_s=_renewals, requests=_zero,
         write_units=lambda f: _moved(f.sizes.orphan_entry)),
    # Eventually consistent, 100 keys a request; a consistent GetItem follows only for an
    # item that looks changed.
    Kind("held items read (batched)", "watch.py HeldWatch.checks_loop; "
         "store/dynamodb/leases.py check_many", "batch_get_item", STREAMS, "each stream",
         "stream", "without the change feed: W / check x ceil(N / W / 100) requests",
         per_s=lambda f: 0.0 if f.settings.change_feed else f.workers / f.settings.stream_check_s,
         requests=lambda f: float(math.ceil(f.per_worker / BATCH_GET_KEYS)),
         items=lambda f: f.per_worker,
         read_units=lambda f: f.per_worker * read_units(f.sizes.stream, False)),
    # By every admitting worker, jittered 20 %; nothing found at steady state (the minimum
    # unit); every fast_poll_s while a peer drains or hands streams over. With the change
    # feed live every freed or new stream is offered, and an offer starts a cycle, so a
    # worker with nothing to take or give rests.
    Kind("orphan query", "intake.py Intake.plan; store/dynamodb/leases.py orphans", "query",
         STATE_INDEX, "STARTED", "one", "W / reconcile (x 12 with the change feed)",
         per_s=lambda f: f.workers / f.settings.orphan_query_s,
         read_units=lambda f: read_units(0, False),
         fast_per_s=lambda f: f.workers / f.settings.fast_poll_s),
    # Under STOPPED (lease still live); with the change feed live the holder is told.
    Kind("STOPPED query", "watch.py HeldWatch.stopped_loop; store/dynamodb/leases.py held_stopped",
         "query", STATE_INDEX, "STOPPED", "one", "W / heartbeat (none with the change feed)",
         per_s=lambda f: 0.0 if f.settings.change_feed else f.workers / f.settings.heartbeat_s,
         read_units=lambda f: read_units(0, False)),
    # Each worker under its own id, jittered 20 %: its held streams (and released ones
    # still naming it); a read of one follows only if it is unserved.
    Kind("self-audit", "audit.py SelfAudit.audit; store/dynamodb/leases.py owned_by", "query",
         OWNER_INDEX, "each worker id", "worker", "W / audit (1.6 x lease)",
         per_s=lambda f: f.workers / f.settings.audit_s,
         requests=lambda f: _audit(f)[0], items=lambda f: f.per_worker,
         read_units=lambda f: _audit(f)[1]),
    # The leader, jittered 20 %, 500 items a page.
    Kind("sweep Scan", "sweep.py Sweep.sweep; store/dynamodb/leases.py scan_pages", "scan",
         STREAMS, "every stream (Scan)", "stream",
         "1 / sweep (x 10 with the change feed; leader); reads all N items",
         per_s=lambda f: 1 / f.settings.sweep_every_s,
         requests=lambda f: _sweep(f)[0], items=lambda f: float(f.streams),
         read_units=lambda f: _sweep(f)[1]),
    # A rolling deploy moves every stream once (hand-overs for balance add more), live
    # (``handed_share``, every stream with the events-table output) or by a release and
    # an acquisition. Either way the item, its STARTED entry (new expiry) and its
    # owner-index entry (the fence) move once.
    Kind("hand-over offer", "handover.py Handing.hand; store/dynamodb/fleet.py offer",
         "update_item", FLEET, MEMBER_KEYS, "member key",
         "N x deploys a day / 86,400 x handed share (holder, into the taker's row)",
         per_s=_handed,
         write_units=lambda f: write_units(f.sizes.member_row + OFFER_BYTES)),
    Kind("hand-over item reads, holder",
         "handover.py Handing.hand; store/dynamodb/leases.py check", "get_item", STREAMS,
         "each stream", "stream",
         f"offers x (heartbeat / 2 / {OFFER_CHECK_S:g} s + 1): every {OFFER_CHECK_S:g} s "
         "until the take, after the taker's next heartbeat; consistent",
         per_s=lambda f: _handed(f) * _holder_reads(f),
         items=_one, read_units=lambda f: read_units(f.sizes.stream, True)),
    Kind("hand-over item read, taker", "handover.py Taking._take; store/dynamodb/leases.py check",
         "get_item", STREAMS, "each stream", "stream", "= offers; consistent",
         per_s=_handed, items=_one, read_units=lambda f: read_units(f.sizes.stream, True)),
    Kind("hand-over take", "handover.py Taking._take; store/dynamodb/leases.py take_handed",
         "update_item", STREAMS, "each stream", "stream", "= offers",
         per_s=_handed, write_units=lambda f: write_units(f.sizes.stream)),
    Kind("hand-over offer cleared", "handover.py Taking._act; store/dynamodb/fleet.py "
         "clear_offers", "update_item", FLEET, MEMBER_KEYS, "member key",
         "= offers (taker, its own row)", per_s=_handed,
         write_units=lambda f: write_units(f.sizes.member_row + OFFER_BYTES)),
    Kind("acquisition", "intake.py Intake.acquire; store/dynamodb/leases.py acquire",
         "update_item", STREAMS, "each stream", "stream",
         "N x deploys a day / 86,400 x (1 - handed share)",
         per_s=_released, write_units=lambda f: write_units(f.sizes.stream)),
    Kind("move: index entry moves", "store/schema.py", "-", STATE_INDEX, "STARTED",
         "one", "2 x (acquisitions + takes)", per_s=lambda f: f.churn, requests=_zero,
         write_units=lambda f: _moved(f.sizes.orphan_entry)),
    Kind("move: owner entry moves", "store/schema.py", "-", OWNER_INDEX,
         "each worker id", "worker", "2 x (acquisitions + takes)", per_s=lambda f: f.churn,
         requests=_zero, write_units=lambda f: _moved(f.sizes.owner_entry)),
    # Expiry 0; owner and fence kept. A live hand-over writes none: the take moves it.
    Kind("release", "release.py release; store/dynamodb/leases.py release", "update_item",
         STREAMS, "each stream", "stream", "= acquisitions", per_s=_released,
         write_units=lambda f: write_units(f.sizes.stream)),
    Kind("release: index entry moves", "store/schema.py", "-", STATE_INDEX, "STARTED", "one",
         "2 x releases", per_s=_released, requests=_zero,
         write_units=lambda f: _moved(f.sizes.orphan_entry)),
    # The leader alone polls each shard while idle (DynamoDB Streams allows five GetRecords
    # a second a shard, about two readers); billed apart, using no table capacity.
    Kind("change feed", "feed.py ChangeFeed._tail; store/dynamodb/changefeed.py poll",
         "get_records", STREAMS, "-", "one", "shards / 0.25 s (leader), with the change feed",
         per_s=_feed_polls),
    # Each shard it read records from, at most once a poll.
    Kind("change-feed checkpoint", "feed.py ChangeFeed._apply; "
         "store/dynamodb/feedcheckpoints.py save", "put_item", FLEET, "FEED", "one",
         "at most shards / 0.25 s (leader)",
         per_s=lambda f: min(_feed_polls(f), 2 * f.churn + _renewals(f)),
         write_units=lambda f: write_units(120)),
)

SPREAD: dict[str, Rate] = {"one": _one, "stream": lambda f: max(1.0, f.streams),
                           "worker": lambda f: max(1.0, f.workers),
                           "member key": lambda f: float(f.keys)}


@dataclass(frozen=True)
class Load:
    kind: Kind
    requests_s: float
    items_s: float
    read_units_s: float
    write_units_s: float
    fast_requests_s: float  # requests/s with every worker polling fast


def loads(shape: Shape, kinds: tuple[Kind, ...] = KINDS) -> list[Load]:
    out = []
    for k in kinds:
        per = k.per_s(shape)
        fast = k.fast_per_s(shape) if k.fast_per_s else per
        out.append(Load(k, per * k.requests(shape), per * k.items(shape),
                        per * k.read_units(shape), per * k.write_units(shape),
                        fast * k.requests(shape)))
    return out


@dataclass(frozen=True)
class KeyLoad:
    """One partition-key value's load (the busiest one where the load is spread)."""

    table: str
    key: str
    read_units_s: float
    write_units_s: float

    @property
    def read_share(self) -> float:
        return self.read_units_s / KEY_READ_LIMIT

    @property
    def write_share(self) -> float:
        return self.write_units_s / KEY_WRITE_LIMIT


def _totals(rows: Iterable[tuple[Any, float, float]]) -> dict[Any, tuple[float, float]]:
    """Pairs of figures summed by key, in the order the keys first appear."""
    out: dict[Any, tuple[float, float]] = {}
    for key, a, b in rows:
        x, y = out.get(key, (0.0, 0.0))
        out[key] = (x + a, y + b)
    return out


def key_loads(shape: Shape, kinds: tuple[Kind, ...] = KINDS) -> list[KeyLoad]:
    """Per partition-key value: spread loads divided over the keys that share them."""
    spread = [(x, x.kind, SPREAD[x.kind.spread](shape)) for x in loads(shape, kinds)
              if x.kind.key != "-"]
    found = _totals(((k.table, "each stream" if k.spread == "stream" else k.key),
                     x.read_units_s / over, x.write_units_s / over) for x, k, over in spread)
    return [KeyLoad(t, key, r, w) for (t, key), (r, w) in found.items()]


def limits(shape: Shape) -> list[tuple[str, float]]:
    """Every limit's use at this shape: (name, share of the limit), keys first."""
    out = []
    for k in key_loads(shape):
        out.append((f"{k.table} / {k.key} / reads", k.read_share))
        out.append((f"{k.table} / {k.key} / writes", k.write_share))
    for table, (r, w) in table_loads(shape).items():
        out.append((f"{table} / quota / reads", r / TABLE_QUOTA))
        out.append((f"{table} / quota / writes", w / TABLE_QUOTA))
    return out


def table_loads(shape: Shape) -> dict[str, tuple[float, float]]:
    return _totals((x.kind.table, x.read_units_s, x.write_units_s) for x in loads(shape))


def passes(name: str, share: float, settings: Settings) -> int | None:
    """The fewest streams (on full workers) at which limit ``name`` is used beyond
    ``share``; None if not below ``MAX_SEARCH``. Every rate grows with the fleet."""
    def over(n: int) -> bool:
        return dict(limits(Shape.at(n, settings))).get(name, 0.0) > share
    if not over(MAX_SEARCH):
        return None
    lo, hi = 1, MAX_SEARCH
    if over(lo):
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if over(mid) else (mid, hi)
    return hi


# -- results ----------------------------------------------------------------------------


def scale_figures(streams: int, settings: Settings) -> dict[str, Any]:
    shape = Shape.at(streams, settings)
    found = loads(shape)
    used = limits(shape)
    nearest = max(used, key=lambda u: u[1])
    reads = sum(x.read_units_s for x in found)
    writes = sum(x.write_units_s for x in found)
    member = sum(x.read_units_s for x in found if x.kind.name.startswith("member read"))
    month = (reads * PRICE_READ + writes * PRICE_WRITE) * SECONDS_PER_MONTH
    return {
        "streams": streams, "workers": shape.workers,
        "requests_per_s": round(sum(x.requests_s for x in found), 1),
        "items_read_per_s": round(sum(x.items_s for x in found), 1),
        "read_units_per_s": round(reads, 1), "write_units_per_s": round(writes, 1),
        "member_read_share_of_read_units": round(member / reads, 3) if reads else 0.0,
        "member_read_share_of_bill": round(member * PRICE_READ * SECONDS_PER_MONTH / month, 3)
        if month else 0.0,
        "upkeep_usd_per_month": round(month, 2),
        "upkeep_usd_per_1000_streams_month": round(month * 1000 / streams, 2),
        "kinds": {x.kind.name: {"requests_per_s": _r(x.requests_s),
                                "items_read_per_s": _r(x.items_s),
                                "read_units_per_s": _r(x.read_units_s),
                                "write_units_per_s": _r(x.write_units_s)}
                  for x in found},
        "keys": [{"table": k.table, "key": k.key, "read_units_per_s": _r(k.read_units_s),
                  "write_units_per_s": _r(k.write_units_s),
                  "read_share": _sig(k.read_share), "write_share": _sig(k.write_share)}
                 for k in key_loads(shape)],
        "tables": {t: {"read_units_per_s": _r(r), "write_units_per_s": _r(w)}
                   for t, (r, w) in table_loads(shape).items()},
        "nearest_limit": nearest[0], "nearest_limit_share": _sig(nearest[1]),
        "over_budget": sorted(name for name, share in used if share > BUDGET),
        "over_limit": sorted(name for name, share in used if share > 1.0),
    }


def limit_crossings(settings: Settings) -> list[dict[str, Any]]:
    """Each key and table limit: the streams at which it passes 50 % and 100 %, the first
    one first."""
    rows = []
    for name, _ in limits(Shape.at(1000, settings)):
        half, full = passes(name, BUDGET, settings), passes(name, 1.0, settings)
        rows.append({"limit": name, "kind": "quota" if "/ quota /" in name else "key",
                     "streams_at_50_percent": half, "streams_at_100_percent": full})
    return sorted(rows, key=lambda r: (r["streams_at_100_percent"] or MAX_SEARCH + 1,
                                       r["streams_at_50_percent"] or MAX_SEARCH + 1))


def streams_per_table(settings: Settings) -> tuple[int, str]:
    """The most streams with every partition-key value at or under ``BUDGET``, and the
    key that passes it first."""
    names = [name for name, _ in limits(Shape.at(1000, settings)) if "/ quota /" not in name]
    first = min((passes(n, BUDGET, settings) or MAX_SEARCH + 1, n) for n in names)
    return first[0] - 1, first[1]


def items_per_worker_minute(workers: int, settings: Settings) -> tuple[float, dict[str, float]]:
    """Control-plane items read per worker-minute, workers holding ``max_streams`` each."""
    shape = Shape(workers * settings.max_streams, workers, settings)
    by_kind = {x.kind.name: x.items_s * 60 / workers for x in loads(shape) if x.items_s}
    return sum(by_kind.values()), by_kind


def per_worker_read_growth(settings: Settings | None = None) -> dict[str, Any]:
    """Items read per worker-minute at 8 workers over that at 2, the same streams per
    worker (1.0: a worker's reads do not grow with the fleet). Modelled, not measured."""
    s = settings or Settings()
    two, two_by = items_per_worker_minute(2, s)
    eight, eight_by = items_per_worker_minute(8, s)
    return {"value": round(eight / two, 2), "modelled": True,
            "what": "control-plane items read per worker-minute at 8 workers / at 2, "
                    f"{s.max_streams} streams per worker, counted from the code",
            "items_per_worker_minute": {"2": round(two, 1), "8": round(eight, 1)},
            "by_kind": {k: {"2": round(two_by.get(k, 0.0), 1), "8": round(v, 1)}
                        for k, v in eight_by.items()}}


AGREE = 0.25  # measured within 25 % of the model's range


# Requests expected in a window below which seeing none agrees with the model: a Poisson
# count with this mean is 0 about one time in twenty (e^-3).
RARE = 3.0


def compare_measured(measured_per_1000: Mapping[str, float], shape: Shape,
                     window_s: float = 0.0) -> dict[str, Any]:
    """The scale run's requests/s per 1,000 held streams by operation against the model at
    the run's shape. The model's range runs from steady polling to every worker polling
    orphans fast (as it does while peers hand streams over). An operation the model
    expects so rarely in the run's ``window_s`` that seeing none is likelier than one in
    twenty (fewer than ``RARE`` expected: the sweep's Scan, a few pages every 300 s with
    the change feed) agrees when none was seen: the window is too short to tell."""
    # Requests/s by operation: (steady, with every worker polling fast).
    model = _totals((x.kind.operation, x.requests_s, x.fast_requests_s) for x in loads(shape)
                    if x.kind.operation != "-" and x.requests_s)
    rows: dict[str, Any] = {}
    for op in sorted(set(model) | set(measured_per_1000)):
        low, high = (v * 1000 / shape.streams for v in model.get(op, (0.0, 0.0)))
        got = measured_per_1000.get(op)
        rare = low * shape.streams / 1000 * window_s < RARE and not got
        agrees = rare or (got is not None and (1 - AGREE) * low <= got <= (1 + AGREE) * high)
        rows[op] = {"measured": got, "model": round(low, 3),
                    "model_with_fast_polling": round(high, 3),
                    "ratio": round(got / low, 2) if got is not None and low else None,
                    "agrees": agrees, **({"too_rare_for_the_window": True} if rare else {})}
    return {"per_1000_streams": rows, "agrees": all(r["agrees"] for r in rows.values()),
            "shape": {"streams": shape.streams, "workers": shape.workers,
                      "first_interval": shape.first_interval,
                      "churn_per_stream_minute": round(shape.churn / shape.streams * 60, 5)},
            "tolerance": AGREE}


# -- the measured inputs (the scale scenario) -------------------------------------------


@dataclass(frozen=True)
class CapacityInputs:
    """Rates measured by the scale scenario at default timings."""

    member_heartbeats_per_worker_s: float
    renewals_per_stream_minute: float  # the rate the model uses
    renewals_source: str  # where that rate comes from (measured, or the setting)
    renewals_measured_per_stream_minute: float
    acquisitions_per_stream_minute: float
    releases_per_stream_minute: float
    streams_per_worker: float  # held per worker in the run (amortises member heartbeats)
    index_writes_per_lease_write: int = INDEX_WRITES_PER_LEASE_WRITE
    # The run's shape and its requests/s by operation, for the comparison.
    streams: int = 0
    workers: int = 0
    requests_per_s_per_1000_streams: dict[str, float] = field(default_factory=dict)
    window_s: float = 0.0  # how long the requests were counted
    first_interval: bool = False  # the window ended before any stream's first renewal
    change_feed: bool = True  # every worker trusted the leader's change feed


def renewal_rate(measured_per_stream_minute: float, window_s: float,
                 renew_interval_s: float) -> tuple[float, str]:
    """The renewal rate to model with: the measured one if the window was long enough to
    see every stream renew about once, else the one the setting implies (a holder
    renews each stream once per interval, jittered by 10 %)."""
    configured = 60.0 / renew_interval_s
    if window_s >= 1.1 * renew_interval_s:
        return measured_per_stream_minute, f"measured over {window_s:.0f} s"
    return configured, (f"setting: 60 / STREAMLEASE_STREAM_RENEW_SECONDS ({renew_interval_s:g} s); "
                        f"the {window_s:.0f} s window is shorter than one renewal interval, so "
                        f"it measured {measured_per_stream_minute:.3f}")


def inputs_from_scale(section: Mapping[str, Any]) -> CapacityInputs:
    """The measured inputs from the scale scenario's section (``loadtest.scale_scenario``)."""
    rates = section.get("rates", {})
    renew_s = DEFAULT_CONFIG.stream_renew_s
    measured = rates.get("renewals_per_stream_minute", 0.0)
    renewals, source = renewal_rate(measured, section.get("window_measured_s", 0.0), renew_s)
    held = section.get("held_streams_in_window") or section["streams"]
    return CapacityInputs(
        member_heartbeats_per_worker_s=rates.get("member_heartbeats_per_worker_s", 0.0),
        renewals_per_stream_minute=renewals, renewals_source=source,
        renewals_measured_per_stream_minute=measured,
        acquisitions_per_stream_minute=rates.get("acquisitions_per_stream_minute", 0.0),
        releases_per_stream_minute=rates.get("releases_per_stream_minute", 0.0),
        streams_per_worker=held / section["workers"],
        streams=round(held), workers=int(section["workers"]),
        requests_per_s_per_1000_streams=dict(section.get("requests_per_s_per_1000_streams",
                                                         {})),
        window_s=float(section.get("window_measured_s", 0.0)),
        # No renewal in the window: every stream was still in its first interval (checked
        # every STREAM_CHECK_SECONDS, not yet renewed).
        first_interval=not measured, change_feed=bool(section.get("change_feed", True)))


def capacity_model(inputs: CapacityInputs | None = None,
                   settings: Settings | None = None) -> dict[str, Any]:
    """The model at defaults (every request kind, per key, at each of ``SCALES``), with
    the measured inputs beside it when a scale run gave them."""
    s = settings or Settings()
    per_table, first_key = streams_per_table(s)
    crossings = limit_crossings(s)
    sizes = Sizes.from_codecs()
    out: dict[str, Any] = {
        "settings": {**asdict(s), "observe_s": s.observe_s, "audit_s": s.audit_s,
                     "checks_per_renewal": s.checks_per_renewal},
        "item_bytes": asdict(sizes),
        "limits": {"key_read_units_per_s": KEY_READ_LIMIT,
                   "key_write_units_per_s": KEY_WRITE_LIMIT,
                   "table_quota_units_per_s": TABLE_QUOTA, "budget": BUDGET},
        "request_kinds": [{"name": k.name, "code": k.code, "operation": k.operation,
                           "table": k.table, "key": k.key, "rate": k.rate} for k in KINDS],
        "scales": {_label(n): scale_figures(n, s) for n in SCALES},
        "limit_crossings": crossings,
        "first_key_over_budget": first_key,
        "first_limit": next((c for c in crossings if c["streams_at_100_percent"]), None),
        "streams_per_table": per_table,
        "streams_per_table_with_daily_deploys": streams_per_table(replace(s, deploys_per_day=1))[0],
        "streams_per_table_with_hourly_deploys":
            streams_per_table(replace(s, deploys_per_day=24))[0],
        "per_worker_read_growth": per_worker_read_growth(s),
    }
    if inputs is not None:
        out["inputs"] = asdict(inputs)
        out.update(_measured_upkeep(inputs, s))
        if inputs.streams and inputs.workers and inputs.requests_per_s_per_1000_streams:
            # Every move is an acquisition or a take (both log ``lease.acquired``); the
            # moves with no release were made live.
            acquired = inputs.acquisitions_per_stream_minute
            handed = 1 - min(1.0, inputs.releases_per_stream_minute / acquired) \
                if acquired else 1.0
            shape = Shape(inputs.streams, inputs.workers,
                          replace(s, change_feed=inputs.change_feed, handed_share=handed),
                          first_interval=inputs.first_interval,
                          churn_per_stream_s=acquired / 60)
            out["measured_vs_model"] = compare_measured(inputs.requests_per_s_per_1000_streams,
                                                        shape, inputs.window_s)
    return out


def _measured_upkeep(inputs: CapacityInputs, s: Settings) -> dict[str, Any]:
    """Lease upkeep writes per held stream-minute from the measured rates: stream renewals
    plus member heartbeats spread over the streams a worker holds."""
    member = inputs.member_heartbeats_per_worker_s * 60 / inputs.streams_per_worker \
        if inputs.streams_per_worker else None
    return {
        "member_heartbeats_per_stream_minute": None if member is None else round(member, 4),
        "upkeep_writes_per_stream_minute": None if member is None
        else round(inputs.renewals_per_stream_minute + member, 4),
        "upkeep_writes_per_stream_minute_full_workers": round(
            inputs.renewals_per_stream_minute
            + inputs.member_heartbeats_per_worker_s * 60 / s.max_streams, 4),
    }


# -- text -------------------------------------------------------------------------------


def model_text(model: dict[str, Any]) -> str:
    """The model in markdown, for the report and docs/performance.md."""
    s = model["settings"]
    z = model["item_bytes"]
    scales = model["scales"]
    lines = [
        f"Counted from the code at the default settings (lease {s['lease_s']:g} s, member "
        f"heartbeat {s['heartbeat_s']:g} s, member reads every {s['observe_s']:g} s, reconcile "
        f"{s['reconcile_s']:g} s, sweep {s['sweep_s']:g} s, stream renewal "
        f"{s['stream_renew_s']:g} s, stream check {s['stream_check_s']:g} s, "
        f"{s['max_streams']} streams a worker, so W = N / {s['max_streams']} workers; "
        f"{s['deploys_per_day']:g} rolling deploy a day). Item sizes from the codecs: member "
        f"row {z['member_row']} B, stream item {z['stream']} B, leader lease {z['leader']} B, "
        f"orphan-index entry {z['orphan_entry']} B, owner-index entry {z['owner_entry']} B. "
        "Sink traffic (data plane) is not counted.",
        "",
        "| request | code | table / key | rate | " +
        " | ".join(f"{label} RU/s, WU/s" for label in scales) + " |",
        "|---|---|---|---|" + "---|" * len(scales),
    ]
    for kind in model["request_kinds"]:
        cells = []
        for fig in scales.values():
            k = fig["kinds"][kind["name"]]
            cells.append(f"{_q(k['read_units_per_s'])}, {_q(k['write_units_per_s'])}")
        op = "" if kind["operation"] == "-" else f" (`{kind['operation']}`)"
        lines.append(f"| {kind['name']}{op} | `{kind['code']}` | {kind['table']} / "
                     f"{kind['key']} | {kind['rate']} | " + " | ".join(cells) + " |")
    lines += ["", "With the change feed (the default), the leader's GetRecords are DynamoDB "
              "Streams reads: billed apart, and they use no table capacity.", "",
              "Per partition-key value (the busiest where a load is spread), as a share of "
              f"{KEY_READ_LIMIT:,.0f} read / {KEY_WRITE_LIMIT:,.0f} write units a second:", "",
              "| key | " + " | ".join(scales) + " | passes 50 % at | passes 100 % at |",
              "|---|" + "---|" * (len(scales) + 2)]
    crossing = {c["limit"]: c for c in model["limit_crossings"]}
    for key in next(iter(scales.values()))["keys"]:
        for side in ("read", "write"):
            shares = [next(k for k in fig["keys"] if (k["table"], k["key"]) ==
                           (key["table"], key["key"]))[f"{side}_share"]
                      for fig in scales.values()]
            if not any(shares):
                continue
            c = crossing.get(f"{key['table']} / {key['key']} / {side}s", {})
            lines.append(f"| {key['table']} / {key['key']}, {side}s | " +
                         " | ".join(_pct(x) for x in shares) +
                         f" | {_count(c.get('streams_at_50_percent'))} | "
                         f"{_count(c.get('streams_at_100_percent'))} |")
    lines += ["", "Per table or index, read / write units a second, as a share of the default "
              f"account quota of {TABLE_QUOTA:,.0f} each (adjustable):", "",
              "| table | " + " | ".join(scales) + " |", "|---|" + "---|" * len(scales)]
    for table in next(iter(scales.values()))["tables"]:
        cells = []
        for fig in scales.values():
            t = fig["tables"][table]
            r, w = t["read_units_per_s"], t["write_units_per_s"]
            cells.append(f"{_q(r)} / {_q(w)} ({_pct(max(r, w) / TABLE_QUOTA)})")
        lines.append(f"| {table} | " + " | ".join(cells) + " |")
    lines += ["", "| at | workers | requests/s | items read/s | read units/s | write units/s | "
              "member reads, of read units | upkeep $/month (per 1,000 streams) | "
              "nearest limit |", "|---|---|---|---|---|---|---|---|---|"]
    for label, fig in scales.items():
        lines.append(
            f"| {label} | {fig['workers']:,} | {_q(fig['requests_per_s'])} | "
            f"{_q(fig['items_read_per_s'])} | {_q(fig['read_units_per_s'])} | "
            f"{_q(fig['write_units_per_s'])} | {_pct(fig['member_read_share_of_read_units'])} | "
            f"{fig['upkeep_usd_per_month']:,.0f} ({fig['upkeep_usd_per_1000_streams_month']:,.2f})"
            f" | {fig['nearest_limit']}: {_pct(fig['nearest_limit_share'])} |")
    fl = model.get("first_limit") or {}
    growth = model["per_worker_read_growth"]
    lines += [
        "",
        f"**Streams per table at defaults: {_count(model['streams_per_table'])}** (every "
        f"partition-key value at or under {BUDGET:.0%} of its limit; the first past it: "
        f"{model['first_key_over_budget']}). The first limit reached: "
        f"{fl.get('limit', '-')} at {_count(fl.get('streams_at_100_percent'))} streams.",
        f"Control-plane items read per worker-minute grow {growth['value']:g}x from 2 to 8 "
        f"workers at {s['max_streams']} streams each (modelled: "
        f"{growth['items_per_worker_minute']['2']:,.0f} -> "
        f"{growth['items_per_worker_minute']['8']:,.0f}).",
    ]
    if "upkeep_writes_per_stream_minute_full_workers" in model:
        lines.append(
            "Lease upkeep writes per held stream-minute (measured member heartbeats over "
            f"{s['max_streams']} streams + renewals): "
            f"{model['upkeep_writes_per_stream_minute_full_workers']:.3f}.")
    cmp = model.get("measured_vs_model")
    if cmp:
        sh = cmp["shape"]
        lines += ["", f"Measured by the scale run against the model at its shape "
                  f"({sh['streams']:,} streams on {sh['workers']} workers"
                  f"{', within the first renewal interval' if sh['first_interval'] else ''}, "
                  f"{sh['churn_per_stream_minute']:g} acquisitions per stream-minute), "
                  "requests/s per 1,000 streams:", "",
                  "| request | measured | model | model, all polling fast | ratio | agrees |",
                  "|---|---|---|---|---|---|"]
        for op, row in cmp["per_1000_streams"].items():
            lines.append(f"| `{op}` | {_q(row['measured'])} | {row['model']:g} | "
                         f"{row['model_with_fast_polling']:g} | {_q(row['ratio'])} | "
                         f"{_agreement(row)} |")
    return "\n".join(lines)


def _agreement(row: Mapping[str, Any]) -> str:
    if row.get("too_rare_for_the_window"):
        return "yes (too rare to see in the window)"
    return "yes" if row["agrees"] else "**no**"


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 else f"{n // 1000}k"


def _r(value: float) -> float:
    return round(value, 3)


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _q(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _pct(share: float) -> str:
    pct = share * 100
    if share > 1:
        return f"**{pct:,.0f} %**"
    return "< 0.1 %" if pct < 0.1 else f"{pct:.2g} %" if pct < 10 else f"{pct:.0f} %"


def _count(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def main() -> None:
    parser = argparse.ArgumentParser(description="the capacity model at default settings")
    parser.add_argument("--json", action="store_true", help="the model as JSON")
    parser.add_argument("--results", help="a load-test results JSON: compare its scale run")
    args = parser.parse_args()
    inputs = None
    if args.results:
        with open(args.results) as f:
            result = json.load(f)
        inputs = inputs_from_scale(result["scale"])
    model = capacity_model(inputs)
    print(json.dumps(model, indent=2) if args.json else model_text(model))


if __name__ == "__main__":
    main()
