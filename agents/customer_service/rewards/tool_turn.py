"""The reward of one tool-using bot turn, in three verifiable parts: right tool, right arguments, right reply.

For a turn *customer message → tool call → tool answer → reply* with a gold tool, gold arguments and a gold fact
(e.g. the order-desk tasks, :mod:`agentforge.agents.customer_service.order_desk`):

* ``tool`` — 1.0 when the turn's **first** tool call names the gold tool exactly (no normalisation), else 0.0
  (also when the turn made no call);
* ``arguments`` — 1.0 when that call's arguments equal the gold arguments after :func:`normalize_arguments`
  (same keys, exactly; string values compared after
  :func:`~agentforge.agents.customer_service.rewards.triage.normalize_entity`: surrounding spaces and quotes,
  a leading ``#`` and trailing ``.!;,`` dropped, upper-cased; ``"w5442520"`` equals ``"#W5442520"``), else 0.0
  (also for arguments that are not a JSON object);
* ``reply`` — τ-bench's "outputs" check (Yao et al. 2024, arXiv:2406.12045) on the turn's **last** assistant
  text: 1.0 when it contains the gold fact, case-insensitively and ignoring commas; stricter than τ-bench, it is
  0.0 when the reply also states one of ``fact_alternatives`` (e.g. the other order statuses), so listing every
  possible answer does not pay.

``reward`` is the weighted mean of the parts (weights 1/3 each by default, in [0, 1]; ``staged=True``: a part
counts only when the parts before it are right), and ``success`` is 1.0
only when all three parts are 1.0 (the job's task-success measure). Rewards follow TRL's reward-function shape
(:data:`agentforge.rewards.RewardFunc`); an agent reports the parts with its reward by returning
``{"reward": ..., **score.parts()}`` (stored as ``Reward.metadata["parts"]`` by the runner).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentforge.agents.customer_service.rewards.triage import normalize_entity
from agentforge.errors import UserError
from agentforge.rewards.completions import RewardFunc, message_text

__all__ = [
    "PARTS",
    "ToolTurnScore",
    "first_tool_call",
    "normalize_arguments",
    "reply_states",
    "score_tool_turn",
    "make_tool_turn_reward_func",
    "part_weights",
]

#: The reward parts, in report order.
PARTS: tuple[str, ...] = ("tool", "arguments", "reply")


@dataclass(frozen=True)
class ToolTurnScore:
    """The parts of one turn's reward (each 0.0 or 1.0), their weighted mean and the all-parts success."""

    tool: float
    arguments: float
    reply: float
    reward: float
    success: float

    def parts(self) -> dict[str, float]:
        """``{"tool", "arguments", "reply", "success"}`` (the extras an agent returns next to ``reward``)."""
        return {"tool": self.tool, "arguments": self.arguments, "reply": self.reply, "success": self.success}


def _value(value: Any) -> Any:
    if isinstance(value, str):
        return normalize_entity(value)
    if isinstance(value, bool | int | float) or value is None:
        return value
    return json.dumps(value, sort_keys=True)


def normalize_arguments(arguments: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """Canonical form of tool-call arguments for the exact ``arguments`` comparison.

    Args:
        arguments: a dict, or the JSON string the engine emitted.

    Returns:
        ``{key: canonical value}`` (keys as written; strings by ``normalize_entity``, lists and objects as
        sorted-key JSON), or ``None`` when the arguments are not a JSON object.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, Mapping):
        return None
    return {str(k): _value(v) for k, v in arguments.items()}


def first_tool_call(messages: Sequence[Mapping[str, Any]]) -> tuple[str, Any] | None:
    """``(name, arguments)`` of the first tool call any assistant message makes, or ``None``.

    Args:
        messages: OpenAI chat messages; a tool call's ``function.arguments`` may be a string (the wire) or a
            dict (TRL's parsed form).
    """
    for message in messages:
        if message.get("role", "assistant") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            return str(function.get("name") or ""), function.get("arguments")
    return None


def reply_states(text: str | None, fact: str, alternatives: Sequence[str] = ()) -> bool:
    """Whether ``text`` states ``fact`` and none of ``alternatives`` (case-insensitive, commas ignored).

    Args:
        text: the reply.
        fact: the gold fact, e.g. ``"delivered"``.
        alternatives: facts that contradict it (the gold fact itself is ignored among them).
    """
    if not text:
        return False
    said = text.lower().replace(",", "")

    def states(value: str) -> bool:
        return value.lower().replace(",", "") in said

    return states(fact) and not any(states(a) for a in alternatives if a.lower() != fact.lower())


def part_weights(weights: Sequence[float]) -> tuple[float, float, float]:
    """The ``tool``, ``arguments`` and ``reply`` weights normalised to sum 1.

    Raises:
        UserError: not 3 numbers in [0, 1] with a positive sum.
    """
    if len(weights) != 3 or any(not 0.0 <= w <= 1.0 for w in weights) or sum(weights) <= 0:
        raise UserError(
            f"tool-turn weights must be 3 numbers in [0, 1] with a positive sum, got {list(weights)}"
        )
    total = sum(weights)
    return weights[0] / total, weights[1] / total, weights[2] / total


def score_tool_turn(
    messages: Sequence[Mapping[str, Any]],
    gold_tool: str,
    gold_arguments: Mapping[str, Any],
    gold_fact: str,
    fact_alternatives: Sequence[str] = (),
    weights: Sequence[float] = (1.0, 1.0, 1.0),
    staged: bool = False,
) -> ToolTurnScore:
    """Score one turn (definitions in the module docstring).

    Args:
        messages: the bot's messages of the turn (assistant tool call, tool answer, assistant reply); user and
            system messages are skipped.
        gold_tool: the tool the turn must call.
        gold_arguments: its arguments.
        gold_fact: what the reply must state.
        fact_alternatives: statements that contradict ``gold_fact``.
        weights: weights of ``tool``, ``arguments``, ``reply`` (normalised to sum 1).
        staged: a part adds to ``reward`` only when every part before it is right (tool → arguments → reply:
            ``w0·tool + w1·tool·arguments + w2·tool·arguments·reply``). With independent parts a turn that
            calls the wrong tool but repeats the status that tool returned scores 2/3, as much as the right
            tool with a wrong reply; measured on the order desk at T=1, the base policy's favourite wrong
            tool on ``change_order`` messages scored 0.42 on average against 0.60 for the right one, a weak
            preference for GRPO's group-relative advantage. Staged, the wrong tool scores 0. The parts
            themselves (and ``success``) are the same either way.

    Returns:
        The :class:`ToolTurnScore`.

    Raises:
        UserError: an empty gold tool or fact, gold arguments that are not an object, or bad weights.
    """
    w = part_weights(weights)
    gold_args = normalize_arguments(gold_arguments)
    if not gold_tool or not gold_fact or gold_args is None:
        raise UserError(
            f"score_tool_turn needs a gold tool, a gold fact and gold arguments as an object; got "
            f"{gold_tool!r}, {gold_fact!r}, {gold_arguments!r}"
        )
    call = first_tool_call(messages)
    tool = float(call is not None and call[0] == gold_tool)
    arguments = float(call is not None and normalize_arguments(call[1]) == gold_args)
    texts = [
        t
        for m in messages
        if m.get("role", "assistant") == "assistant"
        if (t := message_text(m.get("content")))
    ]
    reply = float(reply_states(texts[-1] if texts else None, gold_fact, fact_alternatives))
    if staged:
        reward = w[0] * tool + w[1] * tool * arguments + w[2] * tool * arguments * reply
    else:
        reward = w[0] * tool + w[1] * arguments + w[2] * reply
    return ToolTurnScore(tool, arguments, reply, reward, float(tool == arguments == reply == 1.0))


def _column(kwargs: Mapping[str, Any], name: str, n: int, default: Any = ...) -> list[Any]:
    values = kwargs.get(name)
    if values is None and default is not ...:
        return [default] * n
    if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
        raise UserError(f"reward kwarg {name!r} must be a list with one gold value per completion ({n})")
    return list(values)


def make_tool_turn_reward_func(
    part: str | None = None, weights: Sequence[float] = (1.0, 1.0, 1.0)
) -> RewardFunc:
    """A TRL reward function for tool turns: the weighted reward, or one part of it.

    The returned ``f(completions, **kwargs) -> list[float | None]`` reads dataset columns ``gold_tool``,
    ``gold_arguments``, ``gold_fact`` and optionally ``fact_alternatives`` (one entry per completion); each
    completion is the turn's list of messages. Entry *i* is ``None`` (masked, never 0) when the completion is
    not a list of messages or its row has no gold tool. Passing
    ``reward_funcs=[make_tool_turn_reward_func(p) for p in PARTS]`` makes TRL log each part as its own reward
    (``rewards/tool_turn_tool/mean``, ...), with ``reward_weights`` as the weights.

    Args:
        part: ``None`` for the weighted reward, else one of :data:`PARTS` or ``"success"``.
        weights: part weights for the weighted reward (see :func:`score_tool_turn`).

    Returns:
        The function, named ``tool_turn_reward`` or ``tool_turn_<part>``.

    Raises:
        UserError: an unknown ``part`` or bad weights; (when called) a gold column missing or of the wrong length.
    """
    if part is not None and part not in (*PARTS, "success"):
        raise UserError(f"unknown tool-turn reward part {part!r}; choose one of {', '.join(PARTS)}, success")
    part_weights(weights)

    def reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        tools, args = _column(kwargs, "gold_tool", n), _column(kwargs, "gold_arguments", n)
        facts, others = _column(kwargs, "gold_fact", n), _column(kwargs, "fact_alternatives", n, ())
        out: list[float | None] = []
        for completion, tool, arguments, fact, alternatives in zip(
            completions, tools, args, facts, others, strict=True
        ):
            if not tool or isinstance(completion, str) or not isinstance(completion, Sequence):
                out.append(None)
                continue
            messages = [m for m in completion if isinstance(m, Mapping)]
            score = score_tool_turn(messages, tool, arguments, fact, alternatives or (), weights)
            out.append(score.reward if part is None else getattr(score, part))
        return out

    reward.__name__ = reward.__qualname__ = "tool_turn_reward" if part is None else f"tool_turn_{part}"
    return reward
