"""Prompt versions through the promotion gate's canary and rollback, on the real runner and store.

The agent reads its prompt with ``ctx.prompt`` (as every agent does) and scores its own rollout from the text it
got, so the live reward of each prompt version is known; a feeder thread keeps unpinned live rollouts queued.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from agentforge.gate import CanaryRule, RollbackRule, list_decisions
from agentforge.prompts import (
    canary_prompt_version,
    end_prompt_canary,
    get_prompt,
    publish_prompt,
    start_prompt_canary,
)
from agentforge.runtime import Runner
from agentforge.testing import memory_store
from agentforge.trainers.prompt_promote import PromptPromoter
from agentforge.types import Rollout, RolloutState

NAME = "prompt:reply"
GOOD, BAD = "Reply politely.", "Reply rudely."


class Live:
    """A runner whose agent scores ``score(template)`` plus a feeder keeping ~4 unpinned rollouts queued."""

    def __init__(self, score: Callable[[str], float]) -> None:
        self.store = memory_store()
        publish_prompt(self.store, NAME, GOOD)  # v1, active
        publish_prompt(self.store, NAME, BAD, activate=False)  # v2, the candidate
        self.score = score
        self.runner = Runner(self.store, self._agent, "http://127.0.0.1:9/unused", workers=2, mode="thread")
        self._stop = threading.Event()
        self._feeder = threading.Thread(target=self._feed, daemon=True)

    def _agent(self, task, ctx) -> float:  # type: ignore[no-untyped-def]
        return self.score(ctx.prompt(NAME))

    def _feed(self) -> None:
        while not self._stop.is_set():
            if len(self.store.list_rollouts(state=RolloutState.queued)) < 4:
                self.store.enqueue_rollout(Rollout())
            self._stop.wait(0.02)

    def __enter__(self) -> Live:
        self.runner.start()
        self._feeder.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._feeder.join(10)
        self.runner.stop()
        self.store.close()


@pytest.fixture
def polite() -> Iterator[Live]:
    with Live(lambda template: float(template == GOOD)) as live:
        yield live


def test_canary_share_is_sticky_and_ends() -> None:
    store = memory_store()
    publish_prompt(store, NAME, GOOD)
    publish_prompt(store, NAME, BAD, activate=False)
    start_prompt_canary(store, NAME, 2, 0.5)
    ids = [f"ro-{i}" for i in range(400)]
    chosen = {i for i in ids if canary_prompt_version(store, NAME, i) == 2}
    assert 0.4 < len(chosen) / len(ids) < 0.6
    assert all(get_prompt(store, NAME, rollout_id=i).version == 2 for i in list(chosen)[:5])
    assert get_prompt(store, NAME, version=1, rollout_id=next(iter(chosen))).version == 1  # a pin wins
    end_prompt_canary(store, NAME)
    assert all(get_prompt(store, NAME, rollout_id=i).version == 1 for i in list(chosen)[:5])
    store.close()


def test_a_prompt_that_regresses_on_canary_traffic_is_refused(polite: Live) -> None:
    promoter = PromptPromoter(
        polite.store, NAME, canary=CanaryRule(share=0.5, rollouts=4, timeout_s=60), poll_s=0.1
    )
    assert promoter.promote(2, live=1) == 1
    assert get_prompt(polite.store, NAME).version == 1
    (canary,) = list_decisions(polite.store, NAME)
    assert (canary.stage, canary.outcome, canary.candidate, canary.live) == (
        "canary",
        "refused",
        "prompt:reply@v2",
        "prompt:reply@v1",
    )
    assert canary.evidence["version_n"] == 4 and canary.evidence["version_mean"] == 0.0
    assert canary.evidence["reference_n"] >= 4 and canary.evidence["reference_mean"] == 1.0


def test_an_activated_prompt_whose_live_reward_drops_is_rolled_back() -> None:
    promoter: PromptPromoter | None = None

    def score(template: str) -> float:
        """Both prompts please until v2 is activated; then v2's reward drops."""
        promoted = promoter is not None and any(d.stage == "promote" for d in promoter.decisions)
        return float(template == GOOD or not promoted)

    with Live(score) as live:
        promoter = PromptPromoter(
            live.store,
            NAME,
            canary=CanaryRule(share=0.5, rollouts=4, timeout_s=60),
            rollback=RollbackRule(window=4, margin=0.2, timeout_s=60),
            poll_s=0.1,
        )
        assert promoter.promote(2, live=1) == 2
        assert promoter.wait_watch(90)
        assert get_prompt(live.store, NAME).version == 1
        outcomes = [(d.stage, d.outcome) for d in list_decisions(live.store, NAME)]
        assert outcomes == [("canary", "passed"), ("promote", "promoted"), ("watch", "rolled_back")]
        watch = list_decisions(live.store, NAME)[-1].evidence
        assert watch["version_n"] == 4 and watch["version_mean"] == 0.0 and watch["reference_mean"] == 1.0
