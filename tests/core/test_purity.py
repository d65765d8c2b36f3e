"""``streamlease.core`` stays pure: no module under it imports I/O, time or logging."""

from __future__ import annotations

import ast
from pathlib import Path

import streamlease.core

FORBIDDEN = {"asyncio", "time", "logging", "socket", "botocore", "aioboto3", "aiobotocore",
             "websockets", "prometheus_client", "os", "subprocess", "uvloop", "threading"}

# Modules of a forbidden package that core may import anyway, each with the reason.
ALLOWED = {
    # A pure parser (urllib.parse, no I/O): URLs are checked exactly as the client that
    # dials them parses them, so what is checked is what is dialled.
    "websockets.uri": "the parser websockets dials with",
    # The one exception that parser raises (InvalidURI).
    "websockets.exceptions": "the exception websockets.uri raises",
}


def imported_roots(path: Path) -> set[str]:
    """The root of every module ``path`` imports (the full name for those in ALLOWED),
    plus the full name of every ``streamlease.`` module outside ``streamlease.core``."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module.startswith("streamlease.") and \
                    not node.module.startswith("streamlease.core"):
                roots.add(node.module)
        else:
            continue
        roots.update(name if name in ALLOWED else name.split(".")[0] for name in names)
    return roots


def test_core_imports_nothing_impure() -> None:
    core = Path(streamlease.core.__file__).parent
    files = sorted(core.glob("*.py"))
    assert len(files) >= 5
    for path in files:
        bad = {r for r in imported_roots(path) if r in FORBIDDEN or r.startswith("streamlease.")}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_check_catches_a_forbidden_import(tmp_path: Path) -> None:
    sample = tmp_path / "x.py"
    sample.write_text("import asyncio\nfrom streamlease.store import codec\n"
                      "from websockets.uri import parse_uri\nimport websockets.asyncio.client\n"
                      "from websockets.asyncio import client\n")
    assert imported_roots(sample) == {"asyncio", "streamlease", "streamlease.store",
                                      "websockets.uri", "websockets"}
