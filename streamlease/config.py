"""Worker configuration: the only module that reads the ``STREAMLEASE_*`` environment.

``SETTINGS`` is the one table of every knob: its name, its default as it would be written
in the environment, its type and bounds, and the line the documentation shows. Everything
else (``WorkerConfig``, ``ctl``, the terraform variables, the table in docs/configuration.md)
is checked against it by tests, so a default is written exactly once.

Every variable is validated before any I/O and every problem is reported at once in a
single ``ConfigError``; ``streamlease run`` turns that into exit code 2.
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamlease.core.backends import LeaderBackendChoice, parse_leader_backend
from streamlease.core.frames import MAX_SEQ
from streamlease.core.layout import MEMBERS_PER_KEY
from streamlease.core.lease import LeaseTimings, heartbeat_problems
from streamlease.core.profiles import (
    BUILTIN,
    BUILTIN_PROFILE,
    Profile,
    ProfileError,
    default_problem,
    parse_profiles,
    profile_format,
)
from streamlease.core.sinks import SinkSpec, parse_dead_letter, parse_sink
from streamlease.core.stream import stream_buffer_bytes
from streamlease.core.urls import AllowList, parse_allowed_urls
from streamlease.errors import ConfigError


@dataclass(frozen=True)
class Setting:
    """One environment variable: how to read it and what it means.

    ``default`` is the text an operator would write; ``""`` means "computed"
    (docs/configuration.md says how). ``parse`` turns text into a value or raises
    ``ValueError`` with the reason.
    """

    name: str
    attr: str  # the WorkerConfig attribute it fills
    default: str
    doc: str
    parse: Callable[[str], Any]
    secret: bool = False  # may hold credentials: never echoed in a message


def seconds(low: float, high: float) -> Callable[[str], float]:
    """Fractional seconds within ``[low, high]``: no interval that spins or overflows."""
    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or not low <= value <= high:
            raise ValueError(f"must be between {low:g} and {high:g} seconds")
        return value
    return parse


def count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}")
        return value
    return parse


def choice(*values: str, upper: bool = False) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.upper() if upper else text.lower()
        if value not in values:
            raise ValueError("must be " + ", ".join(values[:-1]) + " or " + values[-1])
        return value
    return parse


def table_name(text: str) -> str:
    problem = table_name_problem(text)
    if problem:
        raise ValueError(problem)
    return text


def worker_id(text: str) -> str:
    if len(text) > 256 or not text.isprintable():
        raise ValueError("must be 1-256 printable characters")
    return text


def ip_literal(text: str) -> str:
    """An IP address to bind to, written as one (no names: nothing is resolved)."""
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ValueError("must be an IP address such as 0.0.0.0, 127.0.0.1 or ::") from None


def read_profiles(path: str) -> dict[str, Profile]:
    """STREAMLEASE_PROFILES: the file read and every profile in it validated; ValueError
    listing every problem (the file's format comes from its name: ``.json``, ``.toml``)."""
    fmt = profile_format(path)
    if fmt is None:
        raise ValueError(f"{path!r}: the file name must end in .json or .toml")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(1_048_577)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path!r}: cannot read it: {type(exc).__name__}") from None
    if len(text) > 1_048_576:
        raise ValueError(f"{path!r}: larger than 1 MiB")
    try:
        return parse_profiles(text, fmt)
    except ProfileError as exc:
        # The problems quote the file's own names; the error is one line on stderr.
        raise ValueError(f"{path!r}: " + "; ".join(map(_printable, exc.problems))) from None


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def python_upstream(text: str) -> str:
    """STREAMLEASE_UPSTREAM: ``python:MODULE:ATTR`` (imported when the worker starts)."""
    kind, _, rest = text.partition(":")
    module, _, attr = rest.partition(":")
    names = [*module.split("."), attr]
    if kind != "python" or not all(n.isidentifier() for n in names):
        raise ValueError("must be python:MODULE:ATTR (a module path and an attribute name)")
    return text


# The member lease's default ceiling: a worker killed without SIGTERM is found dead about
# this long after its last heartbeat, and its streams deliver again within 10 s
# (docs/configuration.md, Choosing the member lease).
MEMBER_LEASE_S = 5.0

# The documented knobs, in the order docs/configuration.md lists them: docs/contract.md's
# first, then the ones that tune internals and need no touching.
SETTINGS: tuple[Setting, ...] = (
    Setting("STREAMLEASE_TABLE", "table", "streamlease-streams", "streams table", table_name),
    Setting("STREAMLEASE_EVENTS_TABLE", "events_table", "streamlease-events", "sink table",
            table_name),
    Setting("STREAMLEASE_WORKER_ID", "worker_id", "",
            "this worker's identity (ECS task id, else hostname-pid)", worker_id),
    Setting("STREAMLEASE_LEASE_SECONDS", "lease_s", "20", "lease time to live",
            seconds(0.05, 3600)),
    Setting("STREAMLEASE_HEARTBEAT_SECONDS", "heartbeat_s", "5",
            "renewal interval; under a third of the lease", seconds(0.01, 1200)),
    Setting("STREAMLEASE_RECONCILE_SECONDS", "reconcile_s", "5",
            "orphan query interval, jittered +/-20 %", seconds(0.01, 300)),
    Setting("STREAMLEASE_MAX_STREAMS", "max_streams", "100", "streams one worker holds at most",
            count(1, 100_000)),
    Setting("STREAMLEASE_SHUTDOWN_SECONDS", "shutdown_s", "25",
            "budget for flush and release on SIGTERM", seconds(0.1, 3600)),
    Setting("STREAMLEASE_METRICS_PORT", "metrics_port", "9108",
            "Prometheus /metrics port; 0 turns it off", count(0, 65535)),
    Setting("STREAMLEASE_METRICS_ADDRESS", "metrics_address", "0.0.0.0",
            "IP address /metrics and the health endpoints listen on", ip_literal),
    Setting("STREAMLEASE_ALLOWED_URLS", "allowed_urls", "wss://",
            "comma-separated upstreams a worker may dial, matched on scheme, host, port "
            "and path", parse_allowed_urls),
    Setting("STREAMLEASE_FLEET_TABLE", "fleet_table", "streamlease-fleet",
            "fleet table (members, leader, jobs)", table_name),
    Setting("STREAMLEASE_LOG_FORMAT", "log_format", "json", "json or text",
            choice("json", "text")),
    Setting("STREAMLEASE_SKEW_MARGIN_SECONDS", "skew_margin_s", "1",
            "clock skew tolerated between workers; takeover waits this long past expiry",
            seconds(0.001, 3600)),
    Setting("STREAMLEASE_SAFETY_MARGIN_SECONDS", "safety_margin_s", "",
            "a holder stops writing this long before its lease could expire "
            "(default: a tenth of the member lease)", seconds(0.001, 3600)),
    Setting("STREAMLEASE_MEMBER_LEASE_SECONDS", "member_lease_s", "",
            "a member's lease (and the fleet leader lease): a worker whose heartbeat has not "
            "moved for this long is declared dead and its streams are taken over (default: "
            f"the smaller of {MEMBER_LEASE_S:g} s and STREAMLEASE_LEASE_SECONDS)",
            seconds(0.05, 3600)),
    Setting("STREAMLEASE_MEMBER_HEARTBEAT_SECONDS", "member_heartbeat_s", "",
            "member heartbeat interval; under a third of the member lease (default: the "
            "smaller of STREAMLEASE_HEARTBEAT_SECONDS and a quarter of the member lease)",
            seconds(0.01, 1200)),
    Setting("STREAMLEASE_SWEEP_SECONDS", "sweep_s", "30",
            "interval of the scan for hand-written items without lease fields; "
            "1.2 x (sweep + reconcile) must stay under 60", seconds(0.1, 60)),
    Setting("STREAMLEASE_ACQUIRE_PER_CYCLE", "acquire_per_cycle", "10",
            "acquisitions one reconcile cycle tries at most", count(1, 10_000)),
    Setting("STREAMLEASE_BATCH_MAX_MESSAGES", "batch_max_messages", "200",
            "messages in one sink transaction at most", count(1, 1000)),
    # The latency bound of every sink: a slow stream's batch grows for this long, so at
    # 1 msg/s a DynamoDB write carries 5 messages instead of one, with half a second to spare
    # for arrival jitter (4 a write would miss $1.50 a stream-month; docs/performance.md,
    # Batching). A batch that hits the message or byte cap is written sooner.
    Setting("STREAMLEASE_BATCH_MAX_SECONDS", "batch_max_s", "4.5",
            "longest a message waits before a flush (the sinks' latency bound)",
            seconds(0.01, 60)),
    Setting("STREAMLEASE_EVENTS_TTL_SECONDS", "events_ttl_s", "0",
            "events items expire this long after they were written (DynamoDB TTL on "
            "expires_at); 0: never", count(0, 315_360_000)),
    Setting("STREAMLEASE_MAX_FRAME_BYTES", "max_frame_bytes", "262144",
            "largest upstream frame accepted", count(1024, 300_000)),
    Setting("STREAMLEASE_LOG_LEVEL", "log_level", "INFO", "DEBUG, INFO, WARNING or ERROR",
            choice("DEBUG", "INFO", "WARNING", "ERROR", upper=True)),
    Setting("STREAMLEASE_STREAM_LEASE_SECONDS", "stream_lease_s", "14400",
            "time to live of each stream's own lease (the safety net under membership)",
            seconds(0.1, 86400)),
    Setting("STREAMLEASE_STREAM_RENEW_SECONDS", "stream_renew_s", "",
            "how often a holder renews a stream's lease; at most a third of it "
            "(default: a third of STREAMLEASE_STREAM_LEASE_SECONDS)",
            seconds(0.03, 28800)),
    Setting("STREAMLEASE_MIN_HOLD_SECONDS", "min_hold_s", "",
            "a stream is never handed over for balance sooner after it was acquired "
            "(default: 1.5 x the member lease)", seconds(0, 86400)),
    Setting("STREAMLEASE_FLEET_VIEW", "fleet_view", "leader",
            "leader: members read only the fleet leader's row and plan from its bulletin "
            "(reads flat in fleet size); all: every member reads every member row",
            choice("leader", "all")),
    Setting("STREAMLEASE_MEMBERS_PER_KEY", "members_per_key", str(MEMBERS_PER_KEY),
            "member rows per partition key before the fleet leader spreads them over more "
            "keys (each key then also holds a copy of the leader's bulletin)",
            count(1, 100_000)),
    Setting("STREAMLEASE_CHANGE_FEED", "change_feed", "on",
            "on: the fleet leader tails the streams table's DynamoDB stream (where the table "
            "has one) and tells holders of changes; off: the fleet polls for them",
            choice("on", "off")),
    Setting("STREAMLEASE_LEADER_BACKEND", "leader_backend", "dynamodb",
            "where the fleet leader lease lives: dynamodb (the fleet table), "
            "redis://host:port/db or mongodb://HOST/DB", parse_leader_backend, secret=True),
    Setting("STREAMLEASE_JOB_GRACE_SECONDS", "job_grace_s", "10",
            "a job stopped for its timeout, a lost lease or a shutdown gets SIGTERM, then "
            "SIGKILL this long after", seconds(0.1, 600)),
    Setting("STREAMLEASE_STREAM_CHECK_SECONDS", "stream_check_s", "60",
            "how often a worker reads every held item in batches while the change feed is "
            "not live (ws_url changes, STOPPED, revocation)",
            seconds(0.01, 3600)),
    # A refused legitimate jump stalls a stream visibly (last_error) and recoverably (raise
    # the limit; nothing was written), while an accepted poisoned seq stops it for good
    # (last_seq never decreases): a billion covers a week's outage at 1,600 msg/s and
    # refuses 2**63-1, nanosecond or millisecond timestamps used as seqs.
    Setting("STREAMLEASE_MAX_SEQ_JUMP", "max_seq_jump", "1000000000",
            "largest forward jump of seq over the highest received (on a connection's first "
            "frame: over from_seq - 1); a larger one is refused as malformed",
            count(1, MAX_SEQ)),
    Setting("STREAMLEASE_STALL_SECONDS", "stall_s", "60",
            "a stream that receives frames but can deliver none of them for this long "
            "reports it (last_error, streamlease_stalled_streams)", seconds(1, 86400)),
    # Half the default 1 GiB task: the rest is the interpreter, the DynamoDB client and
    # requests in flight (an idle worker is about 65 MB resident).
    Setting("STREAMLEASE_SINK", "sink", "dynamodb",
            "where messages go: dynamodb (the events table), postgres://..., "
            "mongodb://HOST/DB.COLLECTION, kinesis://NAME, sqs://NAME, s3://BUCKET/PREFIX, "
            "http(s)://..., file:///DIR, stdout or python:MODULE:ATTR", parse_sink,
            secret=True),
    Setting("STREAMLEASE_PROCESS_MAX_ATTEMPTS", "process_max_attempts", "5",
            "attempts at one batch before it goes to the dead-letter sink (or, without one, "
            "the stream stops here with last_error set)", count(1, 1000)),
    Setting("STREAMLEASE_DEAD_LETTER", "dead_letter", "",
            "a sink URL for batches that failed every attempt (default: none)",
            parse_dead_letter, secret=True),
    Setting("STREAMLEASE_PROFILES", "profiles", "",
            "a JSON or TOML file of upstream profiles (docs/profiles.md); default: only the "
            "built-in streamlease profile", read_profiles),
    Setting("STREAMLEASE_DEFAULT_PROFILE", "default_profile", BUILTIN,
            "the profile for stream items that name none", str),
    Setting("STREAMLEASE_UPSTREAM", "upstream", "",
            "python:MODULE:ATTR: your own upstream object for every stream, instead of "
            "profiles (default: profiles)", python_upstream),
    Setting("STREAMLEASE_BUFFER_BUDGET_BYTES", "buffer_budget_bytes", "536870912",
            "bytes all held streams may buffer at most; STREAMLEASE_MAX_STREAMS x one "
            "stream's worst case (from STREAMLEASE_MAX_FRAME_BYTES) must fit in it",
            count(2**20, 2**40)),
)
BY_NAME = {s.name: s for s in SETTINGS}
DEFAULTS = {s.name: s.default for s in SETTINGS}


@dataclass(frozen=True)
class WorkerConfig:
    """Validated settings. Build it with ``from_env`` (``from_env({})`` for the defaults)."""

    table: str
    events_table: str
    fleet_table: str
    worker_id: str | None  # None: resolved at start-up (ECS metadata, hostname-pid)
    timings: LeaseTimings  # the member lease: MEMBER_LEASE, MEMBER_HEARTBEAT, the margins
    lease_s: float  # STREAMLEASE_LEASE_SECONDS: caps the member lease; the self-audit's scale
    reconcile_s: float
    max_streams: int
    shutdown_s: float
    metrics_port: int
    metrics_address: str
    allowed_urls: AllowList
    log_format: str
    log_level: str
    sweep_s: float
    acquire_per_cycle: int
    batch_max_messages: int
    batch_max_s: float
    events_ttl_s: int
    max_frame_bytes: int
    stream_lease_s: float
    stream_renew_s: float
    stream_check_s: float
    min_hold_s: float
    fleet_view: str  # "leader" (plan from the leader's bulletin) or "all" (read every row)
    members_per_key: int  # member rows per key before the layout spreads (core.layout)
    change_feed: str  # "on" (the leader tails the streams table's stream) or "off"
    leader_backend: LeaderBackendChoice  # "dynamodb", or where Redis or MongoDB is
    job_grace_s: float
    max_seq_jump: int
    stall_s: float
    buffer_budget_bytes: int
    sink: SinkSpec
    process_max_attempts: int
    dead_letter: SinkSpec | None
    profiles: Mapping[str, Profile] | None  # None: only the built-in profile
    default_profile: str
    upstream: str | None  # python:MODULE:ATTR

    @property
    def all_profiles(self) -> Mapping[str, Profile]:
        return self.profiles or {BUILTIN: BUILTIN_PROFILE}

    @property
    def stream_timings(self) -> LeaseTimings:
        """Each stream's own lease: renewed every ``stream_renew_s``; the holder's local
        deadline and the takeover rule use the same margins as the member lease."""
        t = self.timings
        return LeaseTimings(self.stream_lease_s, self.stream_renew_s, t.skew_margin_s,
                            t.safety_margin_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerConfig:
        """Read and validate every setting; raise one ConfigError naming each bad one."""
        values, problems = read_settings(SETTINGS, os.environ if env is None else env)
        if problems:
            raise ConfigError(problems)
        lease, heartbeat = values["lease_s"], values.pop("heartbeat_s")
        # The contract's rule on its own lease and heartbeat, which cap the member's.
        problems.extend(heartbeat_problems(lease, heartbeat, "STREAMLEASE_HEARTBEAT_SECONDS"))
        member_lease, member_heartbeat = member_lease_and_heartbeat(
            lease, heartbeat, values.pop("member_lease_s"), values.pop("member_heartbeat_s"))
        safety = values.pop("safety_margin_s")
        timings = LeaseTimings(member_lease, member_heartbeat, values.pop("skew_margin_s"),
                               member_lease / 10 if safety is None else safety)
        if values["min_hold_s"] is None:
            values["min_hold_s"] = min_hold_for(member_lease)
        if values["stream_renew_s"] is None:
            values["stream_renew_s"] = stream_renew_for(values["stream_lease_s"])
        problems.extend(timings.problems("STREAMLEASE_MEMBER_LEASE_SECONDS",
                                         "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS"))
        # Both intervals are jittered up to +20 %; a hand-written item must start within 60 s.
        if 1.2 * (values["sweep_s"] + values["reconcile_s"]) >= 60:
            problems.append(
                "STREAMLEASE_SWEEP_SECONDS: with its jitter plus one reconcile interval it "
                "must stay under 60 s, so hand-written items start within a minute; got "
                f"{values['sweep_s']:g} + {values['reconcile_s']:g}")
        problems.extend(stream_timing_problems(values, timings))
        if values["profiles"] is not None or values["default_profile"] != BUILTIN:
            missing = default_problem(values["profiles"] or {BUILTIN: BUILTIN_PROFILE},
                                      values["default_profile"])
            if missing:
                problems.append(f"STREAMLEASE_DEFAULT_PROFILE: {missing}")
        problems.extend(buffer_problems(values["max_streams"], values["max_frame_bytes"],
                                        values["buffer_budget_bytes"]))
        if problems:
            raise ConfigError(problems)
        return cls(timings=timings, **values)


def member_lease_and_heartbeat(lease_s: float, heartbeat_s: float, member_lease_s: float | None,
                               member_heartbeat_s: float | None) -> tuple[float, float]:
    """The member lease and heartbeat: as set, or else the smaller of ``MEMBER_LEASE_S`` and
    STREAMLEASE_LEASE_SECONDS, and the smaller of STREAMLEASE_HEARTBEAT_SECONDS and a
    quarter of the member lease (5 s and 1.25 s at the defaults; a fleet run with a 2 s lease
    and a 0.5 s heartbeat keeps both)."""
    member_lease = min(MEMBER_LEASE_S, lease_s) if member_lease_s is None else member_lease_s
    member_heartbeat = min(heartbeat_s, member_lease / 4) if member_heartbeat_s is None \
        else member_heartbeat_s
    return member_lease, member_heartbeat


def min_hold_for(lease_s: float) -> float:
    """STREAMLEASE_MIN_HOLD_SECONDS when unset: one and a half member leases (7.5 s at the
    5 s default). Rebalancing runs on the lease's time scale (member rows, takeovers,
    shed pauses), so with a short lease a new member gets streams seconds after it joins,
    not after a fixed half minute (docs/configuration.md, Defaults that follow the lease)."""
    return 1.5 * lease_s


def stream_renew_for(stream_lease_s: float) -> float:
    """The default stream renewal interval: a third of the stream lease, so a renewal can
    fail twice and the third still lands before the lease lapses."""
    return stream_lease_s / 3


def stream_timing_problems(values: Mapping[str, Any], member: LeaseTimings) -> list[str]:
    """The stream lease must outlast the member lease (a live member's streams never
    expire under it) and get three renewals and one check-in per renewal interval."""
    lease, renew, check = values["stream_lease_s"], values["stream_renew_s"], \
        values["stream_check_s"]
    found = []
    if lease < member.lease_s:
        found.append(f"STREAMLEASE_STREAM_LEASE_SECONDS: must be at least the member lease "
                     f"({member.lease_s:g}), got {lease:g}")
    if renew > lease / 3:
        found.append(f"STREAMLEASE_STREAM_RENEW_SECONDS: must be at most a third of the stream "
                     f"lease ({lease:g}/3 = {lease / 3:g}), got {renew:g}")
    if check > renew:
        found.append(f"STREAMLEASE_STREAM_CHECK_SECONDS: must be at most the renewal interval "
                     f"({renew:g}), got {check:g}")
    if member.skew_margin_s + member.safety_margin_s >= lease - renew:
        found.append("STREAMLEASE_STREAM_LEASE_SECONDS: minus the renewal interval it must "
                     "exceed the skew and safety margins, or a renewed stream could look "
                     "expired to a peer")
    return found


def buffer_problems(max_streams: int, max_frame_bytes: int, budget: int) -> list[str]:
    """Memory is bounded per task, not per stream: every held stream may fill its buffers
    at once (``streamlease.core.stream.stream_buffer_bytes``)."""
    per_stream = stream_buffer_bytes(max_frame_bytes)
    need = max_streams * per_stream
    if need <= budget:
        return []
    return [f"STREAMLEASE_BUFFER_BUDGET_BYTES: STREAMLEASE_MAX_STREAMS x the buffers one stream "
            f"may fill at STREAMLEASE_MAX_FRAME_BYTES={max_frame_bytes} is {max_streams} x "
            f"{per_stream} = {need} bytes, over the budget of {budget}: lower "
            "STREAMLEASE_MAX_STREAMS or STREAMLEASE_MAX_FRAME_BYTES, or raise "
            "STREAMLEASE_BUFFER_BUDGET_BYTES (and the task's memory)"]


def read_settings(settings: tuple[Setting, ...],
                  source: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Parse each setting (blank means default; a blank computed default gives None);
    every problem as ``NAME: reason, got 'text'``."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    for setting in settings:
        text = source.get(setting.name, "").strip() or setting.default
        if not text:
            values[setting.attr] = None
            continue
        try:
            values[setting.attr] = setting.parse(text)
        except ValueError as exc:
            reason = str(exc) if _own_message(exc) else "cannot parse it"
            shown = "" if setting.secret else f", got {text!r}"
            problems.append(f"{setting.name}: {reason}{shown}")
            values[setting.attr] = None
    return values, problems


def _own_message(exc: ValueError) -> bool:
    """A reason this module wrote (not int()/float()'s own wording)."""
    text = str(exc)
    return bool(text) and not text.startswith(("could not convert", "invalid literal"))


def _alone(names: tuple[str, ...], env: Mapping[str, str] | None) -> list[Any]:
    """Some settings alone, in the order named (for ``ctl``, which needs only a few);
    ConfigError if one is bad."""
    values, problems = read_settings(tuple(BY_NAME[n] for n in names),
                                     os.environ if env is None else env)
    if problems:
        raise ConfigError(problems)
    return [values[BY_NAME[n].attr] for n in names]


def setting_value(name: str, env: Mapping[str, str] | None = None) -> Any:
    """One setting alone; ConfigError if bad."""
    return _alone((name,), env)[0]


def member_heartbeat_value(env: Mapping[str, str] | None = None) -> float:
    """The member heartbeat interval alone (for ``ctl members``); ConfigError if bad."""
    return member_lease_and_heartbeat(*_alone(
        ("STREAMLEASE_LEASE_SECONDS", "STREAMLEASE_HEARTBEAT_SECONDS",
         "STREAMLEASE_MEMBER_LEASE_SECONDS", "STREAMLEASE_MEMBER_HEARTBEAT_SECONDS"), env))[1]


def table_names(env: Mapping[str, str] | None = None) -> tuple[str, str, str]:
    """The streams, events and fleet table names alone; ConfigError if one is bad."""
    streams, events, fleet = _alone(
        ("STREAMLEASE_TABLE", "STREAMLEASE_EVENTS_TABLE", "STREAMLEASE_FLEET_TABLE"), env)
    return streams, events, fleet


def allowed_prefixes(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """STREAMLEASE_ALLOWED_URLS as set, unvalidated; empty when unset (``ctl`` warnings)."""
    raw = (os.environ if env is None else env).get("STREAMLEASE_ALLOWED_URLS", "")
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def table_name_problem(name: str) -> str | None:
    """DynamoDB's table-name rule: 3-255 characters of ``[a-zA-Z0-9_.-]``."""
    if not 3 <= len(name) <= 255:
        return f"table name must be 3-255 characters, got {len(name)}"
    if any(not (c.isascii() and (c.isalnum() or c in "_.-")) for c in name):
        return f"table name {name!r} may only contain letters, digits, '_', '-' and '.'"
    return None


def default_worker_id() -> str:
    """``hostname-pid``: unique per process on one host."""
    return f"{socket.gethostname()}-{os.getpid()}"
