"""Reward scorers with TRL's reward-function shape ``(completions, **kwargs) -> list[float | None]``.

Each scorer also has a plain per-rollout function. ``None`` means "cannot be scored" (masked and
counted by the trainer, never turned into 0 — see ``DESIGN.md``, fact 4).

* τ-bench: :func:`tau_reward` (database hash + required outputs), :func:`make_tau_reward_func`.
* LLM judge: :class:`GroupJudge` ranks a group of rollouts relative to each other with any
  OpenAI-compatible judge; :func:`make_group_judge_reward_func` ranks each GRPO group.
* Triage: :func:`intent_match`, :func:`entity_match`, :func:`triage_reward`,
  :func:`make_triage_reward_func` (Bitext, Banking77, CLINC150 with out-of-scope → ``"escalate"``).

Importing this package loads no data; the τ scorer loads the τ-retail environment on first use.
"""

from agentforge.rewards.completions import agent_texts, completion_text, message_text
from agentforge.rewards.judge import (
    DEFAULT_JUDGE_CRITERIA,
    GroupJudge,
    JudgeResult,
    make_group_judge_reward_func,
    parse_ranking,
    rank_rewards,
)
from agentforge.rewards.tau import (
    TauRewardResult,
    ToolDB,
    ToolEnv,
    gold_hash,
    gold_of,
    make_tau_reward_func,
    outputs_found,
    tau_reward,
    tau_reward_details,
    tau_reward_func,
)
from agentforge.rewards.triage import (
    ESCALATE,
    INTENT_ALIASES,
    TriagePrediction,
    entity_match,
    intent_match,
    intent_reward_func,
    make_triage_reward_func,
    normalize_entity,
    normalize_intent,
    parse_triage,
    triage_reward,
    triage_reward_func,
)

__all__ = [
    "DEFAULT_JUDGE_CRITERIA",
    "ESCALATE",
    "GroupJudge",
    "INTENT_ALIASES",
    "JudgeResult",
    "TauRewardResult",
    "ToolDB",
    "ToolEnv",
    "TriagePrediction",
    "agent_texts",
    "completion_text",
    "entity_match",
    "gold_hash",
    "gold_of",
    "intent_match",
    "intent_reward_func",
    "make_group_judge_reward_func",
    "make_tau_reward_func",
    "make_triage_reward_func",
    "message_text",
    "normalize_entity",
    "normalize_intent",
    "outputs_found",
    "parse_ranking",
    "rank_rewards",
    "parse_triage",
    "tau_reward",
    "tau_reward_details",
    "tau_reward_func",
    "triage_reward",
    "triage_reward_func",
]
