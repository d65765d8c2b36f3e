"""The load and chaos benchmark: failover, loss, cost, throughput, skew, a slow store,
balance, singleton jobs and scale, in one command.

    make loadtest                                   # the default scenarios, ~19 minutes
    make loadtest-all                               # every scenario, ~31 minutes
    make loadtest ARGS="--scenarios scale"          # one scenario into the last results
    make loadtest ARGS="--profile large"
    python -m loadtest.runner --help

``loadtest.registry`` names each scenario's module and the JSON keys it writes;
docs/performance.md says what each measures and what the run writes. The exit status is
non-zero if a correctness figure (``loadtest.audit``) is not zero or a scenario could not
run: times are reported, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from loadtest.audit import correctness_failures
from loadtest.common import (
    PROFILES,
    STOP,
    choose_names,
    stop_children,
    stopped_status,
    until_stopped,
)
from loadtest.fleet import LOGS, Context
from loadtest.registry import (
    BY_NAME,
    DEFAULT,
    LOADTEST,
    SHARED_SECTIONS,
    Entry,
    add_arguments,
    get_path,
)
from loadtest.report import write_reports

RESULTS = Path(__file__).resolve().parent / "results"


def runners() -> dict[str, Entry]:
    """Each scenario ``make loadtest`` can run, by name: its entry (see loadtest.registry)."""
    return {name: BY_NAME[name].load() for name in LOADTEST}


def section_paths(part: dict[str, Any]) -> list[str]:
    """The keys a scenario wrote: top-level, or in shared sections down to their depth
    (``failover.kill9``, ``sinks.kinesis.lost``); what a later run keeps of it."""

    def leaves(prefix: str, value: Any, depth: int) -> list[str]:
        if depth == 0 or not isinstance(value, dict):
            return [prefix]
        return [p for sub, v in value.items() for p in leaves(f"{prefix}.{sub}", v, depth - 1)]

    paths = []
    for key, value in part.items():
        if key in SHARED_SECTIONS and isinstance(value, dict):
            paths += leaves(key, value, SHARED_SECTIONS[key])
        else:
            paths.append(key)
    return paths


def put_path(result: dict[str, Any], path: str, value: Any) -> None:
    *heads, last = path.split(".")
    for head in heads:
        if not isinstance(result.get(head), dict):
            result[head] = {}
        result = result[head]
    result[last] = value


async def run_scenarios(ctx: Context, names: list[str],
                        previous: dict[str, Any] | None) -> dict[str, Any]:
    args = ctx.args
    result: dict[str, Any] = {
        "profile": args.profile, "settings": ctx.profile, "dynamodb": args.dynamodb,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "scenarios": {},
        "logs": str(ctx.log_root),
    }
    table = runners()
    parts: list[tuple[list[str], dict[str, Any]]] = []
    for name in names:
        print(f"== scenario {name}", flush=True)
        started = time.monotonic()
        meta: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime())}
        try:
            part = await table[name](ctx)
            meta["ok"] = "error" not in part
            if "error" in part:
                meta["error"] = part.pop("error")
        except Exception as exc:
            traceback.print_exc()
            part = {}
            meta.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        meta["seconds"] = round(time.monotonic() - started, 1)
        meta["keys"] = section_paths(part)
        parts.append((meta["keys"], part))
        result["scenarios"][name] = meta
        print(f"== scenario {name}: {'ok' if meta['ok'] else meta['error']} "
              f"({meta['seconds']:.0f} s)", flush=True)
    # The kept figures first, this run's over them: a scenario of an earlier run may have
    # recorded a whole shared section (``scale``) that this run's scenarios write into.
    if previous:
        for name, meta in previous.get("scenarios", {}).items():
            if name in result["scenarios"] or not isinstance(meta, dict):
                continue
            for path in meta.get("keys", []):
                value = get_path(previous, path)
                if value is not None:
                    put_path(result, path, value)
            result["scenarios"][name] = {**meta, "from_previous_run": True}
    for keys, part in parts:
        for path in keys:
            put_path(result, path, get_path(part, path))
    return result


def parse_scenarios(text: str) -> list[str]:
    return choose_names(text, LOADTEST, "scenario", default=DEFAULT)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="make loadtest", description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=parse_scenarios, default=list(DEFAULT),
                        help=f"comma-separated from {', '.join(LOADTEST)}; 'default' "
                             f"({','.join(DEFAULT)}) or 'all'")
    parser.add_argument("--merge", action="store_true", default=True,
                        help="keep the other scenarios' figures from the last latest.json "
                             "(the default: the committed results always hold every key)")
    parser.add_argument("--fresh", dest="merge", action="store_false",
                        help="write only the figures of the scenarios this run ran")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="small")
    parser.add_argument("--streams", type=int, help="override the profile's stream count")
    parser.add_argument("--rate", type=float, help="messages/s per stream")
    parser.add_argument("--workers", type=int, help="worker processes")
    parser.add_argument("--dynamodb", choices=["embedded", "env"], default="embedded",
                        help="embedded server, or the endpoint/credentials the AWS variables name")
    parser.add_argument("--seed", type=int, default=None, help="chaos schedule seed")
    parser.add_argument("--tracing", choices=["on", "off"], default="on",
                        help="on (the default): the chaos run's workers export spans to a "
                             "receiver on loopback, for the tracing.* hand-off figures and "
                             "latest-trace.png")
    parser.add_argument("--quick", action="store_true",
                        help="shorter throughput phases (for smoke runs)")
    parser.add_argument("--out", default=str(RESULTS), help="where to write the reports")
    parser.add_argument("--worker-log-level", choices=["DEBUG", "INFO"], default="INFO",
                        help="the workers' STREAMLEASE_LOG_LEVEL (DEBUG adds each change "
                        "feed hop: feed.batch, feed.notice_posted, member.beat, "
                        "member.notice_heard, stream.checked_now)")
    g = parser.add_argument_group("scenario settings")
    g.add_argument("--skew-offset", default="-2s",
                   help="libfaketime offset of the skewed worker (default -2s; 'off': the "
                        "same run without libfaketime, a control)")
    g.add_argument("--skew-seconds", type=float, default=60.0)
    g.add_argument("--slow-store-ms", type=float, default=20.0,
                   help="embedded server latency per request in slow_store (default 20)")
    g.add_argument("--slow-store-mode", choices=["serial", "parallel"], default="parallel",
                   help="parallel (default): 20 ms added to every request, a slow store or "
                        "network; serial: the delay held inside the server's lock, a store "
                        "saturated at 1000/ms requests/s (see streamlease/dev/dynamodb.py)")
    g.add_argument("--slow-store-seconds", type=float, default=60.0)
    g.add_argument("--slow-store-rate", type=float, default=None,
                   help="messages/s per stream in slow_store (default: the profile's)")
    g.add_argument("--balance-rate", type=float, default=1.0,
                   help="messages/s per stream in balance (default 1: 40 streams at the "
                        "small profile's 20 saturated the embedded server on 2 cores)")
    g.add_argument("--balance-timeout", type=float, default=60.0,
                   help="give up waiting for convergence after this long (default 60)")
    g.add_argument("--kill9-defaults-workers", type=int, default=3)
    g.add_argument("--kill9-defaults-streams", type=int, default=100,
                   help="streams per worker in kill9_defaults (default 100, the default "
                        "STREAMLEASE_MAX_STREAMS)")
    g.add_argument("--kill9-defaults-rate", type=float, default=0.5,
                   help="messages/s per stream in kill9_defaults (default 0.5)")
    g.add_argument("--kill9-defaults-kills", type=int, default=2)
    g.add_argument("--scale-reads-streams", type=int, default=25,
                   help="idle streams per worker in scale_reads (default 25)")
    g.add_argument("--scale-reads-window", type=float, default=60.0,
                   help="quiet window of each scale_reads fleet (default 60 s: one stream "
                        "check-in interval)")
    g.add_argument("--scale-streams", type=int, default=2000)
    g.add_argument("--scale-workers", type=int, default=4)
    g.add_argument("--scale-rate", type=float, default=1e-6,
                   help="messages/s per scale stream (default 1e-6: idle)")
    g.add_argument("--scale-window", type=float, default=60.0,
                   help="steady window for request rates (a window longer than "
                        "STREAMLEASE_STREAM_RENEW_SECONDS also sees stream renewals)")
    g.add_argument("--scale-acquire-per-cycle", type=int, default=100,
                   help="STREAMLEASE_ACQUIRE_PER_CYCLE for the scale run (default 100)")
    add_arguments(g)  # the options of the scenarios' own modules
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Before any child exists: SIGTERM (a CI timeout), SIGINT (Ctrl-C) and SIGHUP (a closed
    # terminal) stop the run in order instead of killing this process alone.
    STOP.install()
    profile = dict(PROFILES[args.profile])
    for key in ("streams", "rate", "workers"):
        if getattr(args, key) is not None:
            profile[key] = getattr(args, key)
    out = Path(args.out)
    previous = None
    if args.merge and (out / "latest.json").exists():
        previous = json.loads((out / "latest.json").read_text())
    ctx = Context(args, profile, LOGS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    import uvloop

    try:
        result = uvloop.run(until_stopped(run_scenarios(ctx, args.scenarios, previous)))
    except asyncio.CancelledError:
        if not STOP.requested:
            raise
        return stopped_status()
    finally:
        stop_children()  # whatever a scenario's own cleanup left running
    if STOP.requested:  # after the last scenario: its figures may be cut short
        return stopped_status()
    paths = write_reports(result, out)
    print(Path(paths["md"]).read_text())
    print("reports: " + ", ".join(str(v) for v in paths.values()))
    print(f"worker logs: {ctx.log_root}")
    status = 0
    bad = correctness_failures(result)
    if bad:
        print(f"CORRECTNESS FAILURE: {bad}", file=sys.stderr)
        status = 1
    failed = {n: m.get("error") for n, m in result["scenarios"].items() if not m.get("ok")}
    if failed:
        print(f"SCENARIOS THAT DID NOT RUN TO THE END: {failed}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
