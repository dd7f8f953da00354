"""Credit by reward part and by span (``TrainConfig.part_credit``, ``trainers/part_credit.py``; issue 35).

A real TRL step on the tiny model over two groups of 4 that the live
:class:`~agentforge.trainers.rollouts.RolloutSource` formed from finished rollouts, each a tool call (span 1,
3 tokens) continued by a reply (span 2: 2 environment tokens, then 2 sampled), rewarded with the service desk's
parts ``tool``, ``arguments``, ``reply``:

* group ``t1``: every call right, replies 1, 0, 1, 0 — the call tokens get advantage 0 (their role reward is
  equal across the group), the reply tokens ±0.866; GRPO would give the calls of the worse replies a negative
  advantage;
* group ``t2``: calls 1, 0, 1, 0 and replies the same — both roles ±0.866.

Without ``part_credit`` the loss sees TRL's per-row advantages, as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from stored_groups import tiny_train_config, train_on_finished_groups
from tiny_model import PROMPT

from agentforge.errors import ConfigError
from agentforge.testing import memory_store
from agentforge.trainers.part_credit import CALL, REPLY, WHOLE, part_advantages
from agentforge.trainers.samples import build_trajectories
from agentforge.types import AttemptState, LLMCall, Reward, Span, SpanKind, ToolCall

CALL_IDS, GAP, REPLY_IDS = [57, 1431, 2], [198, 520], [40, 2]
#: per group: (tool, arguments, reply) parts of each member
PARTS = {
    "t1": [(1.0, 1.0, 1.0), (1.0, 1.0, 0.0), (1.0, 1.0, 1.0), (1.0, 1.0, 0.0)],
    "t2": [(1.0, 1.0, 1.0), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.0, 0.0, 0.0)],
}


def _spans(rollout_id: str, attempt_id: str) -> list[Span]:
    call = LLMCall(
        prompt_token_ids=PROMPT,
        completion_token_ids=CALL_IDS,
        logprobs=[-1.0] * 3,
        finish_reason="tool_calls",
        tool_calls=[ToolCall(id="c1", name="get_order_status", arguments='{"order_id": "#W1"}')],
        version="policy@v1",
    )
    reply = LLMCall(
        prompt_token_ids=PROMPT + CALL_IDS + GAP,
        completion_token_ids=REPLY_IDS,
        logprobs=[-1.0] * 2,
        finish_reason="stop",
        version="policy@v1",
    )
    return [
        Span(rollout_id=rollout_id, attempt_id=attempt_id, kind=SpanKind.llm, llm=llm, sequence=i)
        for i, llm in enumerate((call, reply))
    ]


def test_a_call_continued_by_a_reply_is_one_trajectory_with_its_tokens_roles() -> None:
    (traj,) = build_trajectories(_spans("ro-1", "at-1"))
    assert traj.completion_ids == CALL_IDS + GAP + REPLY_IDS
    assert traj.roles == [CALL] * 3 + [WHOLE] * 2 + [REPLY] * 2
    first_only = build_trajectories(
        _spans("ro-1", "at-1")[1:]
    )  # a first span without a call: the whole reward
    assert first_only[0].roles == [WHOLE] * 2


def test_part_advantages_fall_back_to_the_whole_reward_where_a_role_reward_is_missing() -> None:
    import torch

    nan = float("nan")
    whole = torch.tensor([0.5, -0.5])
    role_rewards = torch.tensor([[1.0, nan], [0.0, nan]])  # one group of 2: calls differ, no reply part
    got = part_advantages(
        whole, role_rewards, [[CALL, REPLY, WHOLE], [REPLY]], group_size=2, first_row=0, width=3
    )
    a = 0.5 / (torch.tensor([1.0, 0.0]).std().item() + 1e-4)
    assert got.flatten().tolist() == pytest.approx([a, 0.5, 0.5, -0.5, -0.5, -0.5], abs=1e-5)
    centred = part_advantages(
        whole, role_rewards, [[CALL], [CALL]], group_size=2, first_row=0, width=1, scale_rewards="none"
    )
    assert centred.flatten().tolist() == pytest.approx([0.5, -0.5])


def _finish(store: Any, rollout: Any, parts: tuple[float, float, float]) -> None:
    claimed, attempt = store.claim_rollout("w")
    assert claimed.rollout_id == rollout.rollout_id
    for span in _spans(rollout.rollout_id, attempt.attempt_id):
        store.add_span(span)
    tool, arguments, reply = parts
    value = (tool + arguments + reply) / 3
    metadata = {"parts": {"tool": tool, "arguments": arguments, "reply": reply, "success": float(value == 1)}}
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=value, final=True, metadata=metadata))
    store.finish_attempt(attempt.attempt_id, AttemptState.succeeded)


@pytest.mark.slow
@pytest.mark.parametrize("part_credit", [True, False])
def test_call_tokens_get_the_call_parts_advantage_and_reply_tokens_the_replys(
    tmp_path: Path, part_credit: bool
) -> None:
    import torch

    store = memory_store()
    trainer, _, _, out = train_on_finished_groups(
        store,
        PARTS,
        lambda rollout, parts: _finish(store, rollout, parts),
        tmp_path / "run",
        part_credit=part_credit,
    )
    a = 0.5 / (torch.tensor([1.0, 0.0, 1.0, 0.0]).std().item() + 1e-4)  # TRL's (r - mean) / (std + 1e-4)
    signs = [1.0, -1.0, 1.0, -1.0]
    advantages = out["advantages"]
    if not part_credit:
        assert advantages.dim() == 1
        whole = torch.tensor([sum(p) / 3 for t in PARTS for p in PARTS[t]]).view(2, 4)
        expected = (whole - whole.mean(dim=1, keepdim=True)) / (whole.std(dim=1, keepdim=True) + 1e-4)
        assert advantages.tolist() == pytest.approx(expected.flatten().tolist(), abs=1e-5)
        return
    assert advantages.shape == out["completion_ids"].shape  # (B, T): one advantage per token
    rows = advantages.tolist()
    for row, sign in zip(rows[:4], signs, strict=True):  # t1: every call right, replies differ
        assert row[:3] == pytest.approx([0.0] * 3, abs=1e-6)  # the call: nothing to credit
        assert row[5:7] == pytest.approx([sign * a] * 2, abs=1e-4)  # the reply: its own part
    for row, sign in zip(rows[4:], signs, strict=True):  # t2: calls and replies differ together
        assert row[:3] == pytest.approx([sign * a] * 3, abs=1e-4)
        assert row[5:7] == pytest.approx([sign * a] * 2, abs=1e-4)
    logged = [r for r in trainer.history if "rewards/part_call/mean" in r]
    assert logged and logged[0]["rewards/part_call/mean"] == pytest.approx(0.75)


def test_part_credit_names_bad_parts_and_refuses_other_reward_weights(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"call_parts='tool\+\+arguments'"):
        tiny_train_config(tmp_path / "run", part_credit=True, call_parts="tool++arguments")
    with pytest.raises(ConfigError, match=r"reward_weights=\[1.0, 1.0, 1.0\]"):
        tiny_train_config(tmp_path / "run", part_credit=True, reward_weights=[1.0, 1.0, 1.0])
