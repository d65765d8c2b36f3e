"""The load test's layout: every scenario a module of its own that imports no other
scenario, one registry naming them all, and no import cycle in ``loadtest/`` (lazy imports
inside functions included). Read from the source with ``ast``, as tests/test_layering.py
reads ``streamlease/``."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from loadtest import registry
from loadtest.runner import section_paths
from tests.test_layering import import_cycles, imports_of, module_files

LOADTEST = Path(registry.__file__).parent
MODULES = module_files(LOADTEST)
SCENARIO_MODULES = {f"loadtest.{s.module}" for s in registry.SCENARIOS}


def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), str(MODULES[module]))


def _runs_a_scenario(module: str) -> bool:
    """The module has a top-level ``async def f(ctx)``: a scenario's entry."""
    return any(isinstance(node, ast.AsyncFunctionDef)
               and [a.arg for a in node.args.args] == ["ctx"] for node in _tree(module).body)


def test_the_loadtest_import_graph_has_no_cycle_lazy_imports_included() -> None:
    assert len(MODULES) > 20
    assert import_cycles(LOADTEST, lazy=True) == []


def test_no_loadtest_module_imports_a_scenario_module() -> None:
    bad = [f"{name} imports {m}" for name, path in MODULES.items()
           for m in sorted(imports_of(name, path, MODULES, top_level_only=False)
                           & SCENARIO_MODULES)]
    assert bad == []


def test_every_registered_scenario_exists() -> None:
    for scenario in registry.SCENARIOS:
        module = f"loadtest.{scenario.module}"
        assert module in MODULES, scenario
        entries = {node.name for node in _tree(module).body
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert scenario.entry in entries, scenario
    assert len(registry.BY_NAME) == len(registry.SCENARIOS)
    assert set(registry.DEFAULT) <= set(registry.LOADTEST)


def test_every_scenario_module_is_registered() -> None:
    named = {m for m in MODULES if m.endswith("_scenario")}
    entries = {m for m in MODULES if _runs_a_scenario(m)}
    assert named | entries <= SCENARIO_MODULES
    assert {m for m in SCENARIO_MODULES if m != "loadtest.nemesis"} <= entries


def test_the_registry_names_the_keys_each_scenario_wrote() -> None:
    result = json.loads((LOADTEST / "results" / "latest.json").read_text())
    for name, meta in result["scenarios"].items():
        assert name in registry.BY_NAME
        assert {registry.owner(key) for key in meta["keys"]} == {name}, name
    run = {"profile", "settings", "dynamodb", "started_at", "logs", "scenarios"}
    figures = section_paths({k: v for k, v in result.items() if k not in run})
    assert [key for key in figures if registry.owner(key) is None] == []
    assert registry.owner("failover.kill9_defaults.p99") == "kill9_defaults"
    assert registry.owner("failover.kill9.p99") == "chaos"
    assert registry.owner("tracing.throughput_ratio") == "tracing"
    assert registry.owner("tracing.handoffs_linked") == "chaos"
    assert registry.owner("sinks.python.ratio_to_bare") == "throughput"
    assert registry.owner("sinks.python.lost") == "sinks"


def test_the_registry_names_the_upstream_modes() -> None:
    from loadtest import upstreams_scenario

    assert tuple(upstreams_scenario.MODES) == registry.UPSTREAM_MODES
    replaying = tuple(name for name, feed in upstreams_scenario.MODES.items() if feed.replays)
    assert replaying == registry.REPLAYING_MODES
