"""Check the import-layer contracts (``[tool.importlinter]`` in pyproject.toml) with import-linter.

``agents/``, ``stores/`` and ``trainers/`` install as ``agentforge.agents`` & co. through setuptools'
``package-dir``, but import-linter (grimp) finds a package's modules by walking its one folder, so it
would never see them. This script builds the installed layout as a tree of symbolic links in a temporary
folder (read from ``package-dir``, so there is one source of truth) and runs ``lint-imports`` there.

Usage: ``python scripts/lint_imports.py [lint-imports options]`` (``make lint`` runs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_tree(dest: Path) -> None:
    """Lay out the installed package under ``dest`` as symbolic links into the repository."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dir: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    # Parents before children: "agentforge" is a real folder whose entries link back into agentforge/,
    # so that "agentforge.agents" (agents/) can be linked in beside them.
    for package in sorted(package_dir, key=lambda name: name.count(".")):
        target = dest.joinpath(*package.split("."))
        source = ROOT / package_dir[package]
        if "." not in package:
            target.mkdir(parents=True)
            for entry in source.iterdir():
                if entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:
            target.symlink_to(source, target_is_directory=True)


def lint(tree: Path, argv: Sequence[str] = (), **kwargs: object) -> subprocess.CompletedProcess:
    """Run ``lint-imports`` on a tree made by :func:`build_tree` (``kwargs`` go to ``subprocess.run``)."""
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which(
        "lint-imports"
    )
    if lint_imports is None:
        raise SystemExit('lint-imports not found; pip install -e ".[dev]"')
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [lint_imports, str(ROOT / "pyproject.toml"), "--no-cache", "--no-logo", *argv]
    # lint-imports puts its working folder first on sys.path: run it in the tree, not the repository.
    return subprocess.run(command, cwd=tree, env=env, check=False, **kwargs)  # type: ignore[call-overload]


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="agentforge-importlinter-") as tmp:
        build_tree(Path(tmp))
        return lint(Path(tmp), argv).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
