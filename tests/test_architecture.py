"""docs/architecture.md opens with a picture of the parts: every module it names exists,
and every arrow it draws is an import (read from the source with ``ast``, lazy imports
too). A part drawn as a package (``streamlease.store``) stands for every module in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_layering import PACKAGE, imports_of, module_files

ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"

NODE = re.compile(r'\b(\w+)\["([\w.]+)')
EDGE = re.compile(r"\b(\w+)\s*-->\s*(?:\|[^|]*\|\s*)?(\w+)\b")


def picture(text: str) -> str:
    """The first mermaid block of the document."""
    found = re.search(r"```mermaid\n(.*?)```", text, re.S)
    assert found, "no mermaid picture"
    return found.group(1)


def parts_and_arrows(block: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Each node's id and the module it names (its label's first word), and the arrows
    between node ids. A ``subgraph`` only groups nodes: it names no module."""
    block = "\n".join(line for line in block.splitlines()
                      if not line.strip().startswith("subgraph"))
    nodes = dict(NODE.findall(block))
    arrows = EDGE.findall(re.sub(r"(\w+)\[[^\]]*\]", r"\1", block))
    return nodes, arrows


def _members(part: str, modules: dict[str, Path]) -> list[str]:
    return [m for m in modules if m == part or m.startswith(part + ".")]


def picture_problems(block: str, package: Path) -> list[str]:
    modules = module_files(package)
    nodes, arrows = parts_and_arrows(block)
    problems = [f"{node} names {part}, which is no module" for node, part in nodes.items()
                if not _members(part, modules)]
    for a, b in arrows:
        if a not in nodes or b not in nodes:
            problems.append(f"arrow {a} --> {b} joins a node that names no module")
            continue
        targets = set(_members(nodes[b], modules))
        if not any(imports_of(m, modules[m], modules, top_level_only=False) & targets
                   for m in _members(nodes[a], modules)):
            problems.append(f"{nodes[a]} --> {nodes[b]} is drawn, but no module of the "
                            f"first imports the second")
    return problems


def test_the_picture_names_modules_and_draws_imports() -> None:
    block = picture(ARCHITECTURE.read_text())
    nodes, arrows = parts_and_arrows(block)
    assert len(nodes) >= 10 and len(arrows) >= 10
    assert picture_problems(block, PACKAGE) == []


def _package(root: Path) -> Path:
    for rel, text in {"__init__.py": "", "a.py": "from streamlease import b\n", "b.py": "",
                      "store/__init__.py": "", "store/c.py": ""}.items():
        path = root / "streamlease" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "streamlease"


@pytest.mark.parametrize(("block", "problem"), [
    ('A["streamlease.a"] --> B["streamlease.b"]\n', None),
    ('A["streamlease.a"]\nB["streamlease.b"]\nA -->|reads| B\n', None),
    ('A["streamlease.b"] --> B["streamlease.a"]\n', "is drawn"),
    ('A["streamlease.a"] --> S["streamlease.store"]\n', "is drawn"),
    ('A["streamlease.gone"]\n', "no module"),
    ('A["streamlease.a"] --> X\n', "names no module"),
    ('subgraph g["a group"]\nA["streamlease.a"]\nend\nA --> B\nB["streamlease.b"]\n', None),
])
def test_the_picture_check_catches_a_wrong_arrow_or_name(tmp_path: Path, block: str,
                                                         problem: str | None) -> None:
    problems = picture_problems(block, _package(tmp_path))
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problem in problems[0]
