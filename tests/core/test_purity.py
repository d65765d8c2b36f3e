"""``worker.core`` stays pure: no module under it imports I/O, time or logging."""

from __future__ import annotations

import ast
from pathlib import Path

import worker.core

FORBIDDEN = {"asyncio", "time", "logging", "socket", "botocore", "aioboto3", "aiobotocore",
             "websockets", "prometheus_client", "os", "subprocess", "uvloop", "threading"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
            if node.module.startswith("worker.") and not node.module.startswith("worker.core"):
                roots.add(node.module)
    return roots


def test_core_imports_nothing_impure() -> None:
    core = Path(worker.core.__file__).parent
    files = sorted(core.glob("*.py"))
    assert len(files) >= 5
    for path in files:
        bad = {r for r in imported_roots(path) if r in FORBIDDEN or r.startswith("worker.")}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import asyncio\nfrom worker.store import codec\n")
    assert {"asyncio", "worker.store"} <= imported_roots(sample)
