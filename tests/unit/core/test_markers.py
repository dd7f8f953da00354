"""Every marker declared in ``pyproject.toml`` is used by some test (``--strict-markers`` checks the converse)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: pytest's own marks and the plugins' (not declared in pyproject.toml).
BUILTIN = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings", "asyncio"}


def test_every_declared_marker_is_used() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = {line.split(":", 1)[0].strip() for line in options["markers"]}
    text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    used = set(re.findall(r"pytest\.mark\.(\w+)", text)) - BUILTIN
    assert declared == used, f"declared but unused: {declared - used}; used but undeclared: {used - declared}"
