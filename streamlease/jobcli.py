"""``streamlease job ...``: manage singleton jobs, read their runs, and write fenced from
inside a run. Parses, calls, prints; the rules live in ``streamlease.core.jobs`` and
``streamlease.core.schedule``.

Exit codes (docs/contract.md): 0 success; 2 bad usage or configuration; 3 a fenced write refused
for a stale fence; 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from streamlease.clock import SYSTEM_CLOCK
from streamlease.config import setting_value
from streamlease.core.backends import MongoTarget
from streamlease.core.jobs import Job, JobRun
from streamlease.core.schedule import Schedule, parse_cron, parse_every, slot_name
from streamlease.errors import ConfigError, StaleFence
from streamlease.leader import LeaderBackend, PutItem, WriteRefused
from streamlease.leadership import FLEET_LEASE
from streamlease.store.protocols import Stores

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_STALE = 0, 1, 2, 3
MAX_JOB_NAME = 200
MAX_COMMAND = 10_000


class JobUsage(Exception):
    """Bad input to a job command: exit 2 with this one line."""


def job_name(value: str) -> str:
    if not value or len(value) > MAX_JOB_NAME or not value.isprintable() or "#" in value:
        raise argparse.ArgumentTypeError(
            f"job name must be 1-{MAX_JOB_NAME} printable characters without '#', "
            f"got {value!r}")
    return value


def add_parsers(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """The ``job`` subcommands, under ``sub`` (the top-level subparsers)."""
    job = sub.add_parser("job", help="singleton jobs: run once per slot by the fleet leader")
    job_sub = job.add_subparsers(dest="job_command", required=True, parser_class=parser_class)
    put = job_sub.add_parser("put", help="create or replace a job")
    put.add_argument("name", type=job_name)
    when = put.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", help="five-field cron expression, in UTC")
    when.add_argument("--every", help="interval such as 30s, 5m, 1h, 2d")
    # dest: ``command`` is the top-level subcommand's name in the namespace.
    put.add_argument("--command", dest="shell", required=True, metavar="CMD",
                     help="run by /bin/sh -c in each slot")
    put.add_argument("--timeout", type=_seconds, help="stop a run after this many seconds")
    put.add_argument("--catch-up", action="store_true",
                     help="run slots missed while no leader existed, once each, late")
    listing = job_sub.add_parser("list", help="every job")
    listing.add_argument("-o", "--output", choices=["table", "json"], default="table")
    remove = job_sub.add_parser("remove", help="delete a job (its run records stay)")
    remove.add_argument("name", type=job_name)
    runs = job_sub.add_parser("runs", help="one row per slot run, newest first")
    runs.add_argument("name", type=job_name)
    runs.add_argument("--last", type=_positive_int, default=20)
    runs.add_argument("-o", "--output", choices=["table", "json"], default="table")
    runs.add_argument("--show-output", action="store_true",
                      help="print the tail of each run's output under its row")
    write = job_sub.add_parser(
        "write", help="inside a job: write one item only if the leader still holds "
                      "$STREAMLEASE_FENCE (exit 3 if not)")
    write.add_argument("--table", required=True, help="the table (Redis: the hash)")
    write.add_argument("--item", required=True, help="the item, in DynamoDB JSON")


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not 0 < number <= 7 * 86400:
        raise argparse.ArgumentTypeError(f"expected more than 0 and at most 604800, got {value}")
    return number


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if not 1 <= number <= 10_000:
        raise argparse.ArgumentTypeError(f"expected 1-10000, got {value}")
    return number


def schedule_of(args: argparse.Namespace) -> Schedule:
    try:
        return parse_cron(args.cron) if args.cron is not None else parse_every(args.every)
    except ValueError as exc:
        raise JobUsage(f"streamlease job put: {'--cron' if args.cron else '--every'}: {exc}") \
            from None


async def put(stores: Stores, args: argparse.Namespace) -> int:
    schedule = schedule_of(args)
    command = args.shell
    if not command.strip() or len(command) > MAX_COMMAND or "\0" in command:
        raise JobUsage(f"streamlease job put: --command must be 1-{MAX_COMMAND} characters "
                       "without NUL")
    job = Job(args.name, schedule, command, args.timeout, args.catch_up,
              SYSTEM_CLOCK.wall_ms())
    created = await stores.jobs.put_job(job)
    upcoming = schedule.next_slot(SYSTEM_CLOCK.wall_ms())
    print(f"{job.name}: {'created' if created else 'updated'} ({schedule.text}); "
          f"next slot {slot_name(upcoming)}")
    return EXIT_OK


async def list_jobs(stores: Stores, args: argparse.Namespace) -> int:
    listing = await stores.jobs.list_jobs()
    now = SYSTEM_CLOCK.wall_ms()
    rows = []
    for job in listing.jobs:
        last = await stores.jobs.runs(job.name, 1)
        rows.append((job, last[0] if last else None, slot_name(job.schedule.next_slot(now))))
    if args.output == "json":
        print(json.dumps([{
            "name": job.name, "cron": job.schedule.cron,
            "every_s": None if job.schedule.every_ms is None else job.schedule.every_ms / 1000,
            "command": job.command, "timeout_s": job.timeout_s, "catch_up": job.catch_up,
            "next_slot": upcoming,
            "last_run": None if run is None else {"slot": run.slot,
                                                  "outcome": outcome(run)},
        } for job, run, upcoming in rows] + [
            {"name": bad.name, "error": bad.problem} for bad in listing.unreadable
        ], indent=2))
        return EXIT_OK
    table: list[tuple[Any, ...]] = [("JOB", "SCHEDULE", "TIMEOUT", "CATCH-UP", "NEXT SLOT",
                                      "LAST RUN", "COMMAND")]
    for job, run, upcoming in rows:
        table.append((job.name, job.schedule.text,
                      "-" if job.timeout_s is None else f"{job.timeout_s:g}s",
                      "yes" if job.catch_up else "no", upcoming,
                      "-" if run is None else f"{run.slot} {outcome(run)}", job.command[:60]))
    for bad in listing.unreadable:
        table.append((bad.name, "UNREADABLE", "-", "-", "never runs", "-", bad.problem[:60]))
    _print_table(table)
    for bad in listing.unreadable:
        print(f"job {bad.name!r} cannot run as stored: {bad.problem}; replace it with "
              "`streamlease job put`", file=sys.stderr)
    return EXIT_OK


async def remove(stores: Stores, args: argparse.Namespace) -> int:
    if not await stores.jobs.remove_job(args.name):
        print(f"streamlease: no job {args.name!r}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{args.name}: removed (its run records stay)")
    return EXIT_OK


async def runs(stores: Stores, args: argparse.Namespace) -> int:
    found = await stores.jobs.runs(args.name, args.last)
    if not found and await stores.jobs.get_job(args.name) is None:
        print(f"streamlease: no job {args.name!r}", file=sys.stderr)
        return EXIT_FAILED
    if args.output == "json":
        print(json.dumps([run_json(r) for r in found], indent=2))
        return EXIT_OK
    table: list[tuple[Any, ...]] = [("SLOT", "FENCE", "RUNNER", "STARTED", "FINISHED",
                                      "OUTCOME", "EXIT")]
    for r in found:
        table.append((r.slot, str(r.fence), r.runner, _iso(r.started_at_ms),
                      _iso(r.finished_at_ms), outcome(r),
                      "-" if r.exit_code is None else str(r.exit_code)))
    _print_table(table, [r.output for r in found] if args.show_output else None)
    return EXIT_OK


def run_json(run: JobRun) -> dict[str, Any]:
    """One run as the ``job runs -o json`` row of docs/contract.md."""
    return {"slot": run.slot, "fence": run.fence, "runner": run.runner,
            "started_at": _iso(run.started_at_ms), "finished_at": _iso(run.finished_at_ms),
            "outcome": None if run.outcome is None else run.outcome.value,
            "exit_code": run.exit_code}


def outcome(run: JobRun) -> str:
    return "running" if run.outcome is None else run.outcome.value


async def write(args: argparse.Namespace) -> int:
    """``job write``: the item, in one atomic write conditioned on the leader lease still
    carrying ``$STREAMLEASE_FENCE``."""
    fence_text = os.environ.get("STREAMLEASE_FENCE", "").strip()
    if not fence_text.isdigit():
        raise ConfigError(["STREAMLEASE_FENCE: not set to a fence (job write runs inside a "
                           "job, which the leader starts with it)"])
    try:
        item = json.loads(args.item)
    except ValueError as exc:
        raise JobUsage(f"streamlease job write: --item is not JSON: {exc}") from None
    if not isinstance(item, dict) or not item or not all(
            isinstance(v, dict) and len(v) == 1 for v in item.values()):
        raise JobUsage("streamlease job write: --item must be an object of DynamoDB JSON "
                       'attributes, such as {"Pk": {"S": "day#1"}, "n": {"N": "3"}}')
    fence = int(fence_text)
    async with leader_backend() as (backend, kind):
        try:
            request: Any = _request(kind, args.table, item)
        except ValueError as exc:
            raise JobUsage(f"streamlease job write: {exc}") from None
        try:
            await backend.fenced_write(FLEET_LEASE, fence, request)
        except StaleFence:
            print(f"streamlease: refused: the leader lease no longer carries fence {fence}",
                  file=sys.stderr)
            return EXIT_STALE
        except WriteRefused as exc:
            print(f"streamlease: refused: {exc}", file=sys.stderr)
            return EXIT_FAILED
    return EXIT_OK


def _request(kind: str, table: str, item: dict[str, Any]) -> Any:
    """The write ``job write`` hands the backend of ``kind``; ValueError for an item
    that backend cannot store."""
    if kind == "redis":
        from streamlease.store.redis_leader import hash_set_for_item
        return hash_set_for_item(table, item)
    if kind == "mongodb":
        from streamlease.store.mongo_leader import upsert_for_item
        return upsert_for_item(table, item)
    return PutItem(table, item)


@contextlib.asynccontextmanager
async def leader_backend() -> AsyncIterator[tuple[LeaderBackend, str]]:
    """The leader backend the workers use (STREAMLEASE_LEADER_BACKEND), and its kind:
    ``dynamodb``, ``redis`` or ``mongodb``."""
    choice = setting_value("STREAMLEASE_LEADER_BACKEND")
    if choice == "dynamodb":
        from streamlease.store.dynamodb import connect_admin
        fleet = setting_value("STREAMLEASE_FLEET_TABLE")
        async with connect_admin("unused-streams", "unused-events", fleet) as stores:
            yield stores.leader, "dynamodb"
        return
    from streamlease.app import require_backend
    require_backend(choice)
    if isinstance(choice, MongoTarget):
        from streamlease.store.mongo_leader import mongo_backend
        async with mongo_backend(choice) as mongo:
            yield mongo, "mongodb"
        return
    from streamlease.store.redis_leader import redis_backend
    async with redis_backend(choice) as backend:
        yield backend, "redis"


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _print_table(rows: list[tuple[Any, ...]], notes: list[str] | None = None) -> None:
    cells = [[str(c) if c is not None else "-" for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    for i, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if notes is not None and i > 0 and notes[i - 1]:
            for line in notes[i - 1].splitlines()[-20:]:
                print(f"    | {line}")
