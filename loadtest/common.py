"""Shared plumbing for the benchmarks: local servers and workers as child processes.

Every child the load test starts goes through here (``Server``, ``worker_child``,
``death_signal`` for ``asyncio.create_subprocess_exec``), as ``make run`` starts its own
(``streamlease.dev.procs``): in a session of its own and, on Linux, with
``PR_SET_PDEATHSIG``, so a load test killed outright takes its children with it. ``STOP``
turns SIGTERM, SIGINT and SIGHUP into an orderly stop (``until_stopped``), and
``stop_children`` stops whatever is still running at the end, workers first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from streamlease.dev import local_aws_env
from streamlease.dev.demo import StopRequest
from streamlease.dev.procs import Child, _death_signal, stop_all

T = TypeVar("T")

DEV_COMMAND = ("-m", "streamlease", "dev")
SERVER_DEATH_SIGNAL = signal.SIGTERM
# The leases live in the embedded DynamoDB, which stops at the same moment: a draining
# worker would only retry against a closed port (as in ``make run``).
WORKER_DEATH_SIGNAL = signal.SIGKILL
WORKER_STOP_S = 15.0  # the scenarios' STREAMLEASE_SHUTDOWN_SECONDS (10) plus a margin
SERVER_STOP_S = 5.0

STOP = StopRequest()
"""Why this load test stops early; ``make loadtest`` and ``make nemesis`` install it for
SIGTERM, SIGINT and SIGHUP."""

PROFILES: dict[str, dict[str, Any]] = {
    # Sized under the embedded DynamoDB's ~250 writes/s: 24 streams x ~2 sink
    # transactions a second, plus member heartbeats and queries.
    "small": {"streams": 24, "rate": 20.0, "workers": 3, "lease": 2.0, "heartbeat": 0.5,
              "reconcile": 0.5, "skew": 0.3, "settle": 8.0, "gap": 6.0, "rounds": 2},
    # For real DynamoDB (or a patient run on the embedded one).
    "large": {"streams": 200, "rate": 10.0, "workers": 6, "lease": 6.0, "heartbeat": 1.5,
              "reconcile": 1.5, "skew": 0.5, "settle": 20.0, "gap": 15.0, "rounds": 3},
}


def timing_env(p: dict[str, Any]) -> dict[str, str]:
    """A profile's timings for the workers (the member lease, heartbeat, reconcile)."""
    return {"STREAMLEASE_LEASE_SECONDS": str(p["lease"]),
            "STREAMLEASE_HEARTBEAT_SECONDS": str(p["heartbeat"]),
            "STREAMLEASE_RECONCILE_SECONDS": str(p["reconcile"]),
            "STREAMLEASE_SKEW_MARGIN_SECONDS": str(p["skew"]),
            # Scaled with the lease like the rest (the default is 1.5 x its 20 s lease).
            "STREAMLEASE_MIN_HOLD_SECONDS": str(1.5 * p["lease"]),
            "STREAMLEASE_BATCH_MAX_SECONDS": "0.5",
            "STREAMLEASE_SHUTDOWN_SECONDS": "10"}


class Tables(NamedTuple):
    """A run's streams, events and fleet tables, fresh names each time."""

    streams: str
    events: str
    fleet: str

    @classmethod
    def fresh(cls, prefix: str) -> Tables:
        suffix = uuid.uuid4().hex[:8]
        return cls(f"{prefix}-s-{suffix}", f"{prefix}-e-{suffix}", f"{prefix}-f-{suffix}")

    def env(self) -> dict[str, str]:
        """What points a worker (or ``streamlease ctl``) at these tables."""
        return {"STREAMLEASE_TABLE": self.streams, "STREAMLEASE_EVENTS_TABLE": self.events,
                "STREAMLEASE_FLEET_TABLE": self.fleet}

_children: list[tuple[Child, bool]] = []  # (child, is a server), in start order


def _track(child: Child, *, server: bool) -> None:
    _children[:] = [(c, s) for c, s in _children if c.alive()]
    _children.append((child, server))


def death_signal(sig: int = WORKER_DEATH_SIGNAL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for children started otherwise (``asyncio.create_subprocess_exec``):
    ``sig`` to the child when this process dies (Linux; None elsewhere). Start them from
    the main thread (the event loop's)."""
    return _death_signal(sig)


class Server(Child):
    """``streamlease dev ...`` in a child process; ``url`` is what it printed. ``command``
    runs another module with the same arguments (``loadtest.request_count``)."""

    def __init__(self, *args: str, command: Sequence[str] = DEV_COMMAND) -> None:
        super().__init__(f"dev {args[0]}", [sys.executable, *command, *args], os.environ,
                         death_signal=SERVER_DEATH_SIGNAL)
        _track(self, server=True)  # stopped at the end even if it never says where it listens
        self.url = self.listening_url(stop=lambda: STOP.requested)


def worker_child(name: str, argv: list[str], env: Mapping[str, str], log: Path) -> Child:
    """A worker process, stdout and stderr into ``log``."""
    child = Child(name, argv, env, log, death_signal=WORKER_DEATH_SIGNAL, capture=False)
    child.close()  # the worker has its own descriptor of the log
    _track(child, server=False)
    return child


def stop_children() -> None:
    """Stop every child still running: the workers (SIGTERM, SIGKILL after
    WORKER_STOP_S), then the servers, last started first. Safe to call more than once."""
    alive = [(c, s) for c, s in _children if c.alive()]
    _children.clear()
    try:
        stop_all([c for c, s in alive if not s], signal.SIGTERM, WORKER_STOP_S)
    finally:
        stop_all([c for c, s in reversed(alive) if s], signal.SIGTERM, SERVER_STOP_S)


def dynamodb_args(*, latency_ms: float = 0.0, latency_mode: str = "serial",
                  index_lag_ms: float = 0.0, index_lag_jitter_ms: float = 0.0) -> list[str]:
    """``Server(*dynamodb_args(...))``: the embedded DynamoDB on a free port, optionally
    slow (``latency_ms``) and with indexes that lag the table as DynamoDB's do
    (``index_lag_ms`` + uniform(0, ``index_lag_jitter_ms``) per index read). Scenarios
    measured before the lag existed keep 0, so their figures stay comparable."""
    args = ["dynamodb", "--port", "0"]
    if latency_ms:
        args += ["--latency-ms", str(latency_ms), "--latency-mode", latency_mode]
    if index_lag_ms or index_lag_jitter_ms:
        args += ["--index-lag-ms", str(index_lag_ms),
                 "--index-lag-jitter-ms", str(index_lag_jitter_ms)]
    return args


def log_records(log: Path, marker: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of a worker log's lines that contain ``marker`` (none if the log
    cannot be read)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        if marker not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def use_local_dynamodb(url: str) -> dict[str, str]:
    """Point this process's AWS variables (its own store, and every child started after)
    at the DynamoDB-compatible server at ``url``; the variables set."""
    local = local_aws_env(url)
    os.environ.update(local)
    return local


@contextlib.contextmanager
def local_store(dynamodb: str = "embedded", *args: str) -> Iterator[dict[str, str]]:
    """The environment a scenario's workers get: this process's, pointed at a fresh
    embedded DynamoDB (``dynamodb_args`` flags in ``args``) when ``dynamodb`` is
    ``embedded`` (``env``: the endpoint the AWS variables name). The server stops and
    this process's AWS variables are put back at the end."""
    if dynamodb != "embedded":
        yield dict(os.environ)
        return
    saved = dict(os.environ)
    ddb = Server(*(args or dynamodb_args()))
    try:
        yield {**os.environ, **use_local_dynamodb(ddb.url)}
    finally:
        ddb.stop()
        os.environ.clear()
        os.environ.update(saved)


async def until_stopped(run: Coroutine[Any, Any, T]) -> T:
    """``run``, cancelled as soon as ``STOP`` is requested (SIGTERM, SIGINT, SIGHUP): the
    cancellation unwinds through every fleet's and server's cleanup."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def cancel() -> None:
        loop.call_soon_threadsafe(task.cancel)

    STOP.notify = cancel
    try:
        if STOP.requested:
            run.close()
            raise asyncio.CancelledError
        return await run
    finally:
        STOP.notify = None


def stopped_status(command: str = "make loadtest") -> int:
    """The exit status of a run stopped by a signal: 128 + its number."""
    print(f"{command}: stopped by {STOP.reason}; every child stopped, no results written",
          file=sys.stderr, flush=True)
    return 128 + signal.Signals[STOP.reason or "SIGTERM"].value


def choose_names(text: str, known: Sequence[str], noun: str,
                 default: Sequence[str] | None = None) -> list[str]:
    """A comma-separated command-line list of ``known`` names, in ``known``'s order; ``all``
    (and ``default`` when there is one) as shorthands. ArgumentTypeError naming the unknown."""
    if text == "all":
        return list(known)
    if default is not None and text == "default":
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        shorthands = ", 'default' or 'all'" if default is not None else " or 'all'"
        raise argparse.ArgumentTypeError(
            f"unknown {noun}(s) {', '.join(unknown) or '(none)'}; choose from "
            f"{', '.join(known)}{shorthands}")
    return [n for n in known if n in names]
