"""`agentforge run` and `agentforge train` as a new user runs them (subprocesses, real gateway/store)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import gateway_env

from agentforge.types import RolloutState, SpanKind

CLI = [sys.executable, "-m", "agentforge.cli"]
TRIAGE = "agentforge.agents.customer_service.triage:triage_agent"


def _tasks(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_help_lists_every_pipeline_command() -> None:
    out = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("serve", "run", "train", "model"):
        assert command in out
    for command in ("run", "train"):
        text = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, check=True).stdout
        assert "Example:" in text


def test_run_executes_a_task_file_through_the_gateway(tmp_path: Path) -> None:
    rows = [
        {
            "task_id": "t1",
            "input": {"text": "I want my money back 💸", "temperature": 0.0},
            "metadata": {"label": "refund"},
        },
        {
            "task_id": "t2",
            "input": {"text": "where is my parcel", "temperature": 0.0},
            "metadata": {"label": "delivery"},
        },
    ]
    tasks = _tasks(tmp_path / "tasks.jsonl", rows)
    with gateway_env(tmp_path, [" refund", " refund", " refund", " refund"]) as (
        store,
        gw,
        _,
        url,
    ):
        proc = subprocess.run(
            [
                *CLI,
                "run",
                TRIAGE,
                "--gateway",
                gw.url,
                "--store-url",
                url,
                "--tasks",
                str(tasks),
                "--group-size",
                "2",
                "--workers",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["rollouts"] == 4 and summary["states"] == {"succeeded": 4}
        assert summary["mean_reward"] == pytest.approx(0.5)  # both answers say refund: one task right
        rollouts = store.list_rollouts(state=RolloutState.succeeded)
        assert len(rollouts) == 4 and len({r.group_id for r in rollouts}) == 2
        assert all(store.list_spans(rollout_id=r.rollout_id, kind=SpanKind.llm) for r in rollouts)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"input": {"text": "ok"}}\n{"input": \n', "tasks.jsonl:2"),
        ('{"metadata": {}}\n', 'no "input"'),
        ("", "holds no tasks"),
        (b"\xff\xfe{}".decode("latin-1"), "tasks.jsonl:1"),
    ],
)
def test_run_rejects_a_bad_task_file_before_touching_the_queue(
    tmp_path: Path, content: str, message: str
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(content, encoding="utf-8")
    db = tmp_path / "never.db"
    proc = subprocess.run(
        [
            *CLI,
            "run",
            TRIAGE,
            "--gateway",
            "http://127.0.0.1:9",
            "--store-url",
            f"sqlite:///{db}",
            "--tasks",
            str(tasks),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not db.exists()  # nothing was opened, let alone half-written


def test_run_rejects_a_malformed_pin(tmp_path: Path) -> None:
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"input": {"text": "hi"}}])
    proc = subprocess.run(
        [*CLI, "run", TRIAGE, "--tasks", str(tasks), "--pin", "policy"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "NAME=VERSION" in proc.stderr


def test_train_rejects_a_missing_task_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            *CLI,
            "train",
            TRIAGE,
            "--tasks",
            str(tmp_path / "nope.jsonl"),
            "--output-dir",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.vllm
def test_train_runs_grpo_steps_and_hot_swaps(tmp_path: Path) -> None:
    from agentforge.agents.customer_service.datasets import bitext_triage_tasks

    train, held_out = bitext_triage_tasks(8, 4)
    tasks = _tasks(tmp_path / "train.jsonl", [t.model_dump() for t in train])
    evals = _tasks(tmp_path / "eval.jsonl", [t.model_dump() for t in held_out])
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            *CLI,
            "train",
            TRIAGE,
            "--tasks",
            str(tasks),
            "--eval-tasks",
            str(evals),
            "--output-dir",
            str(out),
            "--steps",
            "2",
            "--group-size",
            "2",
            "--tasks-per-step",
            "2",
            "--swap-every",
            "1",
            "--max-completion-length",
            "8",
            "--workers",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # a step publishes (and hot-swaps) a version only when it had a learning signal; every step is one or other
    versions = summary["versions"]
    assert summary["steps"] == 2 and len(versions) + summary["skipped_publishes"] == 2
    assert versions == [f"policy@v{i}" for i in range(1, len(versions) + 1)]
    assert summary["version"] == (versions[-1] if versions else "policy@v0")
    assert 0.0 <= summary["before"] <= 1.0 and 0.0 <= summary["after"] <= 1.0
    assert (out / "traces.db").exists()


def test_optimize_prompt_rejects_a_bad_task_file(tmp_path: Path) -> None:
    good = _tasks(tmp_path / "ok.jsonl", [{"input": {"text": "hi"}, "metadata": {"label": "order"}}])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": {"text": "hi"}}\nnot json\n', encoding="utf-8")
    proc = subprocess.run(
        [
            *CLI,
            "optimize-prompt",
            TRIAGE,
            "--name",
            "prompt:triage",
            "--tasks",
            str(good),
            "--val-tasks",
            str(bad),
            "--store-url",
            f"sqlite:///{tmp_path / 'never.db'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "bad.jsonl:2" in proc.stderr, proc.stderr
    assert not (tmp_path / "never.db").exists()


@pytest.mark.slow
@pytest.mark.vllm
def test_optimize_prompt_runs_gepa_on_real_rollouts_and_without_test_tasks_activates_nothing(
    tmp_path: Path,
) -> None:
    """The CLI as a user runs it with no ``--test-tasks`` (issue 36, prompt-optimiser selection): GEPA runs on
    real rollouts, and whatever wins on the validation tasks is not activated on their scores."""
    from agentforge.agents.customer_service.datasets import bitext_triage_tasks
    from agentforge.prompts import get_prompt
    from agentforge.stores.sql import SQLStore

    train, _ = bitext_triage_tasks(12, 6)
    tasks = _tasks(tmp_path / "train.jsonl", [t.model_dump() for t in train[:6]])
    val = _tasks(tmp_path / "val.jsonl", [t.model_dump() for t in train[6:]])
    db = f"sqlite:///{tmp_path / 'traces.db'}"
    proc = subprocess.run(
        [
            *CLI,
            "optimize-prompt",
            TRIAGE,
            "--name",
            "prompt:triage",
            "--tasks",
            str(tasks),
            "--val-tasks",
            str(val),
            "--seed-prompt",
            "Reply.",
            "--budget",
            "15",
            "--minibatch",
            "3",
            "--store-url",
            db,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 < summary["rollouts_used"] <= 15
    assert summary["activated_version"] is None and summary["active_version"] == summary["seed_version"]
    store = SQLStore(db)
    assert get_prompt(store, "prompt:triage").version == summary["active_version"]
    pinned = {r.resources.get("prompt:triage") for r in store.list_rollouts()}
    assert str(summary["seed_version"]) in pinned  # every rollout recorded the prompt version it used


AGENTS_PY = """
import time

def boom(task, ctx):
    raise RuntimeError("boom: the agent failed")

def slow(task, ctx):
    time.sleep(30)
    return 1.0

NOT_AN_AGENT = (1, 2)
"""


def test_run_exits_1_with_the_reason_when_rollouts_fail_and_loads_agents_from_files(tmp_path: Path) -> None:
    (tmp_path / "my_agents.py").write_text(AGENTS_PY)
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"input": {"text": "hi"}}])
    with gateway_env(tmp_path, []) as (store, gw, _, url):
        proc = subprocess.run(
            [
                *CLI,
                "run",
                str(tmp_path / "my_agents.py") + ":boom",
                "--gateway",
                gw.url,
                "--store-url",
                url,
                "--tasks",
                str(tasks),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 1 and "boom: the agent failed" in proc.stderr, proc.stderr
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        assert summary["states"] == {"failed": 1} and any("boom" in e for e in summary["errors"])
        (rollout,) = store.list_rollouts()
        assert rollout.agent.endswith("my_agents.py:boom")  # stored under the spec: no other runner takes it


def test_run_cancels_what_it_leaves_unfinished(tmp_path: Path) -> None:
    (tmp_path / "my_agents.py").write_text(AGENTS_PY)
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"input": {"text": "hi"}}] * 3)
    with gateway_env(tmp_path, []) as (store, gw, _, url):
        proc = subprocess.run(
            [
                *CLI,
                "run",
                "my_agents:slow",
                "--gateway",
                gw.url,
                "--store-url",
                url,
                "--tasks",
                str(tasks),
                "--workers",
                "1",
                "--timeout",
                "2",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert proc.returncode == 1 and "unfinished" in proc.stderr, proc.stderr
        assert not store.list_rollouts(state=RolloutState.queued)
        assert store.list_rollouts(state=RolloutState.cancelled)


def test_sigterm_cleans_up_like_ctrl_c(tmp_path: Path) -> None:
    """``kill`` of ``agentforge run`` leaves none of its rollouts running or queued (a new user found them
    still ``running`` after a SIGTERM, waiting for their heartbeats to time out)."""
    import signal
    import time

    (tmp_path / "my_agents.py").write_text(AGENTS_PY)
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"input": {"text": "hi"}}] * 3)
    with gateway_env(tmp_path, []) as (store, gw, _, url):
        proc = subprocess.Popen(
            [
                *CLI,
                "run",
                "my_agents:slow",
                "--gateway",
                gw.url,
                "--store-url",
                url,
                "--tasks",
                str(tasks),
                "--workers",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        deadline = time.monotonic() + 120
        while not store.list_rollouts(state=RolloutState.running) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.list_rollouts(state=RolloutState.running), "no rollout started"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, err
        left = store.list_rollouts(state=RolloutState.running) + store.list_rollouts(
            state=RolloutState.queued
        )
        assert left == [], err
        assert len(store.list_rollouts(state=RolloutState.cancelled)) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["my_agents:NOT_AN_AGENT"], "not an agent"),
        (["my_agents:missing"], "no attribute"),
        (["nosuch_module_xyz:agent"], "cannot import"),
        ([TRIAGE, "--gateway", "notaurl"], "not a URL"),
        ([TRIAGE, "--pin", "prompt:triage=abc"], "must be a number"),
        ([TRIAGE, "--pin", "policy=policy@v99", "--store-url", "sqlite:///pins.db"], "no such version"),
        ([TRIAGE, "--store-url", "garbage"], "not a store URL"),
    ],
)
def test_run_rejects_bad_specs_and_options_clearly(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "my_agents.py").write_text(AGENTS_PY)
    tasks = _tasks(tmp_path / "tasks.jsonl", [{"input": {"text": "hi"}}])
    proc = subprocess.run(
        [*CLI, "run", *args, "--tasks", str(tasks)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
