"""Reward plumbing with TRL's reward-function shape ``(completions, **kwargs) -> list[float | None]``.

``None`` means "cannot be scored" (masked and counted by the trainer, never turned into 0 — see
``DESIGN.md``, fact 4). What lives here is domain-free:

* :data:`RewardFunc` and the completion readers :func:`completion_text`, :func:`agent_texts`,
  :func:`message_text` (:mod:`.completions`);
* the LLM judge: :class:`GroupJudge` ranks a group of rollouts relative to each other with any
  OpenAI-compatible judge; :func:`make_group_judge_reward_func` ranks each GRPO group;
  :func:`parse_ranking` / :func:`rank_rewards` read its answer (:mod:`.ranking`).

Domain scorers live next to their agent: the τ-bench and triage rewards are in
:mod:`agentforge.agents.customer_service.rewards`.
"""

from agentforge.rewards.completions import RewardFunc, agent_texts, completion_text, message_text
from agentforge.rewards.judge import (
    DEFAULT_JUDGE_CRITERIA,
    GroupJudge,
    JudgeResult,
    make_group_judge_reward_func,
)
from agentforge.rewards.ranking import parse_ranking, rank_rewards

__all__ = [
    "DEFAULT_JUDGE_CRITERIA",
    "GroupJudge",
    "JudgeResult",
    "RewardFunc",
    "agent_texts",
    "completion_text",
    "make_group_judge_reward_func",
    "message_text",
    "parse_ranking",
    "rank_rewards",
]
