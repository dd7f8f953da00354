"""Contract from public bug reports (issue 36, "Incomplete GRPO groups"): a real TRL step on the tiny model over
two groups of 4 that the live :class:`~agentforge.trainers.rollouts.RolloutSource` formed from finished rollouts —

* group ``t1``: rewards 1 and 0, one failed member, one masked-but-rewarded member (stale: served by a version
  3 behind, reward 1);
* group ``t2``: one usable member (reward 1) and 3 unusable (failed, no reward, stale).

The group statistics exclude every masked member (keep vs exclude, ``trainers/rollouts.py``): ``t1``'s baseline is
the mean of 1 and 0 and its spread their standard deviation, so its usable members get advantages ±0.707 and its
masked ones 0 — a masked member counted as reward 0, or its stored reward counted, would move both; ``t2`` has no
baseline (one usable member) and every advantage 0. The batch report counts each reason once per member.
With ``negative_advantage_scale`` 0.25 the loss sees ``t1``'s negative member at a quarter of its advantage and
the positive one unchanged (``trainers/lightning_grpo.AdvantageShaping``). With ``success_bonus`` 0.5
every usable member rewarded 1 gets 0.5 added — ``t2``'s lone success too, which GRPO gives no advantage — and
no masked member does; the share of groups with signal is GRPO's (0.5).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from stored_groups import tiny_train_config, train_on_finished_groups
from tiny_model import PROMPT

from agentforge.testing import memory_store
from agentforge.types import AttemptState, LLMCall, Reward, Span, SpanKind

CURRENT = "policy@v3"
#: per group: (reward, version that served it, attempt succeeded); ``None`` = no reward stored
MEMBERS: dict[str, list[tuple[float | None, str, bool]]] = {
    "t1": [(1.0, CURRENT, True), (0.0, CURRENT, True), (1.0, CURRENT, False), (1.0, "policy@v0", True)],
    "t2": [(1.0, CURRENT, True), (1.0, CURRENT, False), (None, CURRENT, True), (1.0, "policy@v0", True)],
}


def _finish(store: Any, rollout: Any, reward: float | None, version: str, ok: bool) -> None:
    claimed, attempt = store.claim_rollout("w")
    assert claimed.rollout_id == rollout.rollout_id
    completion = [57, 1431, 2]
    call = LLMCall(
        prompt_token_ids=PROMPT,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
        finish_reason="stop",
        version=version,
    )
    store.add_span(
        Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, kind=SpanKind.llm, llm=call)
    )
    if reward is not None:
        store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.finish_attempt(attempt.attempt_id, AttemptState.succeeded if ok else AttemptState.failed)


@pytest.mark.slow
@pytest.mark.parametrize(("negative_scale", "bonus"), [(1.0, 0.0), (0.25, 0.0), (1.0, 0.5)])
def test_masked_members_are_left_out_of_their_groups_baseline_and_spread(
    tmp_path: Path, negative_scale: float, bonus: float
) -> None:
    import torch

    store = memory_store()
    trainer, source, formed, out = train_on_finished_groups(
        store,
        MEMBERS,
        lambda rollout, member: _finish(store, rollout, *member),
        tmp_path / "run",
        current=CURRENT,
        negative_advantage_scale=negative_scale,
        success_bonus=bonus,
    )
    order = [r.task.task_id for r in formed]  # TRL's batch: each group's 4 members in a row, t1 then t2
    got = {t: [] for t in MEMBERS}
    for task, advantage in zip(order, out["advantages"].tolist(), strict=True):
        got[task].append(advantage)
    a = 0.5 / (torch.tensor([1.0, 0.0]).std().item() + 1e-4)  # TRL: (r - mean) / (std + 1e-4), std unbiased
    assert got["t1"] == pytest.approx([a + bonus, -a * negative_scale, 0.0, 0.0], abs=1e-5)
    assert got["t2"] == pytest.approx([bonus, 0.0, 0.0, 0.0], abs=1e-6)
    (report,) = source.reports
    assert dict(report.skipped) == {"failed": 2, "stale": 2, "missing_reward": 1}
    assert sorted(report.rewards) == [0.0, 1.0, 1.0]  # the usable members' rewards only
    assert report.zero_variance_groups == 0  # t2 has one reward, not a flat group
    (row,) = [r for r in trainer.history if "batch/signal_group_share" in r]
    assert row["batch/signal_group_share"] == 0.5 and row["batch/skipped_stale"] == 2.0


@pytest.mark.parametrize("key", ["negative_advantage_scale", "success_bonus"])
@pytest.mark.parametrize("scale", [-0.5, float("nan")])
def test_a_negative_or_nan_scale_is_a_clear_error(tmp_path: Path, key: str, scale: float) -> None:
    from agentforge.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"{key}=.* \(must be >= 0\)"):
        tiny_train_config(tmp_path / "run", **{key: scale})
