"""`agentforge versions` / `agentforge rollback`: one call back to an earlier prompt or adapter version."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from adapters import rank_adapter

from agentforge.gate import Decision, record_decision
from agentforge.prompts import get_prompt, publish_prompt, start_prompt_canary
from agentforge.stores.sql import SQLStore
from agentforge.trainers.publish import StorePublisher
from agentforge.types import ResourceVersion

CLI = [sys.executable, "-m", "agentforge.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


def test_rollback_a_prompt_and_an_adapter(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(url)
    publish_prompt(store, "prompt:triage", "Reply.")
    publish_prompt(store, "prompt:triage", "Category options: a, b. Reply with the category.")
    StorePublisher(store).publish(rank_adapter(8), step=5)
    StorePublisher(store).publish(rank_adapter(8), step=10)

    listed = json.loads(_cli("versions", "--store-url", url).stdout)
    assert {(v["name"], v["version"], v["active"]) for v in listed} >= {
        ("prompt:triage", 2, True),
        ("policy", 2, True),
    }

    out = _cli("rollback", "prompt:triage", "1", "--store-url", url)
    assert out.returncode == 0, out.stderr
    assert get_prompt(store, "prompt:triage").payload["template"] == "Reply."

    out = _cli("rollback", "policy", "policy@v1", "--store-url", url)
    assert out.returncode == 0 and json.loads(out.stdout)["active_version"] == 3, out.stderr
    active = store.get_resource("policy")
    assert active.payload["rollback_of"] == 1 and active.payload["step"] == 5


def test_rollback_errors_are_clear(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    publish_prompt(SQLStore(url), "prompt:triage", "Reply.")
    unknown = _cli("rollback", "prompt:nope", "1", "--store-url", url)
    assert unknown.returncode == 2 and "no resource named 'prompt:nope'" in unknown.stderr
    missing = _cli("rollback", "prompt:triage", "7", "--store-url", url)
    assert missing.returncode == 2 and "7" in missing.stderr
    garbage = _cli("rollback", "prompt:triage", "latest", "--store-url", url)
    assert garbage.returncode == 2 and "not a version number" in garbage.stderr


def test_versions_shows_markup_like_text_verbatim(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    publish_prompt(SQLStore(url), "prompt:[/x]", "Reply in the form [/label] or [bold]x[/bold]")
    out = _cli("versions", "--store-url", url)
    assert out.returncode == 0 and "[/label]" in out.stderr, out.stderr
    assert _cli("rollback", "prompt:[/x]", "1", "--store-url", url).returncode == 0


def test_versions_shows_the_promotion_history(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(url)
    for step in (5, 10):
        store.publish_resource(
            ResourceVersion(
                name="policy", kind="adapter", payload={"path": str(rank_adapter(8)), "step": step}
            ),
            activate=step == 5,
        )
    evidence = {"live_scores": [1.0, 1.0], "candidate_scores": [0.0, 0.0], "test": {"p_value": 1.0}}
    publish_prompt(store, "prompt:triage", "Reply.")
    publish_prompt(store, "prompt:triage", "Reply briefly.", activate=False)
    start_prompt_canary(store, "prompt:triage", 2, 0.2)  # its state record is no version to list
    record_decision(
        store, Decision("policy", "eval", "refused", "policy@v2", "policy@v1", "gain -1.000, p = 1", evidence)
    )
    wide = {**os.environ, "COLUMNS": "200"}  # rich wraps table cells to the terminal's width
    out = subprocess.run(
        [*CLI, "versions", "policy", "--store-url", url], capture_output=True, text=True, env=wide
    )
    assert out.returncode == 0, out.stderr
    listed = {v["version"]: v for v in json.loads(out.stdout)}
    everything = json.loads(
        subprocess.run([*CLI, "versions", "--store-url", url], capture_output=True, text=True).stdout
    )
    assert {v["name"] for v in everything} == {"policy", "prompt:triage"}
    assert set(listed) == {1, 2} and listed[1]["decisions"] == []  # the decision log is no version row
    (refusal,) = listed[2]["decisions"]
    assert (refusal["stage"], refusal["outcome"], refusal["live"]) == ("eval", "refused", "policy@v1")
    assert refusal["evidence"] == evidence
    assert "promotion history" in out.stderr and "eval refused" in out.stderr and "gain -1.000" in out.stderr
