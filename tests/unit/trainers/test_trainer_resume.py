"""Must-show: ``kill -9`` of the trainer mid-run, then a restart resumes from the last checkpoint, the
version lineage continues (no version name reused), and no rollout is trained on twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from agentforge.stores.sql import SQLStore

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[2] / "support" / "trainer_process.py"


def _start(out: Path, steps: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    log = open(out / f"trainer-{time.monotonic_ns()}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), str(steps)], stdout=log, stderr=subprocess.STDOUT, env=env
    )


def test_kill_9_then_resume(tmp_path: Path) -> None:
    first = _start(tmp_path, 5)
    deadline = time.monotonic() + 600
    while not (tmp_path / "run" / "checkpoint-2").exists():
        assert first.poll() is None, "trainer died before its second checkpoint"
        assert time.monotonic() < deadline, "no checkpoint-2 within 10 minutes"
        time.sleep(0.5)
    time.sleep(1.0)  # let it get into step 3
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)

    second = _start(tmp_path, 5)
    assert second.wait(timeout=900) == 0, (tmp_path / "run").iterdir()

    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    resources = store.list_resources("policy")
    numbers = [r.version for r in resources]
    assert numbers == sorted(set(numbers)), "a version number was reused"
    assert store.get_resource("policy").payload["step"] == 5, "the active version is the last step's adapter"
    steps = [r.payload["step"] for r in resources]
    assert steps[-1] == 5 and max(steps[:-1]) < 5
    # One run identity across the restart; each rollout belongs to at most one batch, each batch is one group.
    rollouts = [r for r in store.list_rollouts() if r.metadata.get("trainer_run")]
    assert len({r.metadata["trainer_run"] for r in rollouts}) == 1
    trained = [r for r in rollouts if "trained_step" in r.metadata]
    per_step = Counter(r.metadata["trained_step"] for r in trained)
    assert set(per_step) == {0, 1, 2, 3, 4}
    # The step in flight at the kill ran again with NEW rollouts; none of the earlier ones came back.
    assert all(count in (4, 8) for count in per_step.values()), per_step
    assert per_step[0] == per_step[1] == 4, "steps completed before the checkpoint were not redone"
    store.close()
