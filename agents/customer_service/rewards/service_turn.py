"""The reward of one service-desk turn: the right calls (or none), their arguments, a reply stating every fact.

The tool-turn reward (:mod:`.tool_turn`) for turns with zero, one or two gold calls
(:mod:`agentforge.agents.customer_service.service_desk`), in the same three verifiable parts:

* ``tool`` — 1.0 when the names of every call the turn made, as a multiset, equal the gold calls' names (no
  call at all when the gold is none: answering a policy question with a tool call is wrong), else 0.0;
* ``arguments`` — 1.0 when every gold call has a made call of its name whose arguments equal the gold ones after
  :func:`~.tool_turn.normalize_arguments`, and ``tool`` is 1.0; 1.0 for a turn with no gold call and no call;
* ``reply`` — τ-bench's "outputs" check (Yao et al. 2024, arXiv:2406.12045) on the turn's last assistant text:
  every gold fact appears (case-insensitively, commas ignored) and none of ``fact_alternatives``
  (:func:`~.tool_turn.reply_states`).

``reward`` is the weighted mean of the parts (``staged``: a part counts only when the parts before it are right)
and ``success`` is 1.0 only when all three are 1.0.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from agentforge.agents.customer_service.rewards.tool_turn import (
    ToolTurnScore,
    normalize_arguments,
    part_weights,
    reply_states,
)
from agentforge.errors import UserError
from agentforge.rewards.completions import message_text

__all__ = ["made_calls", "score_service_turn"]


def made_calls(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, Any]]:
    """``(name, arguments)`` of every tool call the assistant messages make, in order.

    Args:
        messages: OpenAI chat messages; ``function.arguments`` may be a string (the wire) or a dict.
    """
    calls = []
    for message in messages:
        if message.get("role", "assistant") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            calls.append((str(function.get("name") or ""), function.get("arguments")))
    return calls


def score_service_turn(
    messages: Sequence[Mapping[str, Any]],
    gold_calls: Sequence[Mapping[str, Any]],
    gold_facts: Sequence[str],
    fact_alternatives: Sequence[str] = (),
    weights: Sequence[float] = (1.0, 1.0, 1.0),
    staged: bool = False,
) -> ToolTurnScore:
    """Score one turn (definitions in the module docstring).

    Args:
        messages: the bot's messages of the turn (assistant calls, tool answers, the reply); user and system
            messages are skipped.
        gold_calls: ``[{"name", "arguments"}]``, zero or more.
        gold_facts: what the reply must state, at least one.
        fact_alternatives: statements that contradict a gold fact.
        weights: weights of ``tool``, ``arguments``, ``reply`` (normalised to sum 1).
        staged: ``w0·tool + w1·tool·arguments + w2·tool·arguments·reply``.

    Returns:
        A :class:`~.tool_turn.ToolTurnScore`.

    Raises:
        UserError: no gold fact, an empty one, a gold call without a name or with arguments that are not an
            object, or bad weights.
    """
    w = part_weights(weights)
    gold = [(str(c.get("name") or ""), normalize_arguments(c.get("arguments"))) for c in gold_calls]
    if not gold_facts or not all(gold_facts) or any(not name or args is None for name, args in gold):
        raise UserError(
            f"score_service_turn needs facts and named gold calls with object arguments; got {list(gold_calls)!r}, "
            f"{list(gold_facts)!r}"
        )
    made = made_calls(messages)
    tool = float(Counter(name for name, _ in made) == Counter(name for name, _ in gold))
    made_args = [(name, normalize_arguments(args)) for name, args in made]
    arguments = float(bool(tool) and all(call in made_args for call in gold))
    texts = [
        t
        for m in messages
        if m.get("role", "assistant") == "assistant"
        if (t := message_text(m.get("content")))
    ]
    last = texts[-1] if texts else None
    reply = float(all(reply_states(last, fact, fact_alternatives) for fact in gold_facts))
    if staged:
        reward = w[0] * tool + w[1] * tool * arguments + w[2] * tool * arguments * reply
    else:
        reward = w[0] * tool + w[1] * arguments + w[2] * reply
    return ToolTurnScore(tool, arguments, reply, reward, float(tool == arguments == reply == 1.0))
