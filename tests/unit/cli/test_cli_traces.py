"""`agentforge traces list/show`: stored rollouts, their calls, rewards and training trajectories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_store import HTTP_KEYS, serve_app
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.commands.traces import mask_runs, parse_since
from agentforge.stores.sql import SQLStore
from agentforge.types import AttemptState, LLMCall, Reward, Rollout, Span, SpanKind, Task

runner = CliRunner()


def _llm(rollout_id: str, attempt_id: str, prompt: list[int], completion: list[int], version: str, **kw):  # type: ignore[no-untyped-def]
    call = LLMCall(
        model="policy",
        version=version,
        request=kw.pop("request", {"messages": []}),
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=[-0.5] * len(completion),
        response_text=kw.pop("text", "ok"),
        finish_reason="stop",
        latency_s=0.25,
    )
    return Span(rollout_id=rollout_id, attempt_id=attempt_id, kind=SpanKind.llm, llm=call)


def _rollout(store: SQLStore, agent: str, reward: float | None, version: str) -> str:
    """One finished rollout: two LLM calls that merge into one trajectory, a tool span, a reward."""
    rollout = store.enqueue_rollout(
        Rollout(agent=agent, task=Task(task_id=f"{agent}-task", input={"q": "hi"}))
    )
    claimed = store.claim_rollout("worker-1", agent=agent)
    assert claimed is not None
    rid, aid = rollout.rollout_id, claimed[1].attempt_id
    first = {"messages": [{"role": "user", "content": "Where is order #7?"}]}
    store.add_span(_llm(rid, aid, [1, 2, 3], [4, 5, 6], version, request=first, text=""))
    store.add_span(Span(rollout_id=rid, attempt_id=aid, kind=SpanKind.tool, name="find_order", ended_at=None))
    second = {
        "messages": [
            {"role": "user", "content": "Where is order #7?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "find_order", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "order 7: shipped"},
        ]
    }
    store.add_span(
        _llm(rid, aid, [1, 2, 3, 4, 5, 6, 7, 8], [9, 10], version, request=second, text="It shipped.")
    )
    if reward is not None:
        store.add_reward(
            Reward(
                rollout_id=rid,
                attempt_id=aid,
                value=reward,
                final=True,
                metadata={"parts": {"db_match": 1.0}},
            )
        )
    store.finish_attempt(aid, AttemptState.succeeded)
    return rid


@pytest.fixture
def filled(tmp_path: Path) -> tuple[str, list[str]]:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    with SQLStore(url) as store:
        ids = [
            _rollout(store, "shop", 1.0, "policy@v0"),
            _rollout(store, "library.agent:library_agent", 0.0, "policy@v12"),
            _rollout(store, "triage", None, "policy@v2"),
        ]
        store.enqueue_rollout(Rollout(agent="shop"))  # still queued
    return url, ids


def _json(*args: str) -> object:
    result = runner.invoke(app, ["traces", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_list_filters_by_agent_state_reward_version_and_age(filled: tuple[str, list[str]]) -> None:
    url, ids = filled
    everything = _json("list", "--store-url", url)
    assert [r["rollout_id"] for r in everything][:3] == ids and len(everything) == 4
    assert [r["rollout_id"] for r in _json("list", "--store-url", url, "--agent", "triage")] == [ids[2]]
    assert len(_json("list", "--store-url", url, "--state", "queued")) == 1
    assert [r["rollout_id"] for r in _json("list", "--store-url", url, "--min-reward", "0.5")] == [ids[0]]
    assert [r["rollout_id"] for r in _json("list", "--store-url", url, "--max-reward", "0.5")] == [ids[1]]
    assert [r["rollout_id"] for r in _json("list", "--store-url", url, "--version", "v2")] == [ids[2]]
    assert [r["rollout_id"] for r in _json("list", "--store-url", url, "--version", "policy@v12")] == [ids[1]]
    assert _json("list", "--store-url", url, "--since", "2026-01-01T00:00:00") != []
    assert _json("list", "--store-url", url, "--since", "2100-01-01") == []
    assert [
        r["rollout_id"] for r in _json("list", "--store-url", url, "--limit", "1", "--state", "succeeded")
    ] == [ids[2]]
    row = everything[0]
    assert row["reward"] == 1.0 and row["versions"] == ["policy@v0"] and row["llm_calls"] == 2


def test_list_table_fits_80_columns_and_keeps_ids_whole(filled: tuple[str, list[str]]) -> None:
    url, ids = filled
    result = runner.invoke(app, ["traces", "list", "--store-url", url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert max(len(line) for line in lines) <= 80
    for rid in ids:
        assert any(rid in line for line in lines), rid


def test_show_has_conversation_spans_rewards_and_the_trainers_trajectory(
    filled: tuple[str, list[str]],
) -> None:
    url, ids = filled
    data = _json("show", ids[0], "--store-url", url)
    assert isinstance(data, dict)
    roles = [m["role"] for m in data["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]
    assert data["messages"][-1]["content"] == "It shipped."
    assert [s["kind"] for s in data["spans"]] == ["llm", "tool", "llm"]
    assert data["spans"][0]["latency_s"] == 0.25 and data["spans"][0]["version"] == "policy@v0"
    assert data["rewards"][0]["parts"] == {"db_match": 1.0} and data["rewards"][0]["training"]
    assert data["training_reward"] == 1.0
    (traj,) = data["trajectories"]  # the second call continues the first: one trajectory
    assert traj["mask"] == "1×3 0×2 1×2" and traj["sampled_tokens"] == 5 and traj["env_tokens"] == 2
    assert traj["prompt_tokens"] == 3 and traj["trains"]

    text = runner.invoke(app, ["traces", "show", ids[0], "--store-url", url], env={"COLUMNS": "80"})
    assert text.exit_code == 0, text.output
    for expected in ("Where is order #7?", "find_order", "It shipped.", "db_match=1", "1×3 0×2 1×2", "0.25s"):
        assert expected in text.stderr, expected


def test_show_unknown_rollout_and_missing_store_are_clear_errors(
    filled: tuple[str, list[str]], tmp_path: Path
) -> None:
    url, _ = filled
    unknown = runner.invoke(app, ["traces", "show", "ro-nope", "--store-url", url])
    assert unknown.exit_code == 2 and "ro-nope" in unknown.stderr
    missing = runner.invoke(app, ["traces", "list", "--store-url", f"sqlite:///{tmp_path / 'typo.db'}"])
    assert missing.exit_code == 2 and not (tmp_path / "typo.db").exists()
    bad = runner.invoke(app, ["traces", "list", "--store-url", url, "--since", "yesterday"])
    assert bad.exit_code == 2 and "--since" in bad.output + bad.stderr


def test_traces_over_a_store_server(filled: tuple[str, list[str]], tmp_path: Path) -> None:
    from agentforge.stores.server import create_store_app

    url, ids = filled
    with SQLStore(url) as backing, serve_app(create_store_app(backing, **HTTP_KEYS)) as http_url:
        listed = runner.invoke(
            app,
            ["traces", "list", "--store-url", http_url, "--json"],
            env={"AGENTFORGE_API_KEY": HTTP_KEYS["api_key"]},
        )
        assert listed.exit_code == 0, listed.output
        assert [r["rollout_id"] for r in json.loads(listed.stdout)][:3] == ids
        shown = runner.invoke(
            app,
            ["traces", "show", ids[1], "--store-url", http_url, "--json", "--api-key", HTTP_KEYS["api_key"]],
        )
        assert shown.exit_code == 0 and json.loads(shown.stdout)["trajectories"][0]["mask"] == "1×3 0×2 1×2"


def test_parse_since_and_mask_runs() -> None:
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("1970-01-01T00:01:00") == 60.0
    assert mask_runs([]) == "" and mask_runs([1, 1, 0, 1]) == "1×2 0×1 1×1"


def test_show_says_why_a_call_failed(tmp_path: Path) -> None:
    """A failed call's span shows its error and flags (a new user saw only 'error' and could not tell why)."""
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    with SQLStore(url) as store:
        rid = store.enqueue_rollout(Rollout(agent="shop")).rollout_id
        failed = LLMCall(model="policy", trainable=False, flags=["client_disconnected"])
        store.add_span(
            Span(
                rollout_id=rid,
                kind=SpanKind.llm,
                llm=failed,
                status="error",
                error="client disconnected before the engine answered",
            )
        )
    data = _json("show", rid, "--store-url", url)
    assert data["spans"][0]["error"] == "client disconnected before the engine answered"
    assert data["spans"][0]["flags"] == ["client_disconnected"]
    text = runner.invoke(app, ["traces", "show", rid, "--store-url", url], env={"COLUMNS": "80"})
    assert "client disconnected before the engine answered" in text.stderr
    assert "[client_disconnected]" in text.stderr


def test_show_names_why_a_conversation_split(tmp_path: Path) -> None:
    """A call that could not continue the conversation token-exactly shows its prefix_break flag, so the
    rollout's second trajectory has a visible cause (issue 12 item 2)."""
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    with SQLStore(url) as store:
        rid = store.enqueue_rollout(Rollout(agent="shop")).rollout_id
        store.add_span(_llm(rid, None, [1, 2], [3], "policy@v0"))  # type: ignore[arg-type]
        broken = _llm(rid, None, [1, 9, 3, 4], [5], "policy@v0")  # type: ignore[arg-type]
        broken.llm.flags = ["prefix_break:history"]  # type: ignore[union-attr]
        store.add_span(broken)
    data = _json("show", rid, "--store-url", url)
    assert len(data["trajectories"]) == 2
    text = runner.invoke(app, ["traces", "show", rid, "--store-url", url], env={"COLUMNS": "100"})
    assert "flags: prefix_break:history" in text.stderr
