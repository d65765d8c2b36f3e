"""Write the benchmark's report: JSON (for tools), Markdown (for people), a PNG timeline."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def write_reports(result: dict[str, Any], out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    paths: dict[str, str] = {}
    body = json.dumps(result, indent=2)
    for name in ("latest.json", f"{stamp}.json"):
        (out / name).write_text(body)
    paths["json"] = str(out / "latest.json")
    md = markdown(result)
    (out / "latest.md").write_text(md)
    (out / f"{stamp}.md").write_text(md)
    paths["md"] = str(out / "latest.md")
    png = out / "latest.png"
    timeline_png(result, png)
    paths["png"] = str(png)
    return paths


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def markdown(r: dict[str, Any]) -> str:
    s = r["settings"]
    lines = [
        f"# streamlease load and chaos run ({r['profile']} profile, {r['started_at']})",
        "",
        f"{s['streams']} streams x {s['rate']} msg/s, {s['workers']} workers, lease "
        f"{s['lease']} s, heartbeat {s['heartbeat']} s, reconcile {s['reconcile']} s, skew "
        f"margin {s['skew']} s; DynamoDB: {r['dynamodb']}; {r['chaos_seconds']} s of chaos.",
        "",
        "## Correctness (must all be 0)",
        "",
        "| lost | duplicated | out of order | stale writes accepted | fleet-caused gaps |",
        "|---|---|---|---|---|",
        f"| {r['lost']} | {r['duplicated']} | {r['out_of_order']} | {r['stale_accepted']} | "
        f"{r['fleet_caused_gaps']} |",
        "",
        f"Stale writes rejected by the sink: {r['stale_rejected']}. Messages in the sink: "
        f"{r['messages_in_sink']}.",
        "",
        "## Failover (fault until the stream delivers again, elsewhere)",
        "",
        "| fault | samples | p50 | p99 | max | target | not recovered |",
        "|---|---|---|---|---|---|---|",
    ]
    targets = r["failover_targets_s"]
    for kind, label in (("kill9", "kill -9"), ("sigterm", "SIGTERM (deploy)"),
                        ("pause", "SIGSTOP past the lease")):
        f = r["failover"][kind]
        target = f"p99 <= {targets[kind]:.2f} s" if kind in targets else "-"
        lines.append(f"| {label} | {f['samples']} | {_s(f['p50'])} | {_s(f['p99'])} | "
                     f"{_s(f['max'])} | {target} | {f['unrecovered']} |")
    rpm = r["requests_per_stream_minute"]
    cost = r["cost_per_1000_streams_month_usd"]
    lines += [
        "",
        "## DynamoDB requests per stream-minute",
        "",
        "| " + " | ".join(rpm) + " |",
        "|" + "---|" * len(rpm),
        "| " + " | ".join(f"{v:.2f}" for v in rpm.values()) + " |",
        "",
        f"Renewals per stream per heartbeat interval: {r['renewals_per_heartbeat_interval']} "
        "(1.0 is exactly one; more would be retry storms).",
        "",
        f"Implied on-demand cost per 1,000 streams per month, at this run's settings: "
        f"**${cost['total']:,.2f}** (lease upkeep ${cost['lease_overhead']:,.2f}, sink "
        f"${cost['sink']:,.2f}). At the default settings (5 s heartbeat, 0.2 s batches): "
        f"**${r['cost_at_defaults_usd']['total']:,.2f}** (lease upkeep "
        f"${r['cost_at_defaults_usd']['lease_overhead']:,.2f}). Assumptions: "
        f"{cost['assumptions']}.",
        "",
        f"DynamoDB requests during the run: {r['dynamodb_requests_per_s']}/s"
        + (" — near the embedded server's ~250/s ceiling: the store, not the worker, bounded "
           "this run." if r["store_was_bottleneck"] else "."),
        "",
        "## Throughput and cost of one worker",
        "",
        "| null sink | fenced sink | bare websockets client | null/bare | fenced/bare |",
        "|---|---|---|---|---|",
        f"| {r['msgs_per_s']['null_sink']:,} msg/s | {r['msgs_per_s']['fenced_sink']:,} msg/s | "
        f"{r['msgs_per_s']['bare_client']:,} msg/s | {r['null_sink_ratio']} | "
        f"{r['fenced_sink_ratio']} |",
        "",
        f"CPU: {r['cpu_seconds_per_1000_messages']} s per 1,000 messages, measured with 100 "
        f"streams at 10 msg/s, a 5 s heartbeat and 2 s batches so the store is not the limit "
        f"({r['cpu_phase_msgs_per_s']} msg/s delivered); with large batches (the fenced-sink "
        f"phase) {r['cpu_seconds_per_1000_messages_saturated']} s per 1,000 messages.",
        "",
        f"Memory: {r['rss_bytes_per_stream']:,} bytes resident per held idle stream "
        f"({r.get('idle_streams', 100)} streams whose upstream sends nothing, default heartbeat; "
        f"a worker holding none: {r['worker_rss_idle_bytes'] / 2**20:.0f} MiB).",
        "",
    ]
    return "\n".join(lines)


def timeline_png(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = r["timeline"]
    workers = sorted({w for _, owned in timeline for w in owned}, key=lambda w: int(w[1:]))
    times = [t for t, _ in timeline]
    fig, ax = plt.subplots(figsize=(12, 5), dpi=100)
    stacks = [[owned.get(w, 0) for _, owned in timeline] for w in workers]
    if stacks:
        palette = plt.get_cmap("tab20")
        ax.stackplot(times, stacks, labels=workers, alpha=0.85,
                     colors=[palette(i % 20) for i in range(len(workers))])
    colors = {"kill9": "red", "sigterm": "blue", "pause": "purple", "drop": "gray"}
    seen: set[str] = set()
    for fault in r["faults"]:
        label = fault["kind"] if fault["kind"] not in seen else None
        seen.add(fault["kind"])
        ax.axvline(fault["at"], color=colors[fault["kind"]], linestyle="--", linewidth=1,
                   label=label)
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("streams owned")
    ax.set_title(f"streams owned per worker ({r['settings']['streams']} streams); "
                 "dashed lines: faults")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
