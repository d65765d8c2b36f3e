"""Imports point down the layers, and no two modules import each other.

Read from the source with ``ast`` (nothing is imported): storage (``streamlease.store``)
knows no runtime, the pure core (``streamlease.core``) knows nothing of the package
outside itself (its other limits are in tests/core/test_purity.py), and the top-level
import graph of ``streamlease`` has no cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import streamlease

PACKAGE = Path(streamlease.__file__).parent

# The parts of the worker and what each may import: the rules docs/architecture.md states
# under its picture ("What each part may not touch"). A part is a module or a package
# (every module in it); a name is always the package's (``streamlease``).
FOUNDATION = ("streamlease.errors", "streamlease.clock", "streamlease.config",
              "streamlease.logs", "streamlease.metrics")
ENTRY = ("streamlease.app", "streamlease.cli", "streamlease.jobcli", "streamlease.__main__")
FLEET = ("streamlease.membership", "streamlease.leadership", "streamlease.leader",
         "streamlease.jobs", "streamlease.feed")
RECONCILING = ("streamlease.reconciler", "streamlease.reconcile_settings",
               "streamlease.intake", "streamlease.balancing", "streamlease.watch",
               "streamlease.holdings", "streamlease.takeover", "streamlease.sweep",
               "streamlease.audit")
ONE_STREAM = ("streamlease.supervisor", "streamlease.heartbeat", "streamlease.release",
              "streamlease.tenancy", "streamlease.pump", "streamlease.pumping",
              "streamlease.session", "streamlease.delivery", "streamlease.dial",
              "streamlease.handover", "streamlease.ahead")
STORE_MAY_IMPORT = ("streamlease.core", "streamlease.store", *FOUNDATION)

# (who, the only parts it may import): beyond itself, nothing else.
ONLY: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("streamlease.core",), ("streamlease.core",)),
    (("streamlease.processor",), ("streamlease.core",)),
    (("streamlease.store",), STORE_MAY_IMPORT),
    (("streamlease.sinks",), (*STORE_MAY_IMPORT, "streamlease.sinks", "streamlease.processor")),
)
# (who, what it may not import).
NOT: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    # One stream's tenure knows nothing of the fleet or of the reconciler above it.
    (ONE_STREAM, FLEET + RECONCILING),
    # Membership reaches the streams only through its hooks.
    (("streamlease.membership",), RECONCILING + ONE_STREAM),
)


def module_files(package: Path) -> dict[str, Path]:
    """Every module under ``package`` by its dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _top_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports run when the module is: not in functions or classes, not under
    ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def imports_of(name: str, path: Path, modules: dict[str, Path], *,
               top_level_only: bool) -> set[str]:
    """The package's modules that module ``name`` imports: ``from a.b import c`` counts as
    ``a.b.c`` when that is a module, else as ``a.b``; relative imports are resolved."""
    tree = ast.parse(path.read_text(), str(path))
    nodes: Iterator[ast.AST] = _top_level(tree.body) if top_level_only else ast.walk(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.add(full if full in modules else module)
    root = name.split(".")[0]
    return {m for m in found if m == root or m.startswith(root + ".")} - {name}


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _named(prefixes: tuple[str, ...], root: str) -> tuple[str, ...]:
    return tuple(p.replace("streamlease", root, 1) for p in prefixes)


def layering_violations(package: Path) -> list[str]:
    """Every import, anywhere in a file (lazy ones too), that breaks a rule above; and,
    for the runtime (all but the entry points and the dev tools), any import of the entry
    points or the dev tools."""
    modules = module_files(package)
    root = package.name
    top = _named((*ENTRY, "streamlease.dev"), root)
    bad: set[str] = set()
    for name, path in modules.items():
        imported = imports_of(name, path, modules, top_level_only=False)
        for who, only in ONLY:
            if _within(name, _named(who, root)):
                allowed = (*_named(only, root), name)
                bad.update(f"{name} imports {m}" for m in imported if not _within(m, allowed))
        for who, never in NOT:
            if _within(name, _named(who, root)):
                bad.update(f"{name} imports {m}" for m in imported
                           if _within(m, _named(never, root)))
        if name != root and not _within(name, top):
            bad.update(f"{name} imports {m}" for m in imported if _within(m, top))
    return sorted(bad)


def import_cycles(package: Path, *, lazy: bool = False) -> list[list[str]]:
    """The cycles of the top-level import graph (with ``lazy``, of every import anywhere in
    a file): each strongly connected component of more than one module, as one cycle
    through it (``[a, b, a]``)."""
    modules = module_files(package)
    graph = {name: sorted(imports_of(name, path, modules, top_level_only=not lazy)
                          & modules.keys())
             for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm; the graph is a few dozen modules deep
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return [_cycle_through(set(c), graph) for c in components]


def _cycle_through(component: set[str], graph: dict[str, list[str]]) -> list[str]:
    """One cycle inside a strongly connected component, to name in a failure."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in graph[v]:
                if w == start:
                    return paths[v] + [start]
                if w in component and w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError("not a strongly connected component")


def test_every_part_imports_only_what_its_rules_allow() -> None:
    assert len(module_files(PACKAGE)) > 40
    assert layering_violations(PACKAGE) == []


def test_no_import_cycles() -> None:
    assert import_cycles(PACKAGE) == []


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "streamlease" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "streamlease"


@pytest.mark.parametrize("source", [
    "from streamlease.leader import PutItem\n",
    "import streamlease.leader\n",
    "from streamlease import leader\n",
    "from ... import supervisor\n",
    "def later() -> None:\n    from streamlease.reconciler import Reconciler\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from streamlease.pump import Pump\n",
    "from streamlease.dial import dial\n",
])
def test_the_layering_check_catches_storage_importing_the_runtime(tmp_path: Path,
                                                                     source: str) -> None:
    package = _write(tmp_path, {
        "__init__.py": "", "leader.py": "", "reconciler.py": "", "supervisor.py": "",
        "pump.py": "", "dial.py": "", "errors.py": "", "core/__init__.py": "",
        "core/fenced.py": "", "store/__init__.py": "",
        "store/dynamodb/__init__.py": "", "store/dynamodb/leader.py": source,
    })
    assert len(layering_violations(package)) == 1


@pytest.mark.parametrize("source", [
    "from streamlease.errors import StoreError\n",
    "import streamlease.store.codec\n",
    "from streamlease import errors\n",
    "from .. import errors\n",
])
def test_the_layering_check_catches_core_importing_the_package(tmp_path: Path,
                                                                source: str) -> None:
    package = _write(tmp_path, {
        "__init__.py": "", "errors.py": "", "store/__init__.py": "", "store/codec.py": "",
        "core/__init__.py": "", "core/model.py": "", "core/lease.py": source,
    })
    assert len(layering_violations(package)) == 1


@pytest.mark.parametrize(("module", "source"), [
    ("pump.py", "from streamlease.membership import Membership\n"),
    ("session.py", "from streamlease import holdings\n"),
    ("membership/deal.py", "from streamlease.supervisor import Supervisor\n"),
    ("holdings.py", "from streamlease.app import build_runtime\n"),
    ("reconciler.py", "def later() -> None:\n    from streamlease.dev import demo\n"),
    ("sinks/files.py", "from streamlease.pump import Pump\n"),
    ("processor.py", "from streamlease.errors import StoreError\n"),
])
def test_the_layering_check_catches_a_part_reaching_where_it_may_not(
        tmp_path: Path, module: str, source: str) -> None:
    files = {rel: "" for rel in (
        "__init__.py", "errors.py", "app.py", "pump.py", "session.py", "holdings.py",
        "reconciler.py", "supervisor.py", "processor.py", "dev/__init__.py", "dev/demo.py",
        "membership/__init__.py", "membership/deal.py", "sinks/__init__.py", "sinks/files.py")}
    package = _write(tmp_path, {**files, module: source})
    assert len(layering_violations(package)) == 1


def test_the_layering_check_lets_storage_use_the_foundation_and_core(tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "__init__.py": "", "errors.py": "", "logs.py": "", "core/__init__.py": "",
        "core/fenced.py": "", "core/model.py": "from streamlease.core import fenced\n",
        "store/__init__.py": "",
        "store/memory.py": "from streamlease.core.fenced import PutItem\n"
                           "from streamlease.errors import StoreError\n"
                           "from streamlease.logs import event\nfrom . import codec\n",
        "store/codec.py": "from streamlease.core.model import X\n",
    })
    assert layering_violations(package) == []


def test_the_cycle_check_finds_a_cycle_and_skips_lazy_and_typing_imports(
        tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "__init__.py": "",
        "a.py": "from streamlease import b\n",
        "b.py": "try:\n    import streamlease.c\nexcept ImportError:\n    pass\n",
        "c.py": "from streamlease.a import x\n",
        # Lazy and TYPE_CHECKING imports do not run at import time: no cycle through them.
        "d.py": "import typing\nif typing.TYPE_CHECKING:\n    from streamlease import e\n",
        "e.py": "import streamlease.d\ndef later() -> None:\n    from streamlease import f\n",
        "f.py": "from streamlease.e import y\n",
    })
    assert import_cycles(package) == [["streamlease.a", "streamlease.b", "streamlease.c",
                                       "streamlease.a"]]
