"""Every marker declared in ``pyproject.toml`` is used by some test (``--strict-markers`` checks the converse)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: pytest's own marks and the plugins' (not declared in pyproject.toml).
BUILTIN = {
    "parametrize",
    "skip",
    "skipif",
    "xfail",
    "usefixtures",
    "filterwarnings",
    "asyncio",
    "xdist_group",
}


def test_every_declared_marker_is_used() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = {line.split(":", 1)[0].strip() for line in options["markers"]}
    text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    used = set(re.findall(r"pytest\.mark\.(\w+)", text)) - BUILTIN
    assert declared == used, f"declared but unused: {declared - used}; used but undeclared: {used - declared}"


def test_test_files_have_unique_names() -> None:
    """``tests/`` has no ``__init__.py`` files, so pytest imports each test file by its bare name: two
    files with one name in different folders break collection for everyone ("import file mismatch")."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in names.items() if len(paths) > 1 and name != "__init__.py"}
    assert not clashes, f"rename one of each: {clashes}"
