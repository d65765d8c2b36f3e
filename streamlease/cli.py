"""The ``streamlease`` command: argparse front end. Parses, calls, prints; no logic.

Exit codes (docs/contract.md): 0 success; 2 bad usage or configuration, with one line on stderr
naming what is wrong; 3 a fenced write refused for a stale fence (``job write``); 1
anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, NoReturn
from urllib.parse import quote

from streamlease import __version__, jobcli
from streamlease.clock import SYSTEM_CLOCK, Clock
from streamlease.config import (
    WorkerConfig,
    allowed_prefixes,
    member_heartbeat_value,
    table_names,
)
from streamlease.core import roster
from streamlease.core.frames import export_line
from streamlease.core.model import StreamRecord
from streamlease.core.profiles import PROFILE_NAME
from streamlease.core.upstream import PROFILE_ATTRIBUTE
from streamlease.core.urls import ANY_WS_URL, AllowList, parse_allowed_urls, redact, url_problem
from streamlease.errors import ConfigError, StoreError, TableMissing
from streamlease.store.protocols import AdminStore, FleetStore, Stores

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MAX_STREAM_ID = 1000
# `ctl members` watches the fleet for this many member heartbeat intervals at most: a live
# member's counter moves at least once in any such window, even with a slow write or two.
OBSERVE_HEARTBEATS = 1.5
OBSERVE_READS = 6  # fleet reads per window at most, after the first
MAX_OBSERVE_S = 600.0


class UsageError(Exception):
    """Bad command-line input: exit 2 with one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _stream_id(value: str) -> str:
    if not value or len(value) > MAX_STREAM_ID or not value.isprintable():
        raise argparse.ArgumentTypeError(
            f"stream id must be 1-{MAX_STREAM_ID} printable characters, got {value!r}")
    return value


def _profile_name(value: str) -> str:
    if not PROFILE_NAME.fullmatch(value):
        raise argparse.ArgumentTypeError(
            f"a profile name is 1-64 letters, digits, '_', '.' or '-', got {value!r}")
    return value


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return number


def _observe_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not 0 < number <= MAX_OBSERVE_S:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"expected more than 0 and at most {MAX_OBSERVE_S:g} seconds, got {value}")
    return number


def build_parser() -> _Parser:
    parser = _Parser(prog="streamlease", description=__doc__)
    parser.add_argument("--version", action="version", version=f"streamlease {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("run", help="run one worker until SIGTERM/SIGINT")
    check = sub.add_parser("healthcheck",
                           help="exit 0 if the local worker's /healthz says live (containers)")
    check.add_argument("--timeout", type=float, default=3.0)

    table = sub.add_parser("table", help="manage the DynamoDB tables")
    table_sub = table.add_subparsers(dest="table_command", required=True, parser_class=_Parser)
    table_sub.add_parser("create", help="create both tables and the index (idempotent)")

    ctl = sub.add_parser("ctl", help="operate streams")
    ctl_sub = ctl.add_subparsers(dest="ctl_command", required=True, parser_class=_Parser)
    start = ctl_sub.add_parser("start", help="upsert streams as STARTED")
    start.add_argument("ids", nargs="+", type=_stream_id, metavar="ID")
    start.add_argument("--url", required=True,
                       help="upstream WebSocket URL; {id} is replaced by each stream id")
    start.add_argument("--profile", type=_profile_name,
                       help="the upstream profile the streams use (docs/profiles.md); "
                            "default: leave the item's profile as it is")
    stop = ctl_sub.add_parser("stop", help="set streams STOPPED")
    stop.add_argument("ids", nargs="+", type=_stream_id, metavar="ID")
    listing = ctl_sub.add_parser("list", help="one row a stream")
    listing.add_argument("--state", choices=["STARTED", "STOPPED"])
    listing.add_argument("--owner")
    listing.add_argument("-o", "--output", choices=["table", "json"], default="table")
    show = ctl_sub.add_parser("show", help="one stream in full (JSON)")
    show.add_argument("id", type=_stream_id)
    release = ctl_sub.add_parser("release", help="force a takeover: the holder is fenced out")
    release.add_argument("id", type=_stream_id)
    release.add_argument("--expect-owner", help="only if this worker holds it")
    release.add_argument("--expect-fence", type=_non_negative_int,
                         help="only if the fence is still this")
    owners = ctl_sub.add_parser("owners", help="live leases per worker")
    owners.add_argument("-o", "--output", choices=["table", "json"], default="table")
    members = ctl_sub.add_parser(
        "members", help="one row per fleet member, liveness as this command observes it")
    members.add_argument("-o", "--output", choices=["table", "json"], default="table")
    members.add_argument(
        "--observe", type=_observe_seconds, metavar="SECONDS",
        help="watch the member rows at most this long for heartbeats (default "
             f"{OBSERVE_HEARTBEATS:g} member heartbeats); stops early once "
             "every member has proven itself alive")
    export = ctl_sub.add_parser(
        "export", help="delivered messages in seq order, one a line (events expired by "
                       "STREAMLEASE_EVENTS_TTL_SECONDS are gone)")
    export.add_argument("id", type=_stream_id)

    jobcli.add_parsers(sub, _Parser)

    dev = sub.add_parser("dev", help="local servers for development and tests")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True, parser_class=_Parser)
    dev_sub.add_parser("dynamodb", help="embedded atomic DynamoDB-compatible server",
                       add_help=False)
    dev_sub.add_parser("upstream", help="the reference replaying upstream", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # The dev servers own their options: hand everything after `dev NAME` to them.
    if len(args_list) >= 2 and args_list[0] == "dev" and args_list[1] in ("dynamodb", "upstream"):
        return _dev(args_list[1], args_list[2:])
    try:
        args = build_parser().parse_args(args_list)
        return _dispatch(args)
    except (UsageError, jobcli.JobUsage) as exc:
        return _fail(EXIT_USAGE, str(exc))
    except ConfigError as exc:
        return _fail(EXIT_USAGE, f"streamlease: {exc}")
    except TableMissing as exc:
        return _fail(EXIT_FAILED, f"streamlease: {exc}")
    except StoreError as exc:
        return _fail(EXIT_FAILED, f"streamlease: DynamoDB: {exc}")
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `ctl export ID | head`: the reader left; that is not an error.
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _fail(code: int, message: str) -> int:
    print(message.replace("\n", " "), file=sys.stderr)
    return code


def _dev(name: str, rest: list[str]) -> int:
    try:
        if name == "dynamodb":
            from streamlease.dev import dynamodb as module
        else:
            from streamlease.dev import upstream as module  # type: ignore[no-redef]
    except ImportError as exc:
        return _fail(EXIT_USAGE, f"streamlease dev {name}: needs the dev extra "
                                 f"(pip install 'streamlease[dev]'): {exc}")
    return int(module.main(rest))


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "run":
        from streamlease.app import run_worker
        return run_worker()
    if args.command == "healthcheck":
        return _healthcheck(args.timeout)
    if args.command == "job" and args.job_command == "write":
        return asyncio.run(jobcli.write(args))
    tables = table_names()
    if args.command == "table":
        return asyncio.run(_table_create(tables))
    if args.command == "job":
        return asyncio.run(_job(tables, args))
    handlers: dict[str, Callable[..., Coroutine[Any, Any, int]]] = {
        "start": _ctl_start, "stop": _ctl_stop, "list": _ctl_list, "show": _ctl_show,
        "release": _ctl_release, "export": _ctl_export, "owners": _ctl_owners,
        "members": _ctl_members,
    }
    return asyncio.run(handlers[args.ctl_command](tables, args))


async def _job(tables: Tables, args: argparse.Namespace) -> int:
    handlers: dict[str, Callable[..., Awaitable[int]]] = {
        "put": jobcli.put, "list": jobcli.list_jobs, "remove": jobcli.remove,
        "runs": jobcli.runs,
    }
    async with _stores(tables) as stores:
        return await handlers[args.job_command](stores, args)


def _healthcheck(timeout: float) -> int:
    """Liveness only: GET /healthz on this host's metrics port."""
    import urllib.error
    import urllib.request

    config = WorkerConfig.from_env()  # the worker's own settings, validated alike
    port = config.metrics_port
    if port == 0:
        raise ConfigError(["STREAMLEASE_METRICS_PORT: is 0, so the health endpoint is off"])
    # The worker listens on every interface (0.0.0.0, ::) or on one address.
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(config.metrics_address,
                                                   config.metrics_address)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            print(resp.read().decode().strip())
            return EXIT_OK
    except urllib.error.HTTPError as exc:
        return _fail(EXIT_FAILED, f"unhealthy: {exc.read().decode().strip()}")
    except OSError as exc:
        return _fail(EXIT_FAILED, f"unhealthy: cannot reach {url}: {exc}")


Tables = tuple[str, str, str]  # streams, events, fleet


@contextlib.asynccontextmanager
async def _stores(tables: Tables) -> AsyncIterator[Stores]:
    from streamlease.store.dynamodb import connect_admin
    async with connect_admin(*tables) as stores:
        yield stores


@contextlib.asynccontextmanager
async def _store(tables: Tables) -> AsyncIterator[AdminStore]:
    async with _stores(tables) as stores:
        yield stores.admin


async def _table_create(tables: Tables) -> int:
    from streamlease.store.dynamodb import DynamoAdmin
    async with _store(tables) as store:
        created = await store.create_tables()
        notes = await store.stream_advice() if isinstance(store, DynamoAdmin) else []
    for name in tables:
        print(f"{'created' if name in created else 'exists '} {name}")
    for name in created:
        if "/index/" in name:
            print(f"added   {name}")
    for note in notes:
        print(f"note    {note}")
    return EXIT_OK


def stream_url(template: str, stream_id: str) -> str:
    """``template`` with every ``{id}`` replaced by ``stream_id`` percent-encoded, so an
    id holding ``/``, ``?``, ``#``, ``%`` or ``@`` stays one path or query value."""
    return template.replace("{id}", quote(stream_id, safe=""))


def _allowed_here() -> AllowList | None:
    """STREAMLEASE_ALLOWED_URLS of this shell, for a warning only; None when unset."""
    entries = allowed_prefixes()
    if not entries:
        return None
    try:
        return parse_allowed_urls(",".join(entries))
    except ValueError as exc:
        print(f"warning: STREAMLEASE_ALLOWED_URLS in this environment is invalid: {exc}",
              file=sys.stderr)
        return None


async def _ctl_start(tables: Tables, args: argparse.Namespace) -> int:
    plans = []
    for stream_id in args.ids:
        url = stream_url(args.url, stream_id)
        problem = url_problem(url, ANY_WS_URL)
        if problem:
            raise UsageError(f"streamlease ctl start: --url: {problem}")
        plans.append((stream_id, url))
    allowed = _allowed_here()
    async with _store(tables) as store:
        for stream_id, url in plans:
            before = await store.get(stream_id)
            await store.put_started(stream_id, url, args.profile)
            same_profile = args.profile is None or (
                before is not None and _profile(before) == args.profile)
            change = "created" if before is None else (
                "unchanged" if before.started and before.ws_url == url and same_profile
                else "updated")
            profile = f" profile={args.profile}" if args.profile is not None else ""
            print(f"{stream_id}: STARTED ({change}) url={redact(url)}{profile}")
            if allowed is not None and url_problem(url, allowed):
                print(f"{stream_id}: warning: url is outside STREAMLEASE_ALLOWED_URLS in this "
                      "environment; workers with the same setting will not serve it",
                      file=sys.stderr)
    return EXIT_OK


async def _ctl_stop(tables: Tables, args: argparse.Namespace) -> int:
    missing = 0
    async with _store(tables) as store:
        for stream_id in args.ids:
            before = await store.get(stream_id)
            record = await store.set_state(stream_id, "STOPPED")
            if record is None:
                print(f"{stream_id}: no such stream", file=sys.stderr)
                missing += 1
                continue
            was = before.desired_state if before else None
            print(f"{stream_id}: STOPPED (was {was})")
    return EXIT_FAILED if missing else EXIT_OK


def _print_rows(rows: Sequence[tuple[str, ...]]) -> None:
    """``rows`` as aligned columns, the first row the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _lease_left_s(record: StreamRecord, now_ms: int) -> float | None:
    if record.lease_expires_at_ms is None:
        return None
    return max(0.0, (record.lease_expires_at_ms - now_ms) / 1000)


def _profile(record: StreamRecord) -> str | None:
    """The item's ``profile`` as written (None: the default profile serves it)."""
    value = record.attributes.get(PROFILE_ATTRIBUTE)
    return None if value is None else str(value)


def record_json(record: StreamRecord, now_ms: int) -> dict[str, Any]:
    return {
        "stream": record.stream_id,
        "desired_state": record.desired_state,
        "ws_url": redact(record.ws_url) if record.ws_url else None,
        "profile": _profile(record),
        "lease_owner": record.lease_owner,
        "lease_expires_at_ms": record.lease_expires_at_ms,
        "lease_left_s": _lease_left_s(record, now_ms),
        "fence": record.fence,
        "last_seq": record.last_seq,
        "last_error": record.last_error,
        "last_error_at_ms": record.last_error_at_ms,
    }


async def _ctl_list(tables: Tables, args: argparse.Namespace) -> int:
    async with _store(tables) as store:
        records = await store.list_streams()
    now_ms = SYSTEM_CLOCK.wall_ms()
    records = [r for r in records
               if (args.state is None or r.desired_state == args.state)
               and (args.owner is None or r.lease_owner == args.owner)]
    if args.output == "json":
        print(json.dumps([record_json(r, now_ms) for r in records], indent=2))
        return EXIT_OK
    rows = [("STREAM", "STATE", "OWNER", "LEASE LEFT", "FENCE", "LAST_SEQ", "LAST ERROR")]
    for r in records:
        left = _lease_left_s(r, now_ms)
        rows.append((
            r.stream_id, r.desired_state or "-", r.lease_owner or "-",
            "-" if left is None else ("free" if left == 0 else f"{left:.1f}s"),
            "-" if r.fence is None else str(r.fence),
            "-" if r.last_seq is None else str(r.last_seq),
            (r.last_error or "")[:60],
        ))
    _print_rows(rows)
    return EXIT_OK


async def _ctl_owners(tables: Tables, args: argparse.Namespace) -> int:
    async with _store(tables) as store:
        records = await store.list_streams()
    now_ms = SYSTEM_CLOCK.wall_ms()
    held: dict[str, list[str]] = {}
    unowned = []
    for r in records:
        if r.lease_owner and (r.lease_expires_at_ms or 0) > now_ms:
            held.setdefault(r.lease_owner, []).append(r.stream_id)
        elif r.started:
            unowned.append(r.stream_id)
    if args.output == "json":
        print(json.dumps({"owners": {w: sorted(s) for w, s in sorted(held.items())},
                          "unowned_started": sorted(unowned)}, indent=2))
        return EXIT_OK
    width = max([len("WORKER"), *map(len, held)])
    print(f"{'WORKER'.ljust(width)}  STREAMS")
    for worker_id, streams in sorted(held.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"{worker_id.ljust(width)}  {len(streams)}")
    print(f"{'(unowned STARTED)'.ljust(width)}  {len(unowned)}")
    return EXIT_OK


async def watch_fleet(fleet: FleetStore, clock: Clock, window_s: float) -> list[roster.FleetRead]:
    """Read every member row, again every ``window_s / OBSERVE_READS``, until every
    member has proven itself alive or a read was sent ``window_s`` after the first answer
    (so a silent member's heartbeat age shows at least ``window_s``)."""
    step = window_s / OBSERVE_READS
    reads: list[roster.FleetRead] = []
    while True:
        sent = clock.monotonic()
        members = await fleet.members()
        reads.append(roster.FleetRead(tuple(members), sent, clock.monotonic()))
        left = reads[0].received_at + window_s - clock.monotonic()
        if sent >= reads[0].received_at + window_s or roster.settled(reads):
            return reads
        await clock.sleep(min(step, max(0.0, left)))


def member_json(report: roster.MemberReport) -> dict[str, Any]:
    """The fields docs/contract.md lists, nothing else."""
    m = report.member
    return {"id": m.worker_id, "epoch": m.epoch, "status": m.status.value,
            "streams": m.streams, "share": report.share,
            "heartbeat_age_s": round(report.heartbeat_age_s, 3), "alive": report.alive}


async def _ctl_members(tables: Tables, args: argparse.Namespace) -> int:
    window = args.observe if args.observe is not None else \
        OBSERVE_HEARTBEATS * member_heartbeat_value()
    # Member rows only (and the leader lease): never the streams table, whose Scan grows
    # with the streams. Shares are of what the rows say the fleet holds.
    async with _stores(tables) as stores:
        reads = await watch_fleet(stores.fleet, SYSTEM_CLOCK, window)
    held = roster.held(reads[-1].members)
    reports = roster.report(reads, held)
    leader = await _leader_text()
    if args.output == "json":
        print(json.dumps([member_json(r) for r in reports], indent=2))
        return EXIT_OK
    now_ms = SYSTEM_CLOCK.wall_ms()
    rows = [("MEMBER", "EPOCH", "STATUS", "STREAMS", "SHARE", "CAPACITY", "HEARTBEAT AGE",
             "LIVENESS", "ITS CLOCK SAYS")]
    for r in reports:
        m = r.member
        stamped = "-" if m.heartbeat_at_ms is None else \
            f"{(now_ms - m.heartbeat_at_ms) / 1000:.1f}s ago"
        rows.append((m.worker_id, str(m.epoch), m.status.value, str(m.streams), str(r.share),
                     str(m.capacity), f"{r.heartbeat_age_s:.1f}s", r.liveness, stamped))
    rows.append((f"({len(reports)} members)", "", "",
                 str(sum(r.member.streams for r in reports)),
                 str(sum(r.share for r in reports)),
                 str(sum(r.member.capacity for r in reports if r.member.live_status)),
                 "", "", ""))
    _print_rows(rows)
    counts = ", ".join(f"{sum(r.liveness == state for r in reports)} {state}"
                       for state in ("alive", "silent", "dead"))
    watched = reads[-1].received_at - reads[0].received_at
    print(f"{counts}; {held} streams held, as the member rows report them; {leader}; "
          f"watched {watched:.1f}s in "
          f"{len(reads)} reads (HEARTBEAT AGE: how long this command saw each heartbeat "
          "unchanged)")
    return EXIT_OK


async def _leader_text() -> str:
    """Who holds the fleet leader lease, as its backend says (for people: the lease is
    judged by observation, so a holder shown here may just have been deposed)."""
    from streamlease.jobcli import leader_backend
    from streamlease.leadership import FLEET_LEASE
    try:
        async with leader_backend() as (backend, _):
            record = await backend.read(FLEET_LEASE)
    except StoreError as exc:
        return f"leader unknown ({exc})"
    if record is None or record.resigned:
        return "no leader"
    return f"leader {record.owner} (fence {record.fence})"


async def _ctl_show(tables: Tables, args: argparse.Namespace) -> int:
    async with _store(tables) as store:
        record = await store.get(args.id)
    if record is None:
        return _fail(EXIT_FAILED, f"streamlease: no stream {args.id!r}")
    print(json.dumps(record_json(record, SYSTEM_CLOCK.wall_ms()), indent=2))
    return EXIT_OK


async def _ctl_release(tables: Tables, args: argparse.Namespace) -> int:
    async with _store(tables) as store:
        result = await store.force_release(args.id, args.expect_owner, args.expect_fence)
    if result.changed:
        assert result.record is not None
        print(f"{args.id}: released; fence {result.record.fence} "
              f"(the holder under fence {(result.record.fence or 1) - 1} is fenced out)")
        return EXIT_OK
    if result.record is None:
        return _fail(EXIT_FAILED, f"streamlease: no stream {args.id!r}")
    found = f"owner={result.record.lease_owner} fence={result.record.fence}"
    return _fail(EXIT_FAILED, f"streamlease: not released: {args.id} is held as {found}, "
                              f"expected owner={args.expect_owner} fence={args.expect_fence}")


async def _ctl_export(tables: Tables, args: argparse.Namespace) -> int:
    async with _store(tables) as store:
        if await store.get(args.id) is None:
            return _fail(EXIT_FAILED, f"streamlease: no stream {args.id!r}")
        out = sys.stdout
        async for frame in store.read_events(args.id):
            out.write(export_line(frame.text))
            out.write("\n")
    out.flush()
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())

