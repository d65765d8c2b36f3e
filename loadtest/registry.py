"""Every scenario of the load test, in one table: its name, the module and entry function
that run it, and the JSON keys it writes into ``loadtest/results/latest.json``.

``make loadtest`` runs the default ones, ``make loadtest-all`` every one with ``command``
``make loadtest`` (``loadtest.runner``, in this order); ``nemesis`` runs by its own command.
An entry is ``async def entry(ctx: loadtest.fleet.Context) -> dict`` (a scenario's part of
the results; an ``error`` key marks it failed), imported only when the scenario runs.

``keys`` are the paths a scenario owns, top-level or dotted inside a section several
scenarios share: a result key belongs to the scenario with the longest key that is a
prefix of it, segment by segment (``owner``). So ``failover.kill9_defaults.p99`` is
``kill9_defaults``'s and ``failover.kill9.p99`` ``chaos``'s; ``tracing.throughput_ratio``
is ``tracing``'s, every other ``tracing.*`` key ``chaos``'s. The report skips the targets
of a scenario that did not run by it; tests/test_loadtest_layout.py checks it against the
committed results.

This module imports no scenario and nothing of the worker: the report reads it.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

Entry = Callable[[Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Scenario:
    name: str
    module: str  # under loadtest/
    entry: str
    keys: tuple[str, ...]
    default: bool = True  # in `make loadtest`; `make loadtest-all` runs them all
    command: str = "make loadtest"

    def load(self) -> Entry:
        return cast(Entry, getattr(importlib.import_module(f"loadtest.{self.module}"),
                                   self.entry))


CHAOS_KEYS = (
    "chaos_seconds", "lost", "duplicated", "out_of_order", "stale_accepted", "stale_rejected",
    "fleet_caused_gaps", "upstream_gaps_counted", "messages_in_sink", "msgs_per_s_during_chaos",
    "failover.kill9", "failover.sigterm", "failover.pause", "failover_targets_s",
    "requests_per_stream_minute", "member_heartbeats_per_interval", "dynamodb_requests_per_s",
    "store_was_bottleneck", "cost_per_1000_streams_month_usd", "cost_at_defaults_usd",
    "rolling_restart_max_held", "chaos_worker_exits", "chaos_log_events", "faults", "timeline",
    "tracing")
THROUGHPUT_KEYS = (
    "msgs_per_s", "null_sink_ratio", "fenced_sink_ratio", "cpu_seconds_per_1000_messages",
    "cpu_seconds_per_1000_messages_saturated", "cpu_phase_msgs_per_s", "rss_bytes_per_stream",
    "worker_rss_idle_bytes", "idle_streams", "dynamodb_connections_idle_streams",
    "upstream_connections_idle_streams", "sinks.python.msgs_per_s_noop",
    "sinks.python.ratio_to_bare", "sinks.python.cpu_seconds_per_1000_messages_noop",
    "sinks.python.batch_max_messages")
SCALE_READS_KEYS = (
    "scale.per_worker_read_growth", "scale.per_member_read_growth", "scale.leader_read_growth",
    "scale.items_read_per_worker_minute_2_workers",
    "scale.items_read_per_worker_minute_8_workers", "scale.reads")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("chaos", "chaos_scenario", "run_chaos", CHAOS_KEYS),
    Scenario("kill9_defaults", "kill9_defaults_scenario", "run_kill9_defaults",
             ("kill9_defaults", "failover.kill9_defaults")),
    Scenario("index_lag", "chaos_scenario", "run_index_lag", ("index_lag",)),
    Scenario("throughput", "throughput", "run_throughput", THROUGHPUT_KEYS),
    Scenario("tracing", "throughput", "run_tracing",
             ("tracing.throughput_ratio", "tracing.throughput")),
    Scenario("skew", "skew_scenario", "run_skew", ("skew",)),
    Scenario("slow_store", "slow_store_scenario", "run_slow_store",
             ("slow_store", "failover.sigterm_slow_store")),
    Scenario("balance", "balance_scenario", "run_balance", ("balance",)),
    Scenario("balance_startup", "balance_scenario", "run_balance_startup",
             ("balance.during_startup",)),
    Scenario("jobs", "jobs_scenario", "run_jobs", ("jobs",)),
    Scenario("sinks", "sinks_scenario", "run_sinks", ("sinks",)),
    Scenario("upstreams", "upstreams_scenario", "run_upstreams", ("upstreams",)),
    Scenario("deploy", "deploy_scenario", "run_deploy", ("deploy",)),
    Scenario("change_feed", "change_feed_scenario", "run_change_feed", ("change_feed",),
             default=False),
    Scenario("scale_reads", "scale_scenario", "run_scale_reads", SCALE_READS_KEYS,
             default=False),
    Scenario("scale", "scale_scenario", "run_scale",
             ("scale", "capacity_model", "upkeep_writes_per_stream_minute_default",
              "streams_per_table_at_defaults"), default=False),
    Scenario("nemesis", "nemesis", "main", ("nemesis",), default=False,
             command="make nemesis"),
)
BY_NAME = {s.name: s for s in SCENARIOS}
# What `make loadtest` can run (--scenarios), and runs by default.
LOADTEST = tuple(s.name for s in SCENARIOS if s.command == "make loadtest")
DEFAULT = tuple(s.name for s in SCENARIOS if s.command == "make loadtest" and s.default)

# The sections of ``upstreams`` (its resume modes, ``loadtest.upstreams_scenario.MODES``, in
# report order), and those whose feed replays.
UPSTREAM_MODES = ("query", "message", "none", "none_count")
REPLAYING_MODES = ("query", "message")
# Sections several scenarios write keys into, and how many levels down a scenario's own
# keys are: ``failover.kill9`` (chaos) next to ``failover.sigterm_slow_store``;
# ``sinks.python.lost`` (sinks) next to ``sinks.python.ratio_to_bare`` (throughput);
# ``scale.kill9`` (scale) next to ``scale.per_worker_read_growth`` (scale_reads);
# ``balance.converge_s`` (balance) next to ``balance.during_startup`` (balance_startup);
# ``tracing.handoffs_linked`` (chaos) next to ``tracing.throughput_ratio`` (tracing).
SHARED_SECTIONS = {"failover": 1, "sinks": 2, "scale": 1, "balance": 1, "tracing": 1}


def owner(key: str) -> str | None:
    """The scenario that writes ``key`` (a dotted result path), or None."""
    parts = key.split(".")
    best: tuple[int, str | None] = (0, None)
    for scenario in SCENARIOS:
        for own in scenario.keys:
            length = own.count(".") + 1
            if parts[:length] == own.split(".") and length > best[0]:
                best = (length, scenario.name)
    return best[1]


def add_arguments(group: argparse._ArgumentGroup) -> None:
    """The command-line options of every module ``make loadtest`` runs a scenario of (its
    ``add_arguments``, when it has one), in the table's order."""
    for module in dict.fromkeys(s.module for s in SCENARIOS if s.name in LOADTEST):
        add = getattr(importlib.import_module(f"loadtest.{module}"), "add_arguments", None)
        if add is not None:
            add(group)


def get_path(result: dict[str, Any], key: str) -> Any:
    """The value at dotted ``key`` of a results dict, or None."""
    value: Any = result
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value
