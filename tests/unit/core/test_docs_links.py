"""The README and docs/ are self-contained: every relative link and every named doc lies inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
NAMED = re.compile(r"`((?:\.\./|docs/)[^`\s]+\.md)`")


def test_relative_links_and_named_docs_resolve_inside_the_repository() -> None:
    problems = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        targets = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
        for target in targets + NAMED.findall(text):
            base = ROOT if target.startswith("docs/") else doc.parent
            path = (base / target).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                problems.append(f"{doc.relative_to(ROOT)} → {target}")
    assert not problems, problems


def test_the_readme_links_the_design_notes_and_the_new_domain_guide() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/design.md)" in text and "](docs/new_domain.md)" in text
    assert "../shared" not in text
