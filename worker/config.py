"""Worker configuration: the only module that reads the ``STREAMLEASE_*`` environment.

Every variable is validated before any I/O and every problem is reported at once in a
single ``ConfigError``; ``streamlease run`` turns that into exit code 2.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from worker.core.lease import LeaseTimings
from worker.errors import ConfigError

T = TypeVar("T")

DEFAULT_TABLE = "streamlease-streams"
DEFAULT_EVENTS_TABLE = "streamlease-events"


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    doc: str


# The documented knobs, in the order the README lists them. The first eleven are the
# CONTRACT's; the rest tune internals and have defaults that need no touching.
SETTINGS: tuple[Setting, ...] = (
    Setting("STREAMLEASE_TABLE", DEFAULT_TABLE, "streams table"),
    Setting("STREAMLEASE_EVENTS_TABLE", DEFAULT_EVENTS_TABLE, "sink table"),
    Setting("STREAMLEASE_WORKER_ID", "", "this worker's identity (ECS task id, else hostname-pid)"),
    Setting("STREAMLEASE_LEASE_SECONDS", "20", "lease time to live"),
    Setting("STREAMLEASE_HEARTBEAT_SECONDS", "5", "renewal interval; under a third of the lease"),
    Setting("STREAMLEASE_RECONCILE_SECONDS", "5", "orphan query interval, jittered +/-20 %"),
    Setting("STREAMLEASE_MAX_STREAMS", "100", "streams one worker holds at most"),
    Setting("STREAMLEASE_SHUTDOWN_SECONDS", "25", "budget for flush and release on SIGTERM"),
    Setting("STREAMLEASE_METRICS_PORT", "9108", "Prometheus /metrics port; 0 turns it off"),
    Setting("STREAMLEASE_ALLOWED_URLS", "wss://", "comma-separated URL prefixes a worker may dial"),
    Setting("STREAMLEASE_LOG_FORMAT", "json", "json or text"),
    Setting("STREAMLEASE_SKEW_MARGIN_SECONDS", "1",
            "clock skew tolerated between workers; takeover waits this long past expiry"),
    Setting("STREAMLEASE_SAFETY_MARGIN_SECONDS", "",
            "a holder stops writing this long before its lease could expire "
            "(default: a tenth of the lease)"),
    Setting("STREAMLEASE_SWEEP_SECONDS", "30",
            "interval of the scan for hand-written items without lease fields; "
            "1.2 x (sweep + reconcile) must stay under 60"),
    Setting("STREAMLEASE_ACQUIRE_PER_CYCLE", "10",
            "acquisitions one reconcile cycle tries at most"),
    Setting("STREAMLEASE_BATCH_MAX_MESSAGES", "200", "messages in one sink transaction at most"),
    Setting("STREAMLEASE_BATCH_MAX_SECONDS", "0.2", "longest a message waits before a flush"),
    Setting("STREAMLEASE_MAX_FRAME_BYTES", "262144", "largest upstream frame accepted"),
    Setting("STREAMLEASE_LOG_LEVEL", "INFO", "DEBUG, INFO, WARNING or ERROR"),
)
DEFAULTS = {s.name: s.default for s in SETTINGS}


@dataclass(frozen=True)
class WorkerConfig:
    table: str = DEFAULT_TABLE
    events_table: str = DEFAULT_EVENTS_TABLE
    worker_id: str | None = None  # None: resolved at start-up (ECS metadata, hostname-pid)
    timings: LeaseTimings = field(default_factory=lambda: LeaseTimings(20.0, 5.0, 1.0, 2.0))
    reconcile_s: float = 5.0
    max_streams: int = 100
    shutdown_s: float = 25.0
    metrics_port: int = 9108
    allowed_urls: tuple[str, ...] = ("wss://",)
    log_format: str = "json"
    log_level: str = "INFO"
    sweep_s: float = 30.0
    acquire_per_cycle: int = 10
    batch_max_messages: int = 200
    batch_max_s: float = 0.2
    max_frame_bytes: int = 262144

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerConfig:
        """Read and validate every setting; raise one ConfigError naming each bad one."""
        source = os.environ if env is None else env
        problems: list[str] = []

        def get(name: str) -> str:
            value = source.get(name, "")
            return value.strip() if value.strip() else DEFAULTS[name]

        def parse(name: str, conv: Callable[[str], T], check: Callable[[T], str | None],
                  fallback: T) -> T:
            raw = get(name)
            try:
                value = conv(raw)
            except ValueError:
                problems.append(f"{name}: cannot parse {raw!r}")
                return fallback
            problem = check(value)
            if problem:
                problems.append(f"{name}: {problem}, got {raw!r}")
                return fallback
            return value

        def seconds(name: str, fallback: float) -> float:
            return parse(name, float, _positive_finite, fallback)

        def count(name: str, fallback: int, low: int, high: int) -> int:
            return parse(name, int, _in_range(low, high), fallback)

        lease = seconds("STREAMLEASE_LEASE_SECONDS", 20.0)
        heartbeat = seconds("STREAMLEASE_HEARTBEAT_SECONDS", 5.0)
        skew = seconds("STREAMLEASE_SKEW_MARGIN_SECONDS", 1.0)
        safety_raw = source.get("STREAMLEASE_SAFETY_MARGIN_SECONDS", "").strip()
        safety = seconds("STREAMLEASE_SAFETY_MARGIN_SECONDS", 2.0) if safety_raw else lease / 10
        timings = LeaseTimings(lease, heartbeat, skew, safety)
        if not any(p.startswith(("STREAMLEASE_LEASE", "STREAMLEASE_HEARTBEAT",
                                 "STREAMLEASE_SKEW", "STREAMLEASE_SAFETY")) for p in problems):
            problems.extend(timings.problems())

        allowed = parse_prefixes(get("STREAMLEASE_ALLOWED_URLS"))
        if not allowed:
            problems.append("STREAMLEASE_ALLOWED_URLS: needs at least one URL prefix")
        for prefix in allowed:
            if not prefix.startswith(("ws://", "wss://")):
                problems.append(
                    f"STREAMLEASE_ALLOWED_URLS: prefix {prefix!r} must start with ws:// or wss://")

        log_format = get("STREAMLEASE_LOG_FORMAT").lower()
        if log_format not in ("json", "text"):
            problems.append(f"STREAMLEASE_LOG_FORMAT: must be json or text, got {log_format!r}")
        log_level = get("STREAMLEASE_LOG_LEVEL").upper()
        if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            problems.append(
                f"STREAMLEASE_LOG_LEVEL: must be DEBUG, INFO, WARNING or ERROR, got {log_level!r}")

        worker_id = source.get("STREAMLEASE_WORKER_ID", "").strip() or None
        if worker_id is not None and (len(worker_id) > 256 or not worker_id.isprintable()):
            problems.append("STREAMLEASE_WORKER_ID: must be 1-256 printable characters")

        table, events_table = _tables(source, problems)

        config = cls(
            table=table,
            events_table=events_table,
            worker_id=worker_id,
            timings=timings,
            reconcile_s=seconds("STREAMLEASE_RECONCILE_SECONDS", 5.0),
            max_streams=count("STREAMLEASE_MAX_STREAMS", 100, 1, 100_000),
            shutdown_s=seconds("STREAMLEASE_SHUTDOWN_SECONDS", 25.0),
            metrics_port=count("STREAMLEASE_METRICS_PORT", 9108, 0, 65535),
            allowed_urls=allowed,
            log_format=log_format,
            log_level=log_level,
            sweep_s=seconds("STREAMLEASE_SWEEP_SECONDS", 30.0),
            acquire_per_cycle=count("STREAMLEASE_ACQUIRE_PER_CYCLE", 10, 1, 10_000),
            batch_max_messages=count("STREAMLEASE_BATCH_MAX_MESSAGES", 200, 1, 1000),
            batch_max_s=seconds("STREAMLEASE_BATCH_MAX_SECONDS", 0.2),
            max_frame_bytes=count("STREAMLEASE_MAX_FRAME_BYTES", 262144, 1024, 300_000),
        )
        # Both intervals are jittered up to +20 %; a hand-written item must start within 60 s.
        if 1.2 * (config.sweep_s + config.reconcile_s) >= 60:
            problems.append(
                "STREAMLEASE_SWEEP_SECONDS: with its jitter plus one reconcile interval it "
                "must stay under 60 s, so hand-written items start within a minute; got "
                f"{config.sweep_s:g} + {config.reconcile_s:g}")
        if problems:
            raise ConfigError(problems)
        return config


def table_names(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """STREAMLEASE_TABLE and STREAMLEASE_EVENTS_TABLE alone (for ``ctl``); ConfigError."""
    problems: list[str] = []
    names = _tables(os.environ if env is None else env, problems)
    if problems:
        raise ConfigError(problems)
    return names


def allowed_prefixes(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """STREAMLEASE_ALLOWED_URLS as set, unvalidated; empty when unset (``ctl`` warnings)."""
    return parse_prefixes((os.environ if env is None else env).get("STREAMLEASE_ALLOWED_URLS", ""))


def parse_prefixes(raw: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _tables(source: Mapping[str, str], problems: list[str]) -> tuple[str, str]:
    names = []
    for var in ("STREAMLEASE_TABLE", "STREAMLEASE_EVENTS_TABLE"):
        name = source.get(var, "").strip() or DEFAULTS[var]
        problem = table_name_problem(name)
        if problem:
            problems.append(f"{var}: {problem}")
        names.append(name)
    return names[0], names[1]


def table_name_problem(name: str) -> str | None:
    """DynamoDB's table-name rule: 3-255 characters of ``[a-zA-Z0-9_.-]``."""
    if not 3 <= len(name) <= 255:
        return f"table name must be 3-255 characters, got {len(name)}"
    if any(not (c.isascii() and (c.isalnum() or c in "_.-")) for c in name):
        return f"table name {name!r} may only contain letters, digits, '_', '-' and '.'"
    return None


def _positive_finite(value: float) -> str | None:
    return None if math.isfinite(value) and value > 0 else "must be a positive number of seconds"


def _in_range(low: int, high: int) -> Callable[[int], str | None]:
    def check(value: int) -> str | None:
        return None if low <= value <= high else f"must be between {low} and {high}"
    return check


def default_worker_id() -> str:
    """``hostname-pid``: unique per process on one host."""
    return f"{socket.gethostname()}-{os.getpid()}"
