"""Prompt versions: templates are versioned resources; a rollout reads its prompt when it starts.

Checked with the real runner and gateway in front of a scripted engine (no LLM): publishing a version
makes the next rollout use it and record it on the rollout; rolling back is one call; a pinned version
wins over the active one (also an unactivated one); an unknown pinned version fails the rollout with a
clear ``NotFoundError``; the customer-service triage agent reads its system prompt this way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_helpers import gateway_env

from agentforge.agents.customer_service.prompts import CS_PROMPT_NAME, load_prompt
from agentforge.agents.customer_service.triage import (
    CATEGORIES,
    TRIAGE_PROMPT_NAME,
    triage_agent,
    triage_prompt,
)
from agentforge.errors import NotFoundError, UserError
from agentforge.prompts import (
    get_prompt,
    list_prompts,
    publish_prompt,
    rollback_prompt,
    rollouts_with_prompt,
)
from agentforge.runtime import Runner, enqueue_tasks
from agentforge.testing import memory_store
from agentforge.types import ResourceVersion, RolloutState, Task

# The watchdog is not under test here: a timeout a loaded 2-core CI machine cannot trip (2.0 s did once,
# re-queueing a rollout that was still running, so its call reached the engine twice).
FAST = {"heartbeat_s": 0.2, "heartbeat_timeout_s": 30.0, "poll_s": 0.02}


def _task(text: str = "I want my money back", label: str = "refund") -> Task:
    return Task(input={"text": text, "temperature": 0.0}, metadata={"label": label})


def _systems(upstream) -> list[str]:
    return [r.body["messages"][0]["content"] for r in upstream.requests]


def test_publish_get_rollback_and_list() -> None:
    store = memory_store()
    with pytest.raises(NotFoundError, match="no active version; publish one"):
        get_prompt(store, "prompt:x")
    v1 = get_prompt(store, "prompt:x", default="one")
    assert (v1.version, v1.active, v1.payload["template"]) == (1, True, "one")
    assert get_prompt(store, "prompt:x", default="ignored").version == 1  # present: default not published
    v2 = publish_prompt(store, "prompt:x", "two", metadata={"source": "test"})
    assert (v2.version, v2.payload["metadata"]) == (2, {"source": "test"})
    assert get_prompt(store, "prompt:x").payload["template"] == "two"
    v3 = publish_prompt(store, "prompt:x", "three", activate=False)
    assert get_prompt(store, "prompt:x").version == 2 and get_prompt(store, "prompt:x", "3") == v3
    assert rollback_prompt(store, "prompt:x", 1).active
    assert get_prompt(store, "prompt:x").payload["template"] == "one"
    with pytest.raises(NotFoundError, match=r"versions are \[1, 2, 3\]"):
        rollback_prompt(store, "prompt:x", 7)
    with pytest.raises(NotFoundError, match=r"has no version 7 \(versions: \[1, 2, 3\]\)"):
        get_prompt(store, "prompt:x", version=7)
    store.publish_resource(ResourceVersion(name="policy", kind="adapter", payload={"path": "/a"}))
    assert [(r.name, r.version) for r in list_prompts(store)] == [
        ("prompt:x", 1),
        ("prompt:x", 2),
        ("prompt:x", 3),
    ]
    assert rollback_prompt(store, "prompt:x", "prompt:x@v2").version == 2
    with pytest.raises(UserError, match="not a version number"):
        rollback_prompt(store, "prompt:x", "latest")
    with pytest.raises(UserError, match="names 'prompt:y'"):
        get_prompt(store, "prompt:x", version="prompt:y@v2")
    with pytest.raises(UserError, match="must be a str"):
        publish_prompt(store, "prompt:x", None)  # type: ignore[arg-type]


def test_cs_load_prompt_delegates_to_get_prompt() -> None:
    store = memory_store()
    assert load_prompt(store).version == 1 and load_prompt(store, version="1").name == CS_PROMPT_NAME
    with pytest.raises(NotFoundError, match="has no version 5"):
        load_prompt(store, version=5)


def test_triage_rollouts_read_record_and_follow_published_versions(tmp_path: Path) -> None:
    turns = [" refund"] * 5
    with gateway_env(tmp_path, turns) as (store, gateway, upstream, _):
        with Runner(store, triage_agent, gateway.url, **FAST) as runner:
            (first,) = enqueue_tasks(store, [_task()])
            runner.run_until_done([first.rollout_id], timeout_s=30)
            publish_prompt(store, TRIAGE_PROMPT_NAME, "Answer with a category.")
            (second,) = enqueue_tasks(store, [_task()])
            runner.run_until_done([second.rollout_id], timeout_s=30)
            unactivated = publish_prompt(store, TRIAGE_PROMPT_NAME, "Pinned candidate.", activate=False)
            (pinned,) = enqueue_tasks(
                store, [_task()], resources={TRIAGE_PROMPT_NAME: str(unactivated.version)}
            )
            runner.run_until_done([pinned.rollout_id], timeout_s=30)
            rollback_prompt(store, TRIAGE_PROMPT_NAME, 1)  # rollback: one call
            (fourth,) = enqueue_tasks(store, [_task()])
            runner.run_until_done([fourth.rollout_id], timeout_s=30)
        assert _systems(upstream) == [
            triage_prompt(CATEGORIES),
            "Answer with a category.",
            "Pinned candidate.",
            triage_prompt(CATEGORIES),
        ]
        recorded = [
            store.get_rollout(r.rollout_id).resources[TRIAGE_PROMPT_NAME]
            for r in (first, second, pinned, fourth)
        ]
        assert recorded == ["1", "2", "3", "1"]
        assert all(store.final_reward(r.rollout_id).value == 1.0 for r in (first, second, pinned, fourth))
        assert [r.rollout_id for r in rollouts_with_prompt(store, TRIAGE_PROMPT_NAME, 1)] == [
            first.rollout_id,
            fourth.rollout_id,
        ]
        assert [r.rollout_id for r in rollouts_with_prompt(store, TRIAGE_PROMPT_NAME, "v3")] == [
            pinned.rollout_id
        ]
        assert get_prompt(store, TRIAGE_PROMPT_NAME).version == 1  # the pinned run activated nothing


def test_unknown_pinned_version_fails_the_rollout_with_a_clear_error(tmp_path: Path) -> None:
    with gateway_env(tmp_path, [" refund"]) as (store, gateway, upstream, _):
        publish_prompt(store, TRIAGE_PROMPT_NAME, "v1")
        with Runner(store, triage_agent, gateway.url, **FAST) as runner:
            (ro,) = enqueue_tasks(store, [_task()], resources={TRIAGE_PROMPT_NAME: "9"}, max_attempts=1)
            (done,) = runner.run_until_done([ro.rollout_id], timeout_s=30)
        assert done.state is RolloutState.failed
        assert (
            "NotFoundError" in done.error
            and "prompt 'prompt:triage' has no version 9 (versions: [1])" in done.error
        )
        assert upstream.requests == [] and store.final_reward(ro.rollout_id) is None


def test_racing_default_publishers_all_use_one_version() -> None:
    import threading

    from agentforge.prompts import get_prompt
    from agentforge.testing import memory_store

    store = memory_store()
    barrier, got = threading.Barrier(4), []

    def first_use() -> None:
        barrier.wait()
        got.append(get_prompt(store, "prompt:race", default="Reply.").version)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    active = get_prompt(store, "prompt:race")
    assert set(got) == {active.version} == {min(r.version for r in store.list_resources("prompt:race"))}
