"""Every relative link in the README and docs/ names a file that exists (issue 58: a broken `agentic_curve.png` link
from docs/measurements.md went unnoticed)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _relative_links(doc: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)  # code blocks hold no links
    return [target for target in _LINK.findall(text) if "://" not in target and not target.startswith(("#", "mailto:"))]


def _broken(docs: list[Path]) -> list[str]:
    return [f"{doc.name} -> {target}" for doc in docs for target in _relative_links(doc)
            if not (doc.parent / target.split("#")[0]).exists()]


def test_every_relative_link_names_an_existing_file() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("examples/*/README.md"))]
    assert sum(len(_relative_links(doc)) for doc in docs) > 20  # the check reads the docs' links
    assert _broken(docs) == []


def test_a_link_to_a_missing_file_is_named(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    (tmp_path / "here.png").write_bytes(b"")
    doc.write_text("[a](here.png), [b](missing.png#x), [c](https://example.org/x), [d](#top)\n```\n[e](gone.md)\n```\n")
    assert _broken([doc]) == ["doc.md -> missing.png#x"]
