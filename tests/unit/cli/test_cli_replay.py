"""`agentforge replay export/import` from the command line: round trip, empty filters, corrupted files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import gateway_env

from agentforge.agents.customer_service.triage import triage_agent
from agentforge.runtime import Runner, enqueue_tasks, wait_for_rollouts
from agentforge.stores.sql import SQLStore
from agentforge.types import Task

CLI = [sys.executable, "-m", "agentforge.cli", "replay"]


def _traces(tmp_path: Path) -> str:
    """A SQLite store holding 4 triage rollouts (2 rewarded 1, 2 rewarded 0) recorded through a gateway."""
    tasks = [
        Task(
            task_id="a", input={"text": "refund please ✨", "temperature": 0.0}, metadata={"label": "refund"}
        ),
        Task(task_id="b", input={"text": "where is it", "temperature": 0.0}, metadata={"label": "delivery"}),
    ]
    with gateway_env(tmp_path, [" refund"] * 4) as (store, gw, _, url):
        with Runner(store, triage_agent, gw.url, workers=2):
            rollouts = enqueue_tasks(store, tasks, group_size=2, agent="triage")
            wait_for_rollouts(store, [r.rollout_id for r in rollouts], timeout_s=120)
    return url


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def test_export_import_export_is_byte_identical(tmp_path: Path) -> None:
    url = _traces(tmp_path)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    out = _cli("export", str(first), "--store-url", url, "--agent", "triage")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["records"] == 4
    other = f"sqlite:///{tmp_path / 'other.db'}"
    imp = _cli("import", str(first), "--store-url", other)
    assert imp.returncode == 0 and json.loads(imp.stdout)["imported"] == 4, imp.stderr
    assert _cli("export", str(second), "--store-url", other).returncode == 0
    assert first.read_bytes() == second.read_bytes()
    again = _cli("import", str(first), "--store-url", other)  # idempotent
    assert json.loads(again.stdout)["imported"] == 0 and json.loads(again.stdout)["already_present"] == 4


def test_filters_select_by_reward_and_hf_export_has_one_row_per_trajectory(tmp_path: Path) -> None:
    url = _traces(tmp_path)
    out = _cli("export", str(tmp_path / "good.jsonl"), "--store-url", url, "--min-reward", "1")
    assert json.loads(out.stdout)["records"] == 2, out.stderr
    hf = _cli("export", str(tmp_path / "ds"), "--format", "hf", "--store-url", url, "--task", "a")
    assert hf.returncode == 0, hf.stderr
    from datasets import load_from_disk

    ds = load_from_disk(str(tmp_path / "ds"))
    assert len(ds) == 2 and set(ds["reward"]) == {1.0}


def test_a_filter_that_selects_nothing_is_an_error_and_writes_nothing(tmp_path: Path) -> None:
    url = _traces(tmp_path)
    target = tmp_path / "none.jsonl"
    out = _cli("export", str(target), "--store-url", url, "--min-reward", "2")
    assert out.returncode == 2 and "reward" in out.stderr.lower()
    assert not target.exists()
    bad_time = _cli("export", str(target), "--store-url", url, "--since", "yesterday")
    assert bad_time.returncode == 2 and "ISO" in bad_time.stderr


def test_corrupted_lines_are_counted_skips_or_refuse_the_file_with_strict(tmp_path: Path) -> None:
    url = _traces(tmp_path)
    good = tmp_path / "good.jsonl"
    assert _cli("export", str(good), "--store-url", url).returncode == 0
    lines = good.read_bytes().splitlines(keepends=True)
    corrupted = tmp_path / "bad.jsonl"
    corrupted.write_bytes(
        lines[0] + lines[1][: len(lines[1]) // 2] + b"\n" + b"\xff\xfe\n" + b"".join(lines[2:])
    )
    strict_db = tmp_path / "strict.db"
    strict = _cli("import", str(corrupted), "--store-url", f"sqlite:///{strict_db}", "--strict")
    assert strict.returncode == 2 and "line 2" in strict.stderr.lower(), strict.stderr
    assert SQLStore(f"sqlite:///{strict_db}").list_rollouts() == []  # nothing half-written
    loose = _cli("import", str(corrupted), "--store-url", f"sqlite:///{tmp_path / 'loose.db'}")
    report = json.loads(loose.stdout)
    assert loose.returncode == 0 and report["imported"] == 3 and sum(report["skipped"].values()) == 2
    assert "line 2" in loose.stderr and "line 3" in loose.stderr


def _groups(tmp_path: Path) -> str:
    """Two groups of 4 triage rollouts with rewards [1, 0, 1, 0] each (one worker: queue order is answer order)."""
    tasks = [
        Task(task_id="a", input={"text": "refund please", "temperature": 1.0}, metadata={"label": "refund"}),
        Task(task_id="b", input={"text": "where is it", "temperature": 1.0}, metadata={"label": "delivery"}),
    ]
    turns = [" refund", " delivery"] * 2 + [" delivery", " refund"] * 2
    with gateway_env(tmp_path, turns) as (store, gw, _, url):
        with Runner(store, triage_agent, gw.url, workers=1):
            rollouts = enqueue_tasks(store, tasks, group_size=4, agent="triage")
            wait_for_rollouts(store, [r.rollout_id for r in rollouts], timeout_s=120)
    return url


@pytest.mark.slow
def test_replay_sft_and_grpo_publish_adapter_versions_serving_follows(tmp_path: Path) -> None:
    """The commands' plumbing (selection, training, publishing) on the tiny model: the default model's training
    is the subject of ``tests/integration/test_replay_sft.py`` and the main job."""
    from tiny_model import tiny_model

    url, model = _groups(tmp_path), str(tiny_model())
    out = _cli(
        "sft",
        "--model",
        model,
        "--store-url",
        url,
        "--agent",
        "triage",
        "--epochs",
        "1",
        "--batch-size",
        "2",
        "--output-dir",
        str(tmp_path / "sft"),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["selected"] == 4 and result["version"] == "policy@v1" and result["sampled_tokens"] > 0
    assert Path(result["adapter_dir"], "adapter_config.json").exists()
    grpo = _cli(
        "grpo",
        "--model",
        model,
        "--store-url",
        url,
        "--agent",
        "triage",
        "--group-size",
        "4",
        "--groups-per-step",
        "2",
        "--output-dir",
        str(tmp_path / "grpo"),
    )
    assert grpo.returncode == 0, grpo.stderr[-2000:]
    summary = json.loads(grpo.stdout.strip().splitlines()[-1])
    assert summary["groups"] == 2 and summary["steps"] == 1 and summary["versions"] == ["policy@v2"]
    store = SQLStore(url)
    assert store.get_resource("policy").ref == "policy@v2" and store.get_resource("policy").kind == "adapter"


def test_replay_jobs_refuse_an_empty_selection_and_publish_nothing(tmp_path: Path) -> None:
    url = _traces(tmp_path)
    for job in (["sft", "--agent", "nobody"], ["grpo", "--agent", "nobody"]):
        out = _cli(*job, "--store-url", url, "--output-dir", str(tmp_path / job[0]))
        assert out.returncode == 2 and "nobody" in out.stderr, out.stderr[-2000:]
    assert list(SQLStore(url).list_resources("policy")) == []


def test_store_urls_and_paths_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    garbage = _cli("export", str(tmp_path / "x.jsonl"), "--store-url", "garbage")
    assert (
        garbage.returncode == 2 and "not a store URL" in garbage.stderr and "Traceback" not in garbage.stderr
    )
    typo = tmp_path / "typo.db"
    missing = _cli("export", str(tmp_path / "x.jsonl"), "--store-url", f"sqlite:///{typo}")
    assert missing.returncode == 2 and "no trace store" in missing.stderr and not typo.exists()
    no_dir = _cli("import", str(tmp_path / "x.jsonl"), "--store-url", f"sqlite:///{tmp_path}/nodir/x.db")
    assert no_dir.returncode == 2 and "does not exist" in no_dir.stderr and not (tmp_path / "nodir").exists()
    url = _traces(tmp_path)
    onto_dir = _cli("export", str(tmp_path), "--store-url", url)
    assert onto_dir.returncode == 2 and "Traceback" not in onto_dir.stderr
    bad_limit = _cli("export", str(tmp_path / "y.jsonl"), "--store-url", url, "--limit", "-1")
    assert bad_limit.returncode == 2 and "Traceback" not in bad_limit.stderr
    bad_time = _cli("export", str(tmp_path / "y.jsonl"), "--store-url", url, "--since", "nan")
    assert bad_time.returncode == 2


def test_import_refuses_files_without_a_single_trace(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'target.db'}"
    for name, content in [
        ("empty.jsonl", b""),
        ("noise.jsonl", b"\x00\xff garbage\n[1, 2]\n"),
        ("array.jsonl", b"[]\n"),
    ]:
        (tmp_path / name).write_bytes(content)
        out = _cli("import", str(tmp_path / name), "--store-url", url)
        assert out.returncode == 2 and "agentforge replay export" in out.stderr, (name, out.stderr)
    (tmp_path / "ds").mkdir()
    out = _cli("import", str(tmp_path / "ds"), "--store-url", url)
    assert out.returncode == 2 and "directory" in out.stderr


def test_archive_exports_every_state_and_resource_versions_are_normalised(tmp_path: Path) -> None:
    url = _traces(tmp_path)
    store = SQLStore(url)
    from agentforge.types import Rollout

    store.enqueue_rollout(Rollout(agent="triage"))  # queued, no reward, no spans
    plain = json.loads(_cli("export", str(tmp_path / "a.jsonl"), "--store-url", url).stdout)
    everything = json.loads(_cli("export", str(tmp_path / "b.jsonl"), "--store-url", url, "--archive").stdout)
    assert plain["records"] == 4 and everything["records"] == 5
    pinned = _cli("export", str(tmp_path / "c.jsonl"), "--store-url", url, "--resource", "prompt:triage=v1")
    assert pinned.returncode == 0 and json.loads(pinned.stdout)["records"] == 4, pinned.stderr


def test_an_export_from_a_store_server_takes_its_keys_and_is_logged(tmp_path: Path) -> None:
    """Issue 36, Low: ``replay`` had no store-key option and exports from an HTTP store were never logged in
    ``privacy:exports`` (the ledger ``forget`` lists); with the keys from the environment both work."""
    import os

    from fixtures_store import serve_app

    from agentforge.privacy.ledger import EXPORTS
    from agentforge.stores.server import create_store_app

    url = _traces(tmp_path)
    key, admin = "replay-store-key-0123456789", "replay-admin-key-0123456789"
    with SQLStore(url) as store, serve_app(create_store_app(store, api_key=key, admin_key=admin)) as server:
        env = {**os.environ, "AGENTFORGE_API_KEY": key, "AGENTFORGE_ADMIN_KEY": admin}
        out = tmp_path / "http.jsonl"
        done = subprocess.run(
            [*CLI, "export", str(out), "--store-url", server],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1])["records"] == 4
        assert [v.payload["path"] for v in store.list_resources(EXPORTS)] == [str(out)]
