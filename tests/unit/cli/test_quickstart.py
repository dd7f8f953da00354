"""``examples/quickstart.py`` (the README's quickstart) runs as written on the embedded engine, and stays short."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart.py"


def test_the_quickstart_is_at_most_40_lines() -> None:
    assert len(QUICKSTART.read_text(encoding="utf-8").splitlines()) <= 40


@pytest.mark.slow
def test_the_quickstart_trains_two_steps_and_serves_what_it_published(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("quickstart", QUICKSTART)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(out=str(tmp_path / "quickstart"))
    printed = capsys.readouterr().out.splitlines()
    versions = result["versions"]
    assert result["steps"] == 2 and len(versions) + result["skipped_publishes"] == 2  # a step without signal
    assert versions == [f"policy@v{i}" for i in range(1, len(versions) + 1)]  # publishes nothing
    assert printed[0] == "serving policy@v0"
    assert printed[-1].startswith(f"serving {versions[-1] if versions else 'policy@v0'} after 2 steps:")
