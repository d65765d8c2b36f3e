"""Write the benchmark's report: JSON (for tools), Markdown (for people), a PNG timeline,
and, when the run traced its hand-offs, a PNG of the slowest hand-off's and take-over's
spans (``latest-trace.png``).

Every section is optional: a run of some scenarios (``--scenarios``) renders what it has.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from loadtest.registry import REPLAYING_MODES, UPSTREAM_MODES, get_path, owner


def write_reports(result: dict[str, Any], out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    body, md = json.dumps(result, indent=2), markdown(result)
    for name, text in (("latest.json", body), (f"{stamp}.json", body), ("latest.md", md),
                       (f"{stamp}.md", md)):
        write_file(out / name, text)
    png = out / "latest.png"
    timeline_png(result, png)
    paths = {"json": str(out / "latest.json"), "md": str(out / "latest.md"), "png": str(png)}
    if trace_panels(result):
        trace = out / TRACE_PNG
        trace_png(result, trace)
        paths["trace_png"] = str(trace)
    return paths


TRACE_PNG = "latest-trace.png"


def write_file(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all: a run killed while writing leaves the
    previous file (a stray ``.tmp`` at worst), never a truncated one."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _v(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if not value.is_integer() \
            else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_v(v)}" for k, v in value.items()) or "none"
    return str(value)


# The worker's default member lease (STREAMLEASE_MEMBER_LEASE_SECONDS unset: the smaller of
# 5 s and STREAMLEASE_LEASE_SECONDS), for the scale run's kill -9 target; the report does not
# import the worker (tests/test_loadtest_report.py checks the copy).
DEFAULT_MEMBER_LEASE_S = 5.0


def at_most(bound: float) -> Any:
    return lambda v: None if v is None or isinstance(v, str) else v <= bound


def at_least(bound: float) -> Any:
    return lambda v: None if v is None or isinstance(v, str) else v >= bound


def _yes(v: Any) -> bool | None:
    return None if v is None else v is True


def targets(r: dict[str, Any]) -> list[tuple[str, str, Any, str, bool | None]]:
    """(figure, JSON key, result, target, met) for the figures that have a target, but those
    of a scenario that did not run (the one that writes the key: ``loadtest.registry``)."""
    s = r.get("settings", {})
    kill9 = s.get("lease", 2.0) + 1.2 * s.get("reconcile", 0.5) + 0.5
    share = get_path(r, "balance.share") or 10
    streams = get_path(r, "balance.streams") or 40

    restart_target = get_path(r, "balance.after_rolling_restart_target") or share + 1
    member_lease = DEFAULT_MEMBER_LEASE_S
    leader_target = get_path(r, "jobs.leader_failover_target_s") or \
        s.get("lease", 2.0) + s.get("reconcile", 0.5) + 0.5
    rows = [
        ("lease-upkeep writes per held stream-minute (defaults)",
         "upkeep_writes_per_stream_minute_default", "<= 1", at_most(1.0)),
        ("streams per table at defaults (every request kind; every partition-key "
         "value <= 50 % of its limit)", "streams_per_table_at_defaults", ">= 1,000,000",
         at_least(1_000_000)),
        ("capacity model agrees with the scale run's requests/s by kind",
         "capacity_model.measured_vs_model.agrees", "yes", _yes),
        ("kill -9 failover p99 (small profile)", "failover.kill9.p99",
         f"<= lease + 1.2 x reconcile + 0.5 = {kill9:.1f} s", at_most(kill9)),
        ("index reads 1 s behind: longest a stream stayed leased to a live "
         "worker that did not serve it", "index_lag.unserved_max_s",
         f"<= one self-audit interval (at most 1.92 x lease = {1.92 * s.get('lease', 2.0):.1f} s)",
         at_most(1.92 * s.get("lease", 2.0))),
        ("index reads 1 s behind: lost / duplicated / out of order / stale "
         "accepted", "index_lag.lost", "0", at_most(0)),
        ("index reads 1 s behind: kill -9 failover p99", "index_lag.kill9_p99",
         f"<= lease + 1.2 x reconcile + 1.5 = {kill9 + 1.0:.1f} s", at_most(kill9 + 1.0)),
        ("a worker's clock behind the others: settled", "skew.settled", "yes", _yes),
        ("a worker's clock behind: moves once the fleet is even", "skew.moves", "0",
         at_most(0)),
        ("a worker's clock behind: streams that delivered nothing while observed",
         "skew.stalled_streams", "0", at_most(0)),
        ("slow store (20 ms a request): moves after the first owner",
         "slow_store.moves", "0", at_most(0)),
        ("slow store: streams that delivered nothing while observed",
         "slow_store.stalled_streams", "0", at_most(0)),
        ("2 -> 4 workers: time until every worker holds its share +/-1",
         "balance.converge_s", "<= 5 s", at_most(5.0)),
        ("moves during that convergence (the minimum is 20)", "balance.moves",
         "<= 22", at_most(22)),
        ("moves in the 30 s after convergence", "balance.moves_after", "0",
         at_most(0)),
        ("rolling restart: largest count one worker holds at its end",
         "balance.after_rolling_restart_max",
         f"<= ceil({streams}/4) + 1 = {restart_target}", at_most(restart_target)),
        ("SIGTERM hand-off p99", "failover.sigterm.p99", "<= 1.0 s", at_most(1.0)),
        ("SIGTERM hand-off p99, store slowed to 20 ms a request",
         "failover.sigterm_slow_store.p99", "<= 1.0 s", at_most(1.0)),
        ("job slots run twice (pause, kill -9, rolling restart)", "jobs.double_runs",
         "0", at_most(0)),
        ("stale-leader job writes accepted", "jobs.stale_accepted", "0", at_most(0)),
        ("new leader after kill -9 of the leader", "jobs.leader_failover_s",
         f"<= lease + reconcile + 0.5 = {leader_target:.1f} s", at_most(leader_target)),
        ("job slot start delay after its scheduled time, p99, steady state",
         "jobs.start_delay_p99_s", "<= 1 s", at_most(1.0)),
        ("control-plane items read per worker-minute, 8 workers / 2 (same "
         "streams per worker, defaults)", "scale.per_worker_read_growth", "<= 1.2",
         at_most(1.2)),
        ("index-key moves per held stream-minute in a quiet window (defaults)",
         "scale.index_moves_per_stream_minute", "0", at_most(0)),
        ("kill -9 of a worker holding 500 streams (scale run): p99 until each is "
         "connected again", "scale.kill9_p99",
         f"<= member lease + 5 s = {member_lease + 5:g} s", at_most(member_lease + 5)),
        ("kill -9 at default settings, 100 streams per worker: p99 until "
         "each delivers again", "failover.kill9_defaults.p99", "<= 10 s", at_most(10.0)),
        ("2 -> 4 workers while the first two still take 40 streams: time "
         "until every worker holds its share +/-1", "balance.during_startup.converge_s",
         "<= 10 s", at_most(10.0)),
        ("moves during that convergence",
         "balance.during_startup.moves", "<= 25", at_most(25)),
        ("longest a stream was unowned meanwhile",
         "balance.during_startup.unowned_max_s", "<= 2 s", at_most(2.0)),
        ("dynamodb sink: $ per stream-month at 1 msg/s (default batch window)",
         "sinks.dynamodb.cost_per_stream_month_1hz", "<= $1.50", at_most(1.5)),
        ("dynamodb sink: added latency p99 at 1 msg/s (default batch window)",
         "sinks.dynamodb.added_latency_s", "<= 5 s", at_most(5.0)),
        *sink_target_rows(r),
        *upstream_target_rows(r),
        ("rolling deploy (one worker at a time, the new one ready first): longest "
         "delivery gap of a stream, p99 over streams", "deploy.max_gap_p99_s",
         "<= 0.5 s", at_most(0.5)),
        *((f"rolling deploy: {label}", f"deploy.{key}", "0", at_most(0)) for key, label in
          (("lost", "lost"), ("duplicated", "duplicated"), ("out_of_order", "out of order"))),
        ("SIGTERM hand-offs in the chaos run whose trace links release to first "
         "delivery", "tracing.handoffs_linked", "100 % (1.0)", at_least(1.0)),
        ("no-op Python processor, one worker: throughput with tracing on (default "
         "sampling) / off", "tracing.throughput_ratio", ">= 0.95", at_least(0.95)),
        *((f"change feed on: {label}", f"change_feed.{key}", text, at_most(bound))
          for key, label, text, bound in CHANGE_FEED_TARGETS),
        ("random fault schedules run (a minute each, `make nemesis`)",
         "nemesis.schedules", ">= 200", at_least(200)),
        ("schedules with any violation", "nemesis.violations", "0", at_most(0)),
        ("faults injected of the rarest kind (every kind of the catalogue)",
         "nemesis.fewest_faults_of_a_kind", ">= 20", at_least(20)),
        ("longest a STARTED stream stayed unserved after the heal, p99",
         "nemesis.recovery_p99_s", "<= member lease + 5 s = 7 s", at_most(7.0)),
        ("processes left running after all schedules", "nemesis.orphans", "0",
         at_most(0)),
    ]
    ran = r.get("scenarios")
    out = []
    for label, key, target, check in rows:
        value = get_path(r, key)
        if isinstance(value, list):
            value = len(value)
        if value is None and key.startswith(("sinks.", "upstreams.")):
            sink = get_path(r, key.rsplit(".", 1)[0]) or {}
            value = "skipped" if "skipped" in sink else "error" if "error" in sink else None
        if (owner(key) not in ran) if isinstance(ran, dict) else value is None:
            continue  # that scenario did not run
        out.append((label, key, value, target, check(value)))
    return out


def sink_target_rows(r: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    """Per sink of the sinks scenario: lost (every sink), duplicated (exactly-once sinks)
    or duplicated within one tenure (at-least-once sinks); the no-op Python processor's
    throughput against a bare client (the throughput scenario)."""
    zero = at_most(0)
    rows: list[tuple[str, str, str, Any]] = []
    sinks = r.get("sinks")
    for name, k in (sinks.items() if isinstance(sinks, dict) else ()):
        if not isinstance(k, dict) or not ({"lost", "skipped", "error"} & set(k)):
            continue
        once = k.get("exactly_once", name in ("dynamodb", "postgres"))
        rows.append((f"{name} sink, chaos run: messages lost", f"sinks.{name}.lost",
                     "0", zero))
        if once:
            rows.append((f"{name} sink (exactly once): duplicates",
                         f"sinks.{name}.duplicated", "0", zero))
        else:
            rows.append((f"{name} sink (at least once): duplicates within one "
                         "tenure (same fence)", f"sinks.{name}.dup_outside_takeover", "0",
                         zero))
    rows.append(("no-op Python processor, one worker: throughput / bare "
                 "websockets client", "sinks.python.ratio_to_bare", ">= 0.8", at_least(0.8)))
    return rows


def upstream_target_rows(r: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    """Per resume mode of the upstreams scenario: lost and duplicated where the feed
    replays; duplicated and the share of lost messages inside a recorded gap where it
    cannot; and a profile's throughput against the built-in protocol."""
    zero = at_most(0)
    rows: list[tuple[str, str, str, Any]] = []
    section = r.get("upstreams")
    modes = section if isinstance(section, dict) else {}
    for mode in UPSTREAM_MODES:
        k = modes.get(mode)
        if not isinstance(k, dict):
            continue
        feed = f"{mode} resume (/{k.get('feed', '?')}/ feed), chaos run"
        dup = (f"{feed}: duplicates", f"upstreams.{mode}.duplicated", "0", zero)
        if k.get("replays", mode in REPLAYING_MODES):
            rows += [(f"{feed}: messages lost", f"upstreams.{mode}.lost", "0", zero), dup]
        else:
            rows += [dup, (f"{feed}: lost messages inside a recorded gap",
                           f"upstreams.{mode}.loss_in_gaps", "100 % (1.0)", at_least(1.0))]
    rows.append(("one worker: throughput with a profile (nested seq, control "
                 "frames skipped) / the built-in protocol", "upstreams.profile_ratio",
                 ">= 0.9", at_least(0.9)))
    return rows


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# streamlease load and chaos run ({r.get('profile', '?')} profile, "
             f"{r.get('started_at', '?')})", ""]
    scen = r.get("scenarios", {})
    if scen:
        lines += ["| scenario | result | seconds | run at |", "|---|---|---|---|"]
        for name, meta in scen.items():
            state = "ok" if meta.get("ok") else f"**{meta.get('error', 'failed')}**"
            if meta.get("from_previous_run"):
                state += " (kept from an earlier run)"
            lines.append(f"| {name} | {state} | {_v(meta.get('seconds'))} | "
                         f"{meta.get('started_at', '-')} |")
        lines.append("")
    rows = targets(r)
    if rows:
        lines += ["## Targets", "", "| figure | JSON key | result | target | met |",
                  "|---|---|---|---|---|"]
        for label, key, value, target, met in rows:
            mark = "-" if met is None else ("yes" if met else "**no**")
            lines.append(f"| {label} | `{key}` | {_v(value)} | {target} | {mark} |")
        lines.append("")
    if "lost" in r:
        lines += chaos_md(r)
    if "msgs_per_s" in r:
        lines += throughput_md(r)
    for name, render in (("kill9_defaults", kill9_defaults_md),
                         ("index_lag", index_lag_md), ("skew", skew_md),
                         ("slow_store", slow_store_md), ("deploy", deploy_md),
                         ("balance", balance_md),
                         ("jobs", jobs_md), ("sinks", sinks_md), ("upstreams", upstreams_md),
                         ("scale", scale_md), ("tracing", tracing_md),
                         ("change_feed", change_feed_md)):
        if isinstance(r.get(name), dict):
            lines += render(r)
    if isinstance(get_path(r, "sinks.dynamodb"), dict):
        lines += sinks_dynamodb_md(r["sinks"]["dynamodb"])
    if isinstance(r.get("capacity_model"), dict) and "text" in r["capacity_model"]:
        lines += ["## Capacity model", "", r["capacity_model"]["text"], ""]
    return "\n".join(lines)


def sinks_dynamodb_md(d: dict[str, Any]) -> list[str]:
    """The ``dynamodb`` sink's cost and added latency per batch window (loadtest/sink_cost)."""
    lines = [
        "## Sink cost: dynamodb", "",
        f"{d.get('curve', {}) and next(iter(d['curve'].values())).get('streams')} streams a "
        f"window at {_v(d.get('rate_msgs_per_s'))} msg/s ({_v(d.get('message_bytes'))}-byte "
        f"messages), {_v(d.get('measured_s'))} s measured on the embedded DynamoDB; write "
        "units from the items written (DynamoDB's size rules, transactions doubled). Default "
        f"window (`STREAMLEASE_BATCH_MAX_SECONDS`) {_v(d.get('default_window_s'))} s: "
        f"**${_v(d.get('cost_per_stream_month_1hz'))} per stream-month**, added latency p99 "
        f"**{_s(d.get('added_latency_s'))}**.", "",
        "| window | messages / transaction | WRU / message | $ / stream-month at 1 msg/s "
        "| added latency p50 | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for window, c in d.get("curve", {}).items():
        lines.append(f"| {window} s | {_v(c.get('messages_per_transaction'))} | "
                     f"{_v(c.get('wru_per_message'))} | "
                     f"${_v(c.get('cost_per_stream_month_1hz'))} | "
                     f"{_s(c.get('latency_p50_s'))} | {_s(c.get('latency_p99_s'))} | "
                     f"{_s(c.get('latency_max_s'))} |")
    lines += ["", d.get("assumptions", ""), ""]
    return lines


def _correctness(section: dict[str, Any]) -> list[str]:
    keys = ("lost", "duplicated", "out_of_order", "stale_accepted", "fleet_caused_gaps")
    if not all(k in section for k in keys):
        return []
    return ["| lost | duplicated | out of order | stale writes accepted | fleet-caused gaps |",
            "|---|---|---|---|---|",
            "| " + " | ".join(str(section[k]) for k in keys) + " |", ""]


def _failover_rows(failover: dict[str, Any], kinds: list[tuple[str, str]],
                   targets_s: dict[str, float]) -> list[str]:
    lines = ["| fault | samples | p50 | p99 | max | target | not recovered |",
             "|---|---|---|---|---|---|---|"]
    for kind, label in kinds:
        f = failover.get(kind)
        if not f:
            continue
        target = f"p99 <= {targets_s[kind]:.2f} s" if kind in targets_s else "-"
        lines.append(f"| {label} | {f['samples']} | {_s(f['p50'])} | {_s(f['p99'])} | "
                     f"{_s(f['max'])} | {target} | {f['unrecovered']} |")
    return [*lines, ""]


def chaos_md(r: dict[str, Any]) -> list[str]:
    s = r["settings"]
    lines = [
        "## Chaos",
        "",
        f"{s['streams']} streams x {s['rate']} msg/s, {s['workers']} workers, lease "
        f"{s['lease']} s, heartbeat {s['heartbeat']} s, reconcile {s['reconcile']} s, skew "
        f"margin {s['skew']} s; DynamoDB: {r['dynamodb']}; {r['chaos_seconds']} s of chaos.",
        "",
        "Correctness (must all be 0):",
        "",
        *_correctness({**r, "fleet_caused_gaps": r.get("fleet_caused_gaps", 0)}),
        f"Stale writes rejected by the sink: {r['stale_rejected']}. Messages in the sink: "
        f"{r['messages_in_sink']}.",
        "",
        "Failover (fault until the stream delivers again, elsewhere):",
        "",
    ]
    lines += _failover_rows(r["failover"], [("kill9", "kill -9"), ("sigterm", "SIGTERM (deploy)"),
                                            ("pause", "SIGSTOP past the lease")],
                            r.get("failover_targets_s", {}))
    rpm = r["requests_per_stream_minute"]
    cost = r["cost_per_1000_streams_month_usd"]
    lines += [
        "DynamoDB requests per stream-minute (`heartbeat` = member heartbeats + stream "
        "renewals):",
        "",
        "| " + " | ".join(rpm) + " |",
        "|" + "---|" * len(rpm),
        "| " + " | ".join(f"{v:.2f}" for v in rpm.values()) + " |",
        "",
    ]
    if r.get("member_heartbeats_per_interval") is not None:
        lines += [f"Member heartbeats per worker per heartbeat interval: "
                  f"{r['member_heartbeats_per_interval']} (1.0 is one per interval; early beats "
                  "that report a changed count, a hand-over or a drain add to it, and so "
                  "would retries).", ""]
    lines += [
        f"Implied on-demand cost per 1,000 streams per month, at this run's settings: "
        f"**${cost['total']:,.2f}** (lease upkeep ${cost['lease_overhead']:,.2f}, sink "
        f"${cost['sink']:,.2f}). At the default settings (lease upkeep as the capacity "
        f"model counts it at 1,000 streams, the default batching, a rolling deploy a day): "
        f"**${r['cost_at_defaults_usd']['total']:,.2f}** (lease "
        f"upkeep ${r['cost_at_defaults_usd']['lease_overhead']:,.2f}). Assumptions: "
        f"{cost['assumptions']}.",
        "",
        f"DynamoDB requests during the run: {r['dynamodb_requests_per_s']}/s"
        + (" — near the embedded server's ~250/s ceiling: the store, not the worker, bounded "
           "this run." if r.get("store_was_bottleneck") else "."),
        "",
    ]
    if "rolling_restart_max_held" in r:
        lines += [f"Largest count one worker held after the last rolling restart: "
                  f"{r['rolling_restart_max_held']} of {s['streams']}.", ""]
    return lines


def tracing_md(r: dict[str, Any]) -> list[str]:
    """The ``tracing`` section: linked hand-offs (chaos, ``--tracing on``), the slowest
    hand-off's spans, and the throughput with tracing on / off (the ``tracing`` scenario)."""
    k = r["tracing"]
    lines = ["## Tracing", ""]
    if "handoffs" in k:
        lines += [
            f"Chaos run, spans exported over OTLP/HTTP to a receiver on loopback: "
            f"**{_v(k.get('handoffs_linked_count'))} of {_v(k.get('handoffs'))}** SIGTERM "
            "hand-offs (streams a worker released on SIGTERM, from its log) link the old "
            "holder's release span to an acquisition on the new holder and its first flush "
            f"(`tracing.handoffs_linked` {_v(k.get('handoffs_linked'))}); release start to "
            f"first flush end: {_v(k.get('handoff_ms'))} ms. kill -9 take-overs traced: "
            f"{_v(k.get('takeovers'))} ({_v(k.get('takeover_streams'))} streams). Spans "
            f"received: {_v(k.get('spans_received'))} ({_v(k.get('spans_by_name'))}).", ""]
        for u in k.get("unlinked") or []:
            lines.append(f"- not linked: {u.get('stream')} from {u.get('worker')}: "
                         f"{u.get('why')}")
        if k.get("unlinked"):
            lines.append("")
    for key, title in (("slowest_handoff", "Slowest SIGTERM hand-off"),
                       ("slowest_takeover", "Slowest kill -9 take-over")):
        t = k.get(key)
        if isinstance(t, dict):
            lines += [f"### {title}: {_trace_title(t)}", "", *_span_table(t), ""]
    if any(isinstance(k.get(x), dict) for x in ("slowest_handoff", "slowest_takeover")):
        lines += [f"Drawn in `{TRACE_PNG}`.", ""]
    tp = k.get("throughput")
    if isinstance(tp, dict):
        lines += [
            f"One worker, {_v(tp.get('streams'))} backlogged streams into the no-op Python "
            f"processor, {_v(tp.get('seconds'))} s a run, in the order "
            f"{', '.join(tp.get('order', []))}: tracing off {_v(get_path(tp, 'msgs_per_s.off'))} "
            f"msg/s, on ({tp.get('sampler', 'default sampling')}) "
            f"{_v(get_path(tp, 'msgs_per_s.on'))} msg/s: **{_v(k.get('throughput_ratio'))}** "
            f"(per worker CPU second: {_v(tp.get('cpu_ratio'))}); spans exported per run "
            f"with tracing on: {_v(tp.get('spans_per_run_on'))}.", ""]
    return lines


def _trace_title(t: dict[str, Any]) -> str:
    if t.get("kind") == "sigterm":
        return (f"stream {t.get('stream')}, {t.get('from')} -> {t.get('to')}, "
                f"{_v(t.get('total_ms'))} ms from release to first flush")
    return (f"{t.get('by')} took {_v(t.get('streams'))} streams of {t.get('member')}, "
            f"{_v(t.get('total_ms'))} ms from the kill to the last first flush")


def _span_table(t: dict[str, Any]) -> list[str]:
    lines = ["| span | worker | stream | start (ms) | duration (ms) | attributes |",
             "|---|---|---|---|---|---|"]
    if t.get("killed_ms") is not None:
        lines.append(f"| kill -9 of {t.get('member')} | - | - | {_v(t['killed_ms'])} | - | - |")
    for s in t.get("spans", []):
        lines.append(f"| {s.get('name')} | {s.get('worker')} | {s.get('stream') or '-'} | "
                     f"{_v(s.get('start_ms'))} | "
                     f"{_v(round(s.get('end_ms', 0) - s.get('start_ms', 0), 2))} | "
                     f"{_v(s.get('detail') or {})} |")
    return lines


def throughput_md(r: dict[str, Any]) -> list[str]:
    return [
        "## Throughput and cost of one worker",
        "",
        "| null sink | fenced sink | bare websockets client | null/bare | fenced/bare |",
        "|---|---|---|---|---|",
        f"| {r['msgs_per_s']['null_sink']:,} msg/s | {r['msgs_per_s']['fenced_sink']:,} msg/s | "
        f"{r['msgs_per_s']['bare_client']:,} msg/s | {r.get('null_sink_ratio')} | "
        f"{r.get('fenced_sink_ratio')} |",
        "",
        f"CPU: {r.get('cpu_seconds_per_1000_messages')} s per 1,000 messages, measured with "
        f"100 streams at 10 msg/s, a 5 s heartbeat and 2 s batches so the store is not the "
        f"limit ({r.get('cpu_phase_msgs_per_s')} msg/s delivered); with large batches (the "
        f"fenced-sink phase) {r.get('cpu_seconds_per_1000_messages_saturated')} s per 1,000 "
        "messages.",
        "",
        f"Memory: {_v(r.get('rss_bytes_per_stream'))} bytes resident per held idle stream "
        f"({r.get('idle_streams', 100)} streams whose upstream sends nothing, default heartbeat; "
        f"a worker holding none: {(r.get('worker_rss_idle_bytes') or 0) / 2**20:.0f} MiB).",
        "",
    ]


def sinks_md(r: dict[str, Any]) -> list[str]:
    sinks = r["sinks"]
    ran = {n: k for n, k in sinks.items()
           if isinstance(k, dict) and {"lost", "skipped", "error"} & set(k)}
    lines = ["## Sinks", ""]
    if ran:
        first = next((k for k in ran.values() if "streams" in k), {})
        lines += [
            f"Each sink through a chaos run of its own: {_v(first.get('streams'))} streams x "
            f"{_v(first.get('rate'))} msg/s, {_v(first.get('workers'))} workers, small-profile "
            "timings; one kill -9, one SIGSTOP past the lease then SIGCONT, one SIGTERM; then "
            "the destination read back against each stream's checkpoint. Duplicates within "
            "one tenure carry the same fence; at-least-once sinks may repeat a seq only "
            "across a takeover (two fences).",
            "",
            "| sink | guarantee | messages | lost | duplicated | dup outside takeover | "
            "out of order |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, k in ran.items():
            if "skipped" in k or "error" in k:
                what = f"skipped: {k['skipped']}" if "skipped" in k else f"**{k['error']}**"
                lines.append(f"| {name} | {k.get('guarantee', '-')} | {what} | | | | |")
                continue
            lines.append(f"| {name} | {k.get('guarantee', '-')} | {_v(k.get('messages'))} | "
                         + " | ".join(_v(k.get(f)) for f in ("lost", "duplicated",
                                                              "dup_outside_takeover",
                                                              "out_of_order")) + " |")
        lines.append("")
        lines += _run_notes(ran, (("mismatched", "copies not byte-identical"),
                                  ("unreadable", "unreadable records"),
                                  ("stale_refused", "stale-fence batches refused (409)"),
                                  ("sink_failures", "failed batch attempts"),
                                  ("failover_p99_s", "failover p99 (s)")))
    python = sinks.get("python") if isinstance(sinks.get("python"), dict) else {}
    if python.get("ratio_to_bare") is not None:
        lines += [f"No-op Python processor, one worker (throughput scenario, batches of up "
                  f"to {_v(python.get('batch_max_messages'))}): "
                  f"{_v(python.get('msgs_per_s_noop'))} msg/s, "
                  f"**{python['ratio_to_bare']}** of a bare websockets client.", ""]
    ddb = sinks.get("dynamodb") if isinstance(sinks.get("dynamodb"), dict) else {}
    if ddb.get("cost_error"):
        lines += [f"DynamoDB sink cost and latency: **{ddb['cost_error']}**", ""]
    return lines


def _run_notes(ran: dict[str, dict[str, Any]], figures: tuple[tuple[str, str], ...]) -> list[str]:
    """Per chaos run of a sink or an upstream mode, its non-zero ``figures`` and its
    workers' exits and logged warnings, one line each."""
    lines = []
    for name, k in ran.items():
        notes = [f"{label} {_v(k[key])}" for key, label in figures
                 if k.get(key) and (not isinstance(k[key], dict) or any(k[key].values()))]
        if k.get("worker_exits"):
            notes.append(f"workers that exited on their own: {len(k['worker_exits'])}")
        if k.get("log_events"):
            notes.append(f"warnings/errors logged: {_v(k['log_events'])}")
        if notes:
            lines.append(f"- {name}: " + "; ".join(notes))
    return [*lines, ""]


def upstreams_md(r: dict[str, Any]) -> list[str]:
    u = r["upstreams"]
    ran = {m: u[m] for m in UPSTREAM_MODES if isinstance(u.get(m), dict)}
    lines = ["## Upstream profiles", ""]
    if ran:
        first = next((k for k in ran.values() if "streams" in k), {})
        lines += [
            f"Each resume mode through a chaos run of its own: {_v(first.get('streams'))} "
            f"streams of one test feed of `streamlease dev upstream` x "
            f"{_v(first.get('rate'))} msg/s, {_v(first.get('workers'))} workers, the feed's "
            "profile from `examples/profiles.toml`, the `dynamodb` sink, small-profile "
            "timings; the upstream drops a few streams' connections, then one kill -9, one "
            "SIGSTOP past the lease, one SIGTERM; then the events read back against the "
            "feed's own numbering. A feed that cannot replay loses what it sends while no "
            "connection is open: every such loss must lie inside a recorded gap (a gap "
            "record between the messages delivered before and after it).",
            "",
            "| mode | feed, profile | messages | lost | duplicated | out of order | "
            "gap records | lost inside a gap | loss in gaps |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for mode, k in ran.items():
            where = f"/{k.get('feed', '?')}/, {k.get('profile', '?')}"
            if "error" in k:
                lines.append(f"| {mode} | {where} | **{k['error']}** | | | | | | |")
                continue
            share = k.get("loss_in_gaps")
            lines.append(f"| {mode} | {where} | {_v(k.get('messages'))} | "
                         + " | ".join(_v(k.get(f)) for f in ("lost", "duplicated",
                                                              "out_of_order", "gap_records",
                                                              "lost_in_gaps"))
                         + f" | {'-' if share is None else f'{100 * share:.1f} %'} |")
        lines.append("")
        lines += _run_notes(ran, (("mismatched", "copies not the feed's frame"),
                                  ("seq_differs", "seqs not the feed's number"),
                                  ("stale_accepted", "stale writes accepted"),
                                  ("lost_outside_gaps", "lost outside a recorded gap"),
                                  ("gap_ranges_wrong", "gap records whose missing range is wrong"),
                                  ("upstream_gaps_counted", "gap records counted, by reason"),
                                  ("malformed_frames", "malformed frames"),
                                  ("failover_p99_s", "failover p99 (s)")))
    t = u.get("profile_throughput") if isinstance(u.get("profile_throughput"), dict) else {}
    if t:
        rate, cpu = t.get("msgs_per_s") or {}, t.get("msgs_per_cpu_s") or {}
        lines += [
            f"Profile cost, one worker over {_v(t.get('streams'))} backlogged streams into a "
            f"no-op Python processor (batches of up to {_v(t.get('batch_max_messages'))}), "
            f"{_v(t.get('rounds'))} alternating round(s) of {_v(t.get('seconds'))} s: built-in "
            f"protocol on `/streams/` {_v(rate.get('streams'))} msg/s; `gateway` profile "
            f"(identify, seq at `/d/s`, keepalive acks skipped) {_v(rate.get('gateway'))} "
            f"msg/s, **{_v(u.get('profile_ratio'))}** of the built-in; `subscribe` profile "
            f"(a heartbeat after every 5 data frames) {_v(rate.get('subscribe'))} msg/s, "
            f"{_v(u.get('profile_ratio_subscribe'))}. Per second of the worker's own CPU: "
            f"{_v(cpu.get('streams'))} / {_v(cpu.get('gateway'))} / "
            f"{_v(cpu.get('subscribe'))} messages (gateway {_v(t.get('cpu_ratio'))}, "
            f"subscribe {_v(t.get('cpu_ratio_subscribe'))}); machine load average "
            f"{_v(t.get('load_average'))} (before, after). The same `/streams/` frames read "
            f"through a profile (seq at `/seq`, a skip rule) instead of the built-in parser: "
            f"{_v(rate.get('same_feed'))} msg/s, **{_v(u.get('profile_ratio_same_feed'))}** "
            f"(CPU {_v(t.get('cpu_ratio_same_feed'))}): the profile machinery alone, apart "
            "from the size of another feed's frames.",
            "",
        ]
    if u.get("profile_ratio_error"):
        lines += [f"Profile throughput: **{u['profile_ratio_error']}**", ""]
    return lines


def _churn(section: dict[str, Any]) -> list[str]:
    lines = []
    for key, label in (("move_details", "moves"), ("leases_lost", "leases lost, by reason"),
                       ("leases_released_while_running",
                        "leases released, by reason (counted before each SIGTERM)"),
                       ("member_heartbeats", "member heartbeats, by outcome"),
                       ("log_events", "warnings and errors in the worker logs"),
                       ("fence_bumps", "fence increments after the first tenure"),
                       ("members_declared_dead", "members declared dead by a peer"),
                       ("member_fenced", "workers that found their epoch moved on"),
                       ("member_heartbeat_p99_s_bucket", "member heartbeat p99 (bucket bound, s)"),
                       ("dynamodb_request_p99_s_bucket", "DynamoDB request p99 (bucket bound, s)")):
        if key in section:
            lines.append(f"- {label}: {_v(section[key])}")
    for key, label in (("stalled_streams", "streams that delivered nothing while observed"),
                       ("stalled_streams_after",
                        "streams that delivered nothing in the 30 s after")):
        if section.get(key):
            lines.append(f"- {label}: **{len(section[key])}** ({', '.join(section[key][:8])}"
                         + (", ..." if len(section[key]) > 8 else "") + ")")
    if section.get("untracked_leases_in_window"):
        lines.append("- leases the table gave a live worker beyond its own count at the end "
                     f"of the window: {_v(section['untracked_leases_in_window'])}")
    if section.get("untracked_leases"):
        lines.append("- leases the table gives a live worker beyond its own count (acquired "
                     f"but not served): {_v(section['untracked_leases'])}")
    if section.get("unheld_at_end"):
        lines.append(f"- streams no live worker held at the end: "
                     f"{section.get('unheld_at_end_count', len(section['unheld_at_end']))}, "
                     f"e.g. {section['unheld_at_end'][:3]}")
    if section.get("worker_exits"):
        lines.append(f"- workers that exited on their own: {section['worker_exits']}")
    return [*lines, ""]


def index_lag_md(r: dict[str, Any]) -> list[str]:
    k = r["index_lag"]
    worst = k.get("unserved_worst") or {}
    hints = k.get("index_hints") or {}
    return [
        "## Index lag",
        "",
        f"The chaos schedule again, every index read {_v(k.get('index_lag_ms'))} ms behind "
        "the table (as DynamoDB's global secondary indexes can be under load).",
        "",
        f"Longest a stream stayed leased to a live, running worker without delivering: "
        f"**{_s(k.get('unserved_max_s'))}** (target {_s(k.get('unserved_target_s'))}"
        + (f"; {worst.get('stream')} on {worst.get('owner')}, fence {worst.get('fence')}, "
           f"at {worst.get('at')} s" if worst else "") + "). "
        f"Leases released by the self-audit: {_v(k.get('unserved_released'))}; index hints "
        f"ignored as stale {_v(hints.get('stale_fence'))}, confirmed "
        f"{_v(hints.get('confirmed'))}, dismissed by a consistent read "
        f"{_v(hints.get('dismissed'))}; leases lost to a refused condition "
        f"{_v(k.get('lease_lost_condition_failed'))}.",
        "",
        f"kill -9 failover p99 {_s(k.get('kill9_p99'))} (target "
        f"{_s(k.get('kill9_target_s'))}); SIGTERM hand-off p99 "
        f"{_s((k.get('sigterm') or {}).get('p99'))}.",
        "",
        *_correctness(k),
    ]


def skew_md(r: dict[str, Any]) -> list[str]:
    k = r["skew"]
    if "skipped" in k:
        return ["## Clock skew", "", f"Skipped: {k['skipped']}", ""]
    return [
        "## Clock skew",
        "",
        f"{k['workers']} workers, {k['streams']} streams, lease {k['lease_s']} s; "
        f"{k['skewed_worker']} under `faketime -f {k['offset']}` (its member row showed its "
        f"clock {_v(k.get('measured_offset_s'))} s off), observed {k['observed_s']:.0f} s "
        f"after every stream was held ({_s(k.get('all_held_s'))}).",
        "",
        f"Settled (no move in the last 20 s): **{_v(k['settled'])}**; moves while observed "
        f"(from when the fleet was even, after {_v(k.get('moves_while_balancing'))} "
        f"balancing hand-overs): **{k['moves']}** ({k['moves_in_last_20_s']} in the last "
        f"20 s); the skewed "
        f"worker held {_v(k.get('skewed_worker_held_at_end'))} at the end "
        f"({_v(k.get('held_at_end'))}).",
        "",
        *_correctness(k),
        *_churn(k),
    ]


def deploy_md(r: dict[str, Any]) -> list[str]:
    k = r["deploy"]
    return [
        "## Rolling deploy",
        "",
        f"{_v(k.get('workers'))} workers replaced one at a time (the new one ready, then "
        f"SIGTERM of the old), {_v(k.get('streams'))} streams x {_v(k.get('rate'))} msg/s, "
        f"batch window {_s(k.get('batch_max_s'))}; {_v(k.get('moves'))} moves in "
        f"{_s(k.get('deploy_s'))} (load average {_v(k.get('load_1m'))}). Longest delivery "
        f"gap of a stream: p50 "
        f"{_s(k.get('max_gap_p50_s'))}, p99 **{_s(k.get('max_gap_p99_s'))}**, max "
        f"{_s(k.get('max_gap_max_s'))} ({k.get('worst_stream')}); in the steady window before, "
        f"p99 {_s(k.get('steady_max_gap_p99_s'))}. Latency spike over the steady median "
        f"({_s(k.get('steady_latency_p50_s'))}): p99 {_s(k.get('latency_spike_p99_s'))}, max "
        f"{_s(k.get('latency_spike_max_s'))}. Lost {_v(k.get('lost'))}, duplicated "
        f"{_v(k.get('duplicated'))}, out of order {_v(k.get('out_of_order'))}, stale "
        f"accepted {_v(k.get('stale_accepted'))}.",
        "",
    ]


def slow_store_md(r: dict[str, Any]) -> list[str]:
    k = r["slow_store"]
    if "skipped" in k:
        return ["## Slow store", "", f"Skipped: {k['skipped']}", ""]
    lines = [
        "## Slow store",
        "",
        f"{k['workers']} workers, {k['streams']} streams x {k['rate']} msg/s, every request "
        f"held {k['latency_ms']:g} ms ({k['latency_mode']}: "
        + ("inside the server's lock, a saturated store of at most "
           f"{1000 / k['latency_ms']:.0f} requests/s" if k["latency_mode"] == "serial"
           else "before the server's lock, a slow network") +
        f"); all held after {_s(k.get('all_held_s'))}, then observed {k['observed_s']:.0f} s.",
        "",
        f"Moves after each stream's first owner: **{k['moves']}** "
        f"({k['moves_in_window']} in the observed window). Held at its end: "
        f"{_v(k.get('held_at_end_of_window'))}.",
        "",
        "Then a rolling restart (new worker, SIGTERM of an old one), each hand-off timed:",
        "",
    ]
    lines += _failover_rows({"sigterm": k.get("sigterm")}, [("sigterm", "SIGTERM, slow store")],
                            {"sigterm": 1.0})
    return lines + _correctness(k) + _churn(k)


def balance_md(r: dict[str, Any]) -> list[str]:
    k = r["balance"]
    startup = balance_startup_md(k["during_startup"]) \
        if isinstance(k.get("during_startup"), dict) else []
    if "streams" not in k:  # only the start-up step ran
        return ["## Balance", "", *startup]
    conv = k.get("converge_s")
    lines = [
        "## Balance",
        "",
        f"{k['streams']} streams on {k['workers_before']} workers (held after "
        f"{_s(k.get('all_held_s'))}: {_v(k.get('before_scale_out'))}), then "
        f"{k['workers_after']}: share {k['share']} each.",
        "",
        ("Converged after **" + _s(conv) + "**: the last move of the convergence, after "
         "which every worker held its share +/-1 with no move for 30 s (first inside the "
         f"band after {_s(k.get('first_in_band_s'))}; "
         f"{_v(k.get('moves_after_first_in_band'))} hand-overs already in flight landed "
         "after that)." if conv is not None
         else f"**Not converged** within {k['timeout_s']:.0f} s: state reached "
              f"{_v(k.get('state_reached'))} (best spread max - min: "
              f"{_v(k.get('best_spread'))})."),
        f"Moves during {'convergence' if conv is not None else 'that wait'}: {k['moves']}; "
        f"in the 30 s after ({k.get('moves_after_from')}): {k['moves_after']}; counts then "
        f"{_v(k.get('after_30_s'))}.",
        "",
        f"Rolling restart of every worker, one at a time: at its end "
        f"{_v(k.get('after_rolling_restart'))}, largest "
        f"**{_v(k.get('after_rolling_restart_max'))}** "
        f"(target <= {k.get('after_rolling_restart_target')}).",
        "",
    ]
    lines += _failover_rows({"sigterm": k.get("sigterm")},
                            [("sigterm", "SIGTERM (rolling restart)")], {"sigterm": 1.0})
    return lines + _correctness(k) + _churn(k) + startup


def balance_startup_md(k: dict[str, Any]) -> list[str]:
    """The ``balance_startup`` scenario: scale-out while the first workers still start."""
    conv = k.get("converge_s")
    worst = k.get("unowned_worst") or {}
    lines = [
        "### Scale-out during start-up", "",
        f"{k.get('streams')} streams, lease {_v(k.get('lease_s'))} s; 2 workers started, 2 "
        f"more as soon as the first stream was held ({_s(k.get('first_held_s'))}; held then: "
        f"{_v(k.get('held_at_scale_out'))}); share {k.get('share')} each.", "",
        ("Every worker inside its share +/-1 for good after **" + _s(conv) + "** from the "
         f"new workers' start (first inside after {_s(k.get('first_in_band_s'))})"
         if conv is not None else
         f"**Not converged** (no {_v(k.get('quiet_s'))} s in the band within "
         f"{_v(k.get('timeout_s'))} s): state reached {_v(k.get('state_reached'))}")
        + f"; moves until then: **{_v(k.get('moves'))}** ({k.get('moves_are', 'new tenures')}"
        f"), after: {_v(k.get('moves_after_converged'))}.", "",
        f"Longest a stream was leased to no running worker after the new workers started: "
        f"**{_s(k.get('unowned_max_s'))}**"
        + (f" ({worst.get('stream')}, {worst.get('kind')}, {worst.get('from')} -> "
           f"{worst.get('to')} s{', still open' if worst.get('open') else ''})" if worst else "")
        + f"; by kind {_v(k.get('unowned_max_s_by_kind'))}; spells over 2 s: "
        f"{_v(k.get('unowned_over_2_s'))} (table read every {_v(k.get('read_interval_s'))} s: "
        "the resolution).", "",
    ]
    return lines + _correctness(k) + _churn(k) + [""]


# The change_feed scenario's figures with a target: key, label, target, bound.
CHANGE_FEED_TARGETS = (
    ("handwritten_p99", "hand-written item -> delivering, p99 (defaults)", "<= 3 s", 3.0),
    ("stopped_p99", "STOPPED flip -> released, p99 (defaults)", "<= 2 s", 2.0),
    ("url_change_p99", "`ws_url` change -> connected to the new URL, p99 (defaults)",
     "<= 3 s", 3.0),
    ("reads_per_stream_minute", "streams-table read requests per held stream-minute, quiet "
     "window (defaults)", "<= 0.05", 0.05),
    ("lost_changes", "leader killed while changes are written: changes never acted on",
     "0", 0.0),
)


def change_feed_md(r: dict[str, Any]) -> list[str]:
    """The ``change_feed`` scenario: each figure with the feed off (before) and on (after)."""
    k = r["change_feed"]
    on = k if "mode" in k else {}
    off = k.get("off") if isinstance(k.get("off"), dict) else {}
    first = on or off
    lines = [
        "## Change feed", "",
        f"{_v(first.get('workers'))} workers, {_v(first.get('streams_seeded'))} streams seeded "
        f"and {_v(first.get('changes_per_kind'))} changes of each kind at "
        f"{_v(first.get('rate'))} msg/s, default settings, index reads "
        f"{_v(first.get('index_lag_ms'))} ms (+ up to {_v(first.get('index_lag_jitter_ms'))} "
        "ms) behind the table; a fleet per mode (`STREAMLEASE_CHANGE_FEED`; the feed-off "
        "figures are the same keys under `change_feed.off`). Times from the "
        f"write, polled every {_v(first.get('poll_s'))} s; a change not acted on within the "
        "wait ranks above every timed one (`-`: the p99 is one of them).", "",
        "| figure | JSON key (on) | feed off (before) | feed on (after) | target |",
        "|---|---|---|---|---|",
    ]

    def row(label: str, key: str, target: str, fmt: Any = _s) -> None:
        lines.append(f"| {label} | `change_feed.{key}` | "
                     f"{fmt(get_path(off, key)) if off else 'not run'} | "
                     f"{fmt(get_path(on, key)) if on else 'not run'} | {target} |")

    for key, label, target, _bound in CHANGE_FEED_TARGETS:
        row(label, key, target, _s if key.endswith("_p99") else _v)
        if key == "handwritten_p99":
            row("hand-written item -> connected to the upstream, p99",
                "handwritten_connected.p99", "-")
        if key == "reads_per_stream_minute":
            row("read requests per held stream-minute, every table (the workers' counter)",
                "quiet.reads_per_stream_minute_all_tables", "-", _v)
        if key == "lost_changes":
            row("leader killed: until another worker leads", "leader_kill.new_leader"
                ".after_kill_s", "-")
    lines.append("")
    for mode, m in (("off", off), ("on", on)):
        if m:
            lines += _change_feed_mode_md(mode, m)
    return lines


def _change_feed_mode_md(mode: str, m: dict[str, Any]) -> list[str]:
    quiet = m.get("quiet") or {}
    kill = m.get("leader_kill") or {}
    records = m.get("feed_records") or {}
    lines = [
        f"### Feed {mode}", "",
        f"- change-feed records the workers counted: {_v(records) if records else 'none'}"
        + ("" if records else " (the feed did nothing in this run)")
        + (f"; feed errors: {_v(m['feed_errors'])}" if m.get("feed_errors") else ""),
        f"- all {_v(m.get('streams_seeded'))} streams held after {_s(m.get('all_held_s'))}",
    ]
    for kind in ("handwritten", "stopped", "url_change"):
        t = m.get(kind) or {}
        lines.append(f"- {kind.replace('_', ' ')}: p50 {_s(t.get('p50'))}, p99 "
                     f"{_s(t.get('p99'))}, max {_s(t.get('max'))}, timed {_v(t.get('samples'))}"
                     + (f", **never acted on: {', '.join(t['unacted'])}**"
                        if t.get("unacted") else ""))
    lines.append(
        f"- quiet window {_v(quiet.get('window_measured_s'))} s, "
        f"{_v(quiet.get('held_streams'))} streams held, moves "
        f"{_v(quiet.get('moves_in_window'))}: streams-table reads "
        f"{_v(quiet.get('streams_table_reads')) if quiet.get('streams_table_reads') else 'none'}"
        f"; the workers' own read count (every table): "
        f"{_v(quiet.get('worker_counted_reads_all_tables')) or 'none'}; counted "
        f"{quiet.get('counted', '-')}")
    if kill.get("error"):
        lines.append(f"- leader kill: **{kill['error']}**")
    elif kill:
        new = kill.get("new_leader") or {}
        lines.append(
            f"- leader {kill.get('leader')} killed at {_v(kill.get('killed_at_s'))} s, halfway "
            f"through {_v(kill.get('written'))} changes in {_v(kill.get('span_s'))} s "
            f"({_v(kill.get('by_kind'))}); next leader {new.get('worker', '-')} after "
            f"{_s(new.get('after_kill_s'))}; changes never acted on within "
            f"{_v(kill.get('recovery_bound_s'))} s of the last write: "
            f"**{_v(kill.get('lost_changes'))}**"
            + (f" ({', '.join(kill['lost'])})" if kill.get("lost") else ""))
    if m.get("write_failures"):
        lines.append(f"- writes that failed (not counted as changes): {m['write_failures']}")
    return [*lines, "", *_correctness(m)]


def kill9_defaults_md(r: dict[str, Any]) -> list[str]:
    """The ``kill9_defaults`` scenario: kill -9 at the worker's default settings."""
    k = r["kill9_defaults"]
    lines = [
        "## kill -9 at the default settings", "",
        f"{k.get('workers')} workers, {_v(k.get('streams'))} streams in all at "
        f"{_v(k.get('rate'))} msg/s, default settings (all held after "
        f"{_s(k.get('all_held_s'))}); {_v(k.get('kills'))} kills, each of the worker "
        "holding the most (streams: "
        f"{', '.join(str(x.get('streams')) for x in k.get('kills_detail', []))}); "
        f"{k.get('replacement', '')}. Timed until each stream delivers again under another "
        "holder (the default batch window included), and until the upstream sees it "
        "connected again:", "",
    ]
    lines += _failover_rows({"kill9": k.get("kill9"), "kill9_connected": k.get("kill9_connected")},
                            [("kill9", "kill -9, delivers again"),
                             ("kill9_connected", "kill -9, connected again")], {"kill9": 10.0})
    return lines + _correctness(k) + _churn(k)


def jobs_md(r: dict[str, Any]) -> list[str]:
    k = r["jobs"]
    lines = [
        "## Singleton jobs",
        "",
        f"A job every {_v(k.get('every_s'))} s on {k.get('workers')} workers (lease "
        f"{_v(k.get('lease_s'))} s, reconcile {_v(k.get('reconcile_s'))} s); each run sleeps "
        f"{_v(k.get('job_delay_s'))} s, then writes one item for its slot with `streamlease "
        f"job write`. {_v(k.get('steady_before_s'))} s steady; the leader and its job "
        "SIGSTOPped early in a run until another worker has led and run two slots, then "
        "SIGCONT (the job first, so its write goes out while its leader is still stopped); "
        "kill -9 of the leader early in a run; a rolling SIGTERM restart; "
        f"{_v(k.get('steady_after_s'))} s steady. Start delays count only slots due outside "
        f"each fault and the {_v(k.get('settle_s'))} s after it.",
        "",
        "| slots run twice | stale-leader writes accepted | new leader after kill -9 | "
        "start delay p99, steady |",
        "|---|---|---|---|",
        f"| {_v(k.get('double_runs'))} | {_v(k.get('stale_accepted'))} | "
        f"{_s(k.get('leader_failover_s'))} (target <= "
        f"{_v(k.get('leader_failover_target_s'))} s) | {_s(k.get('start_delay_p99_s'))} |",
        "",
    ]
    if "runs" in k:
        lines += [
            f"- runs: {_v(k['runs'])} ({_v(k.get('outcomes'))}); side-table items: "
            f"{_v(k.get('side_items'))}; slots with no run between the first and the last: "
            f"{_v(k.get('skipped_slots'))} ({_v(k.get('skipped_in_steady_state'))} in steady "
            "state)" + (f": {', '.join(k['skipped'])}" if k.get("skipped") else ""),
            f"- start delay over {_v(k.get('steady_slots'))} steady slots: p50 "
            f"{_s(k.get('start_delay_p50_s'))}, p99 {_s(k.get('start_delay_p99_s'))}, max "
            f"{_s(k.get('start_delay_max_s'))}; over every slot, p99 "
            f"{_s(k.get('start_delay_p99_all_slots_s'))}",
        ]
    for key, label in (("slots_written_twice", "slots written twice"),
                       ("slots_claimed_twice", "slots claimed twice"),
                       ("items_without_run", "items for a slot no run claimed"),
                       ("succeeded_without_item", "runs that succeeded but wrote nothing"),
                       ("written_by_runs_not_succeeded",
                        "items written by runs not recorded as succeeded (written before "
                        "their leader was stopped)")):
        if k.get(key):
            lines.append(f"- {label}: **{len(k[key])}** ({', '.join(k[key][:5])})")
    if "stale_fence_mismatch" in k:
        watch = k.get("side_watch") or {}
        lines.append(f"- stale writes accepted, by how they were found: fence not the run's "
                     f"{_v(k['stale_fence_mismatch'])}, written after a newer leader's fence "
                     f"was read {_v(k.get('stale_written_after_superseded'))} (side table "
                     f"read {_v(watch.get('scans'))} times, every {_v(watch.get('every_s'))} s)")
    pause = k.get("pause") or {}
    if pause.get("error"):
        lines.append(f"- pause: **{pause['error']}**")
    elif pause:
        saw = pause.get("runner_saw") or {}
        lines.append(
            f"- pause: {pause.get('worker')} stopped early in slot {pause.get('slot')} (fence "
            f"{pause.get('fence')}) for {_s(pause.get('paused_s'))}; "
            f"{pause.get('new_leader') or 'no worker'} led after "
            f"{_s(pause.get('new_leader_after_s'))}; its job resumed first and "
            + ("exited" if pause.get("job_exited_before_its_leader_resumed")
               else "**had not exited**")
            + f" before it resumed (its leader saw {_v(saw.get('outcome'))}, exit code "
            f"{_v(saw.get('exit_code'))}); the slot is recorded "
            f"**{_outcome(pause)}** with "
            f"{_v(pause.get('slot_items'))} item(s) written")
    kill = k.get("kill9") or {}
    if kill.get("error"):
        lines.append(f"- kill -9: **{kill['error']}**")
    elif kill:
        lines.append(f"- kill -9 of the leader {kill.get('worker')}"
                     + (f" early in slot {kill['slot']} (its job left running)"
                        if kill.get("slot") else "")
                     + f": {kill.get('new_leader') or 'no worker'} led after "
                     f"{_s(kill.get('failover_s'))}"
                     + (f"; the slot is recorded {_outcome(kill)} with "
                        f"{_v(kill.get('slot_items'))} item(s) written"
                        if kill.get("slot") else ""))
    handoffs = (k.get("rolling_restart") or {}).get("sigterm_leader_handoffs") or []
    for h in handoffs:
        lines.append(f"- rolling restart, SIGTERM of the leader {h.get('worker')}: "
                     f"{h.get('new_leader') or 'no worker'} led after {_s(h.get('handoff_s'))}")
    for key, label in (("job_runs_by_metrics", "job runs by outcome, as the workers count them"),
                       ("leader_changes", "times a worker became the leader"),
                       ("two_leaders_seen_at_once",
                        "polls in which two workers said they led"),
                       ("log_events", "warnings and errors in the worker logs")):
        if key in k:
            lines.append(f"- {label}: {_v(k[key])}")
    if k.get("worker_exits"):
        lines.append(f"- workers that exited on their own: {k['worker_exits']}")
    return [*lines, ""]


def _outcome(fault: dict[str, Any]) -> str:
    return str(fault.get("slot_outcome") or "without an outcome")


def scale_md(r: dict[str, Any]) -> list[str]:
    k = r["scale"]
    reads = scale_reads_md(k)
    if "streams" not in k:  # only the reads step ran
        return ["## Scale", "", *reads]
    per = k.get("requests_per_s_per_1000_streams", {})
    rates = k.get("rates", {})
    kill = k.get("kill9") or {}
    growth = k.get("per_worker_read_growth_modelled") or {}
    lines = [
        "## Scale",
        "",
        f"{k['streams']:,} idle streams on {k['workers']} workers, default timings (raised: "
        f"{_v(k.get('raised_settings'))}). All held after {_s(k.get('all_held_s'))}, all "
        f"connected upstream after {_s(k.get('all_connected_s'))}.",
        "",
        f"Store requests/s per 1,000 held streams, over {_v(k.get('window_measured_s'))} s "
        f"with {_v(k.get('held_streams_in_window'))} held (total "
        f"{_v(k.get('requests_per_s_total'))}/s):",
        "",
        "| " + " | ".join(per) + " |",
        "|" + "---|" * len(per),
        "| " + " | ".join(_v(v) for v in per.values()) + " |",
        "",
        f"Rates: {_v(rates)}. Worker CPU seconds in the window: "
        f"{_v(k.get('worker_cpu_s_in_window'))}; resident memory (MB): "
        f"{_v(k.get('worker_rss_mb'))}; upstream process {_v(k.get('upstream_rss_mb'))} MB.",
        "",
    ]
    if growth:
        per = growth.get("items_per_worker_minute", {})
        lines += [f"Control-plane items read per worker-minute, 8 workers over 2, "
                  f"**modelled** from the code (`per_worker_read_growth_modelled`): "
                  f"{_v(growth.get('value'))} ({_v(per.get('2'))} -> {_v(per.get('8'))}).", ""]
    if "index_moves_per_stream_minute" in k:
        lines += [f"Index-key moves per held stream-minute: "
                  f"**{_v(k['index_moves_per_stream_minute'])}** ({k.get('index_moves_source')}"
                  f"); lease writes per stream-minute in the window: "
                  f"{_v(k.get('lease_writes_per_stream_minute'))}.", ""]
    if kill:
        lines += [
            f"kill -9 of {kill.get('victim')} holding {kill.get('streams')} streams (recovered = "
            f"{k.get('failover_recovery')}):",
            "",
            *_failover_rows({"kill9": kill}, [("kill9", "kill -9, scale")], {}),
        ]
    return lines + _correctness(k) + _churn(k) + reads


def scale_reads_md(k: dict[str, Any]) -> list[str]:
    """The ``scale_reads`` scenario: control-plane items read per worker-minute, 2 and 8
    workers holding the same streams each."""
    reads = k.get("reads")
    if not isinstance(reads, dict):
        return []
    lines = [
        "### Control-plane reads per worker", "",
        f"{_v(reads.get('streams_per_worker'))} idle streams per worker, default settings, "
        f"a {_v(reads.get('window_s'))} s quiet window per fleet; counted: "
        f"{reads.get('counted', '-')}. Growth, 8 workers over 2: "
        f"**{_v(k.get('per_worker_read_growth'))}** (the leader alone: "
        f"{_v(k.get('leader_read_growth'))}; the other members: "
        f"{_v(k.get('per_member_read_growth'))}).", "",
        "| workers | items read / worker-minute | by operation | read requests / "
        "worker-minute | the leader | each other member |", "|---|---|---|---|---|---|",
    ]
    for workers, run in (reads.get("runs") or {}).items():
        roles = run.get("roles") or {}
        lines.append(f"| {workers} | {_v(run.get('items_per_worker_minute'))} | "
                     f"{_v(run.get('items_per_worker_minute_by_operation'))} | "
                     f"{_v(run.get('read_requests_per_worker_minute'))} | "
                     f"{_v((roles.get('leader') or {}).get('items_per_worker_minute'))} | "
                     f"{_v((roles.get('members') or {}).get('items_per_worker_minute'))} |")
    return [*lines, ""]


# -- the chart ----------------------------------------------------------------------------


def worker_order(worker: str) -> tuple[int, str]:
    digits = worker.lstrip("w")
    return (int(digits), worker) if digits.isdigit() else (1 << 30, worker)


def timeline_png(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [name for name, key in (("chaos", "timeline"), ("balance", "balance.timeline"),
                                     ("scale", "scale.timeline")) if get_path(r, key)]
    fig, axes = plt.subplots(max(1, len(panels)), 1, figsize=(12, 4.5 * max(1, len(panels))),
                             dpi=100, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=False):
        if panel == "chaos":
            _stack(ax, r["timeline"], r.get("faults", []),
                   f"chaos: streams owned per worker ({r['settings']['streams']} streams); "
                   "dashed lines: faults")
        elif panel == "balance":
            _spread(ax, r["balance"])
        else:
            _stack(ax, r["scale"]["timeline"], r["scale"].get("faults", []),
                   f"scale: streams held per worker ({r['scale']['streams']:,} streams, "
                   "each worker's leases_held gauge)")
    if not panels:
        axes[0, 0].text(0.5, 0.5, "no timeline in this run", ha="center", va="center")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _stack(ax: Any, timeline: list[Any], faults: list[dict[str, Any]], title: str) -> None:
    import matplotlib.pyplot as plt

    workers = sorted({w for _, owned in timeline for w in owned}, key=worker_order)
    times = [t for t, _ in timeline]
    stacks = [[owned.get(w, 0) for _, owned in timeline] for w in workers]
    if stacks:
        palette = plt.get_cmap("tab20")
        ax.stackplot(times, stacks, labels=workers, alpha=0.85,
                     colors=[palette(i % 20) for i in range(len(workers))])
    colors = {"kill9": "red", "sigterm": "blue", "pause": "purple", "drop": "gray"}
    seen: set[str] = set()
    for fault in faults:
        label = fault["kind"] if fault["kind"] not in seen else None
        seen.add(fault["kind"])
        ax.axvline(fault["at"], color=colors.get(fault["kind"], "black"), linestyle="--",
                   linewidth=1, label=label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("streams owned")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)


def _spread(ax: Any, b: dict[str, Any]) -> None:
    """Streams per worker over time, the fair share as live workers change, the
    max - min spread, and the scale events: evening out shows as lines closing in."""
    import matplotlib.pyplot as plt

    timeline = b["timeline"]
    times = [t for t, _ in timeline]
    workers = sorted({w for _, owned in timeline for w in owned}, key=worker_order)
    palette = plt.get_cmap("tab20")
    for i, w in enumerate(workers):
        ax.step(times, [owned.get(w, math.nan) for _, owned in timeline], where="post",
                color=palette(i % 20), label=w, linewidth=1.4)
    spread = [max(owned.values()) - min(owned.values()) if owned else 0
              for _, owned in timeline]
    ax.fill_between(times, 0, spread, step="post", color="red", alpha=0.12,
                    label="spread (max - min)")
    live = b.get("live_workers") or []
    if live:
        ax.step([t for t, _ in live], [math.ceil(b["streams"] / n) if n else math.nan
                                       for _, n in live],
                where="post", color="black", linestyle=":", linewidth=1.5, label="fair share")
    for t, label in b.get("events", []):
        if label.startswith(("scale-out", "rolling", "sigterm", "exit")):
            ax.axvline(t, color="blue" if label.startswith("sigterm") else "black",
                       linestyle="--", linewidth=0.8)
            if not label.startswith("sigterm"):
                ax.annotate(label, (t, ax.get_ylim()[1] if ax.get_ylim()[1] > 1 else 1),
                            fontsize=7, rotation=90, va="top", ha="right")
    conv = b.get("converge_s")
    converged = "never" if conv is None else f"after {conv:.1f} s"
    ax.set_title(f"balance: streams per worker ({b['streams']} streams, 2 -> 4 workers, then a "
                 f"rolling restart); converged {converged}; dashed: events")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("streams held")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)


# -- the trace picture --------------------------------------------------------------------


def trace_panels(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The span timelines the run kept (slowest hand-off, slowest take-over)."""
    section = r.get("tracing")
    if not isinstance(section, dict):
        return []
    return [t for key in ("slowest_handoff", "slowest_takeover")
            if isinstance(t := section.get(key), dict) and t.get("spans")]


def trace_png(r: dict[str, Any], path: Path) -> None:
    """Each kept timeline as a panel: one bar a span (colour: the worker), in start order;
    arrows for links (release -> the acquisition linked to it); the kill as a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = trace_panels(r)
    heights = [max(2.0, 0.38 * len(t["spans"]) + 1.4) for t in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, sum(heights)), dpi=100,
                             squeeze=False, gridspec_kw={"height_ratios": heights})
    for ax, t in zip(axes[:, 0], panels, strict=True):
        _span_panel(ax, t, plt.get_cmap("tab10"))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _span_panel(ax: Any, t: dict[str, Any], palette: Any) -> None:
    spans = t["spans"]
    workers = sorted({str(s.get("worker")) for s in spans}, key=worker_order)
    color = {w: palette(i % 10) for i, w in enumerate(workers)}
    end = max([s["end_ms"] for s in spans] + [t.get("killed_ms") or 0.0])
    start = min([s["start_ms"] for s in spans] + [t.get("killed_ms") or 0.0])
    width = max(end - start, 1e-3)
    for row, s in enumerate(spans):
        length = s["end_ms"] - s["start_ms"]
        ax.barh(row, max(length, width * 0.003), left=s["start_ms"], height=0.6,
                color=color[str(s.get("worker"))], edgecolor="black", linewidth=0.4)
        ax.text(s["end_ms"] + width * 0.005, row, f"{length:.1f} ms", va="center", fontsize=7)
    for source, target in t.get("links", []):
        a, b = spans[source], spans[target]
        ax.annotate("", xy=(b["start_ms"], target), xytext=(a["end_ms"], source),
                    arrowprops={"arrowstyle": "->", "color": "black", "linestyle": "--",
                                "linewidth": 0.9})
    if t.get("killed_ms") is not None:
        ax.axvline(t["killed_ms"], color="red", linestyle="--", linewidth=1)
        ax.text(t["killed_ms"], -0.9, f" kill -9 {t.get('member', '')}", color="red",
                fontsize=8, va="center")
    ax.set_yticks(range(len(spans)))
    ax.set_yticklabels([f"{s.get('worker')}  {s['name']}"
                        + (f" {s['stream']}" if s.get("stream") else "") for s in spans],
                       fontsize=8)
    ax.set_ylim(len(spans) - 0.4, -1.4)
    ax.set_xlim(start - width * 0.02, end + width * 0.12)
    ax.set_xlabel("ms")
    kind = "SIGTERM hand-off" if t.get("kind") == "sigterm" else "kill -9 take-over"
    ax.set_title(f"slowest {kind}: {_trace_title(t)}"
                 + ("; dashed arrow: span link" if t.get("links") else ""), fontsize=10)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=color[w], label=w) for w in workers], loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize=8)
