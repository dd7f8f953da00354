#!/usr/bin/env bash
# Run this tree's tests against the code of another commit: "does this test fail before the fix?".
#
#   scripts/tests_at_commit.sh REV [pytest arguments...]
#   scripts/tests_at_commit.sh 52048a9 tests/unit/privacy/test_privacy_answer.py -q
#
# REV is checked out into a disposable git worktree under /tmp (removed afterwards); this tree's tests/ and
# pytest configuration are copied over it, and pytest runs with this tree's .venv, importing agentforge from
# the worktree (the wings at its root are linked into the package as pyproject's package-dir maps them).
# A test that imports a name REV does not have fails to collect; the others run (--continue-on-collection-errors).
# Environment: AGENTFORGE_DATA_DIR (default: the data folder beside the repository), AGENTFORGE_VLLM_PYTHON
# (default: this tree's .venv-vllm), and whatever the chosen tests need (e.g. AGENTFORGE_TEST_PG_URL).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 REV [pytest arguments...]" >&2; exit 2; }
rev=$(git -C "$root" rev-parse --verify "$1^{commit}") || { echo "$1: not a commit" >&2; exit 2; }
shift
python="$root/.venv/bin/python"
[ -x "$python" ] || { echo "no $python: run 'bash scripts/setup.sh' first" >&2; exit 2; }
dir=$(mktemp -d /tmp/agentforge-at-XXXXXX)
cleanup() { git -C "$root" worktree remove --force "$dir" >/dev/null 2>&1 || rm -rf "$dir"; }
trap cleanup EXIT
rmdir "$dir" && git -C "$root" worktree add --detach -q "$dir" "$rev"
"$python" - "$dir" <<'EOF'
import os, sys, tomllib
root = sys.argv[1]
with open(os.path.join(root, "pyproject.toml"), "rb") as f:
    dirs = tomllib.load(f).get("tool", {}).get("setuptools", {}).get("package-dir", {})
for package, folder in dirs.items():
    path = os.path.join(root, *package.split("."))
    if folder != package.replace(".", "/") and not os.path.exists(path):
        os.symlink(os.path.relpath(os.path.join(root, folder), os.path.dirname(path)), path)
EOF
rm -rf "$dir/tests"
cp -r "$root/tests" "$dir/tests"
cp "$root/pyproject.toml" "$dir/pyproject.toml"
cd "$dir"
export PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}"
data="$(cd "$root/.." && pwd)/shared/data"
[ -d "$data" ] && export AGENTFORGE_DATA_DIR="${AGENTFORGE_DATA_DIR:-$data}"
export AGENTFORGE_VLLM_PYTHON="${AGENTFORGE_VLLM_PYTHON:-$root/.venv-vllm/bin/python}"
where=$("$python" -c "import agentforge, os; print(os.path.dirname(agentforge.__file__))")
[ "$where" = "$dir/agentforge" ] || { echo "agentforge imports from $where, not the worktree" >&2; exit 2; }
echo "tests of $(git -C "$root" rev-parse --short HEAD) on the code of $(git rev-parse --short HEAD)" >&2
"$python" -m pytest -p no:cacheprovider --continue-on-collection-errors "$@"
