"""The README and docs/ link to what exists: every relative link names a file or directory of
the repository, and a ``#anchor`` into one of its markdown files names a heading there (the
anchor GitHub derives from the heading's text)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?)\s*$", re.M)


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(prose(page.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # https:, mailto: ...


def test_the_slug_is_githubs() -> None:
    assert slug("What it guarantees, and what not") == "what-it-guarantees-and-what-not"
    assert slug("`make run`, the demo") == "make-run-the-demo"
    assert slug("1. Build and push the image") == "1-build-and-push-the-image"
    assert slug("StreamleaseDynamoDBThrottling") == "streamleasedynamodbthrottling"


def test_the_checker_sees_a_broken_link_and_a_broken_anchor(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[a](missing.md) [b](#nowhere) [c](#title) `[d](x.md)`\n"
                    "```\n[e](y.md)\n```\n[f](https://example.com)\n")
    assert links(page) == ["missing.md", "#nowhere", "#title"]
    assert anchors(page) == {"title"}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT.resolve() not in (dest, *dest.parents):
            broken.append(f"{target}: no such file in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, broken


def test_readme_links_every_docs_page() -> None:
    readme = links(ROOT / "README.md")
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme, f"README does not link docs/{page.name}"
