"""Issue 15, item 3: a resume is a true continuation (kill -9 mid-run, then a restart).

Three runs of the whole stack (``tests/support/trainer_process.py``: embedded engine, gateway, runner threads,
lightning trainer; the tiny model, seed 0, grouped sampling of 2 tasks × 4 rollouts per step, cosine
schedule, 5 steps, a checkpoint every 2 steps): A runs uninterrupted; B (full checkpoints) and C
(``save_only_model=True``: adapter-only checkpoints) are killed with SIGKILL once the batch of their third
step is formed, before it is trained on, and restarted; both resume from ``checkpoint-2``.

Guards against: a resumed run drawing other tasks, or the same tasks in another order, than the
uninterrupted one (TRL's sampler re-seeded at construction, so a resume in epoch 1 drew epoch 0's order
again); a learning-rate schedule or optimizer state that restarts (Adam's moments zero after loading); the
rollouts of a batch formed but not trained when the kill hit being lost (marked ``trained_step`` when the batch
was formed) or replaced by new ones; a rollout trained by two steps or by none; a version name reused after
the restart; an adapter-only checkpoint resumed as if complete, without a word about what it lacks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from tiny_model import tiny_model

from agentforge.stores.sql import SQLStore

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "support" / "trainer_process.py"
STEPS = 5


def _start(out: Path, *extra: str) -> subprocess.Popen:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    log = open(out / f"trainer-{len(list(out.glob('trainer-*.log')))}.log", "w")  # noqa: SIM115 - child's
    cmd = [
        sys.executable,
        str(SCRIPT),
        str(out),
        str(STEPS),
        "--model",
        str(tiny_model()),
        "--save-steps",
        "2",
    ]
    return subprocess.Popen([*cmd, *extra], stdout=log, stderr=subprocess.STDOUT, env=env)


def _wait(proc: subprocess.Popen, out: Path, expect: int) -> None:
    code = proc.wait(timeout=600)
    logs = "\n".join(p.read_text()[-3000:] for p in sorted(out.glob("trainer-*.log")))
    assert code == expect, f"exit {code}, expected {expect}:\n{logs}"


def _report(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "report.jsonl").read_text().splitlines()]


def _steps(out: Path) -> tuple[dict[int, list[str]], list, SQLStore]:
    """Per step, the task id of each group in order; the run's rollouts; the store."""
    store = SQLStore(f"sqlite:///{out / 'traces.db'}")
    rollouts = [r for r in store.list_rollouts() if r.metadata.get("trainer_run")]
    groups: dict[int, list[str]] = defaultdict(list)
    seen = set()
    for r in sorted(rollouts, key=lambda r: r.created_at):
        if r.group_id not in seen:
            seen.add(r.group_id)
            groups[r.metadata["step"]].append(r.task.task_id)
    return dict(groups), rollouts, store


def _learning_rates(out: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["learning_rate"] for row in rows}


def test_kill_9_then_resume_is_a_true_continuation(tmp_path: Path) -> None:
    a, b, c = tmp_path / "uninterrupted", tmp_path / "full", tmp_path / "adapter-only"
    runs = [_start(a), _start(b, "--kill-at", "2"), _start(c, "--kill-at", "2", "--adapter-only")]
    for proc, out, code in zip(runs, (a, b, c), (0, -9, -9), strict=True):
        _wait(proc, out, code)
    for out in (b, c):
        assert (out / "run" / "checkpoint-2").is_dir() and not (out / "run" / "checkpoint-4").exists()
    resumed = [_start(b), _start(c)]
    for proc, out in zip(resumed, (b, c), strict=True):
        _wait(proc, out, 0)

    groups_a, _, store_a = _steps(a)
    lr_a = _learning_rates(a)
    for out in (b, c):
        groups, rollouts, store = _steps(out)
        # Steps 3-5 draw the same tasks, in the same group order, as the uninterrupted run.
        assert groups == groups_a, (out.name, groups, groups_a)
        assert all(len(g) == 2 for g in groups.values()) and sorted(groups) == list(range(STEPS))
        # The store cursor: each step trained exactly its own 2 groups × 4 rollouts, each rollout once; the
        # batch of step 3, formed before the kill, is the one step 3 trained (no new rollouts for it).
        assert len({r.metadata["trainer_run"] for r in rollouts}) == 1, (
            "the run id changed across the restart"
        )
        assert Counter(r.metadata["step"] for r in rollouts) == dict.fromkeys(range(STEPS), 8)
        assert all(r.metadata.get("trained_step") == r.metadata["step"] for r in rollouts), [
            (r.metadata.get("step"), r.metadata.get("trained_step")) for r in rollouts
        ]
        # Versions continue: one new number per published step, never a reused name.
        resources = store.list_resources("policy")
        assert [r.version for r in resources] == [1, 2, 3, 4, 5]
        assert [r.payload["step"] for r in resources] == [1, 2, 3, 4, 5]
        done = [row for row in _report(out) if row["event"] == "done"]
        assert len(done) == 1 and done[0]["versions"] == ["policy@v3", "policy@v4", "policy@v5"]
        store.close()

    # Full state: the schedule continues (same learning rate at every step) and Adam's moments are loaded.
    begin_b = [row for row in _report(b) if row["event"] == "train_begin"]
    assert [row["global_step"] for row in begin_b] == [0, 2]
    assert begin_b[1]["adam_exp_avg_abs"] > 0, "the optimizer state was not restored"
    lr_b = _learning_rates(b)
    assert sorted(lr_b) == list(range(1, STEPS + 1)) and lr_b == pytest.approx(lr_a, rel=1e-6), (lr_b, lr_a)
    done_b = next(row for row in _report(b) if row["event"] == "done")
    assert done_b["resume"] == {"checkpoint": str(b / "run" / "checkpoint-2"), "missing": []}

    # Adapter-only: the resume says exactly what the checkpoint lacks (and the optimizer did restart).
    done_c = next(row for row in _report(c) if row["event"] == "done")
    missing = done_c["resume"]["missing"]
    assert [m.split(" (")[1].split(")")[0] for m in missing] == [
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
    ]
    assert [row["adam_exp_avg_abs"] for row in _report(c) if row["event"] == "train_begin"][1] == 0.0
    log_c = "\n".join(p.read_text() for p in sorted(c.glob("trainer-*.log")))
    assert "which is not a full checkpoint; it lacks: optimizer state (optimizer.pt)" in log_c
    store_c = SQLStore(f"sqlite:///{c / 'traces.db'}")
    records = [s for s in store_c.list_spans(orphans=True) if s.name == "trainer.resume"]
    assert [r.attributes["missing"] for r in records] == [missing]
    store_c.close()
    store_a.close()
