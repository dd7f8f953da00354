"""Customer-service reward scorers, next to the agents they score, with TRL's reward-function shape
``(completions, **kwargs) -> list[float | None]`` (:data:`agentforge.rewards.RewardFunc`).

Each scorer also has a plain per-rollout function. ``None`` means "cannot be scored" (masked and counted by
the trainer, never turned into 0 — see ``DESIGN.md``, fact 4).

* τ-bench (:mod:`.tau`): :func:`tau_reward` (database hash + required outputs), :func:`make_tau_reward_func`.
* Tool turns (:mod:`.tool_turn`): :func:`score_tool_turn` (right tool, right arguments, reply states the
  tool's fact; reported per part), :func:`make_tool_turn_reward_func`.
* Triage (:mod:`.triage`): :func:`intent_match`, :func:`entity_match`, :func:`triage_reward`,
  :func:`make_triage_reward_func` (Bitext, Banking77, CLINC150 with out-of-scope → ``"escalate"``).

Importing this package loads no data; the τ scorer loads the τ-retail environment on first use.
"""

from agentforge.agents.customer_service.rewards.tau import (
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
from agentforge.agents.customer_service.rewards.tool_turn import (
    PARTS,
    ToolTurnScore,
    make_tool_turn_reward_func,
    score_tool_turn,
)
from agentforge.agents.customer_service.rewards.triage import (
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
    "ESCALATE",
    "PARTS",
    "INTENT_ALIASES",
    "TauRewardResult",
    "ToolTurnScore",
    "ToolDB",
    "ToolEnv",
    "TriagePrediction",
    "entity_match",
    "gold_hash",
    "gold_of",
    "intent_match",
    "intent_reward_func",
    "make_tau_reward_func",
    "make_tool_turn_reward_func",
    "make_triage_reward_func",
    "normalize_entity",
    "normalize_intent",
    "outputs_found",
    "parse_triage",
    "tau_reward",
    "tau_reward_details",
    "tau_reward_func",
    "score_tool_turn",
    "triage_reward",
    "triage_reward_func",
]
