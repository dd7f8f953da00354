"""The import layers hold, and the contracts can fail (``[tool.importlinter]`` in pyproject.toml).

``scripts/lint_imports.py`` (``make lint``) builds the installed layout as symbolic links and runs import-linter
on it; these tests run the same code, once on the repository and once on a copy with one deliberate violation.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("lint_imports", ROOT / "scripts" / "lint_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layer_contracts_are_kept(tmp_path: Path) -> None:
    script = _script()
    script.build_tree(tmp_path)
    result = script.lint(tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
    assert (
        tmp_path / "agentforge" / "agents" / "customer_service"
    ).is_dir()  # the package-dir rooms are seen


def test_a_trainer_importing_the_gateway_breaks_a_contract(tmp_path: Path) -> None:
    script = _script()
    script.build_tree(tmp_path)
    trainers = tmp_path / "agentforge" / "trainers"
    trainers.unlink()  # a link to trainers/: replace it by a copy we may change
    shutil.copytree(ROOT / "trainers", trainers, ignore=shutil.ignore_patterns("__pycache__"))
    publish = trainers / "publish.py"
    publish.write_text(
        publish.read_text()
        + "\n\ndef _router():\n    from agentforge.gateway.router import ModelRouter\n\n    return ModelRouter\n"
    )
    result = script.lint(tmp_path, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout
    assert "Trainers never import the gateway" in result.stdout and "BROKEN" in result.stdout
    assert "agentforge.trainers.publish -> agentforge.gateway.router" in result.stdout
