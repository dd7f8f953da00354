"""Type-check the package with pyright (``[tool.pyright]`` in pyproject.toml).

``agents/``, ``stores/`` and ``trainers/`` install as ``agentforge.agents`` & co. through setuptools'
``package-dir``, but pyright resolves ``agentforge.trainers`` by looking for ``agentforge/trainers`` under
its root, and it does not follow symbolically linked folders (the editable install's import hook is no help
either). This script copies the installed layout into a temporary folder (read from ``package-dir``, so there
is one source of truth), writes a pyright configuration there from ``[tool.pyright]`` that points at the
environment of the interpreter running the script, runs pyright in it, and prints pyright's report with the
paths mapped back to the repository (``<tmp>/agentforge/trainers/foo.py`` is ``trainers/foo.py``).

Usage: ``python scripts/typecheck.py [pyright options] [files]`` (``make lint`` runs it). Files given as
repository paths (``trainers/foo.py``) are checked in the copy. The exit status is pyright's.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs() -> dict[str, str]:
    """``package-dir`` from pyproject.toml: dotted package name -> folder in the repository."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["setuptools"]["package-dir"]


def build_tree(dest: Path) -> None:
    """Copy the installed package layout under ``dest`` (parents first, so that children land inside)."""
    package_dir = package_dirs()
    ignore = shutil.ignore_patterns("__pycache__", "node_modules")
    for package in sorted(package_dir, key=lambda name: name.count(".")):
        shutil.copytree(ROOT / package_dir[package], dest.joinpath(*package.split(".")), ignore=ignore)


def write_config(tree: Path) -> Path:
    """Write ``[tool.pyright]`` as the tree's pyrightconfig.json, with this interpreter's environment."""
    config = dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pyright"])
    prefix = Path(sys.prefix)
    config["venvPath"] = str(prefix.parent)
    config["venv"] = prefix.name
    path = tree / "pyrightconfig.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def _relative_mappings() -> list[tuple[str, str]]:
    """(folder in the tree, folder in the repository) pairs, the deepest package first."""
    package_dir = package_dirs()
    packages = sorted(package_dir, key=lambda name: name.count("."), reverse=True)
    return [("/".join(package.split(".")), package_dir[package].rstrip("/")) for package in packages]


def to_repository(relative: str) -> str:
    """A path relative to the tree (``agentforge/trainers/foo.py``) as a repository path (``trainers/foo.py``)."""
    for in_tree, in_repository in _relative_mappings():
        if relative == in_tree or relative.startswith(in_tree + "/"):
            return in_repository + relative[len(in_tree) :]
    return relative


def to_tree(path: str, tree: Path) -> str:
    """A repository path given on the command line as the path of its copy in the tree (others unchanged)."""
    candidate = Path(path)
    if not candidate.exists():
        return path
    try:
        relative = candidate.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path
    for in_tree, in_repository in _relative_mappings():
        if relative == in_repository or relative.startswith(in_repository + "/"):
            return str(tree / (in_tree + relative[len(in_repository) :]))
    return path


def map_paths(text: str, tree: Path) -> str:
    """Replace every path inside ``tree`` in pyright's output by its repository path."""
    pattern = re.compile(re.escape(str(tree)) + r"/([^\s:\"']+)")
    return pattern.sub(lambda match: to_repository(match.group(1)), text)


def find_pyright() -> str:
    found = shutil.which("pyright", path=str(Path(sys.executable).parent)) or shutil.which("pyright")
    if found is None:
        raise SystemExit('pyright not found; pip install -e ".[dev]"')
    return found


def typecheck(tree: Path, argv: Sequence[str] = ()) -> int:
    """Run pyright on a tree made by :func:`build_tree`; print its report with repository paths."""
    config = write_config(tree)
    command = [find_pyright(), "-p", str(config), *(to_tree(arg, tree) for arg in argv)]
    result = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
    sys.stdout.write(map_paths(result.stdout, tree))
    sys.stderr.write(map_paths(result.stderr, tree))
    return result.returncode


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="agentforge-pyright-") as tmp:
        tree = Path(tmp).resolve()
        build_tree(tree)
        return typecheck(tree, argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
