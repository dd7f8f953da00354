"""What an imported trace line may hold: a trace file is data from elsewhere, never trusted as work or weights.

:func:`~agentforge.trainers.replay.jsonl.import_jsonl` runs these checks on every line after it parsed, and
a line that fails one is skipped with its line number (or, with ``on_error="raise"``, refuses the file):

* **Consistent records** (``"inconsistent record"``, :func:`inconsistency`): unique ids, every record of
  the line's rollout, references to known attempts and spans, scalar text the store can hold.
* **Finished data only** (reason ``"unfinished rollout"``): the rollout must be ``succeeded``, ``failed``,
  ``timed_out`` or ``cancelled`` and no attempt may be ``running``, so nothing imported is ever queued for a
  runner, claimed, or requeued by a stale heartbeat (a crafted ``queued`` line would run its task input).
* **Token ids the model has** (``"bad token ids"``): every prompt and completion id is a non-negative
  integer below ``vocab_size`` (when known); logprobs are ``<= 0`` or ``-inf``, never ``NaN`` or positive.
* **Rewards that are numbers** (``"bad reward"``): a reward is ``None`` (stored invalid) or finite with
  ``|value| <= max_abs_reward``; ``Infinity`` or ``1e308`` would dominate every advantage of its group.
* **Bounded nesting** (``"too deeply nested"``): JSON nested deeper than :data:`MAX_DEPTH` levels is
  refused before validation, so one hostile line is a line error, never a ``RecursionError`` that aborts
  the import.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from agentforge.errors import UserError
from agentforge.types import AttemptState, RolloutState

if TYPE_CHECKING:
    from agentforge.types import Attempt, Reward, Rollout, Span

__all__ = ["MAX_DEPTH", "DEFAULT_MAX_ABS_REWARD", "depth_exceeds", "inconsistency", "untrusted_content"]

#: Deepest JSON nesting a trace line may have (a real line nests about 10 levels: line → spans → llm →
#: request → messages → content parts → ...; tool schemas add a few).
MAX_DEPTH = 100
#: Default bound on ``|reward|`` for imported rewards.
DEFAULT_MAX_ABS_REWARD = 1e6


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` (decoded JSON) nests lists/dicts deeper than ``limit`` levels (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def inconsistency(
    rollout: Rollout, attempts: list[Attempt], spans: list[Span], rewards: list[Reward]
) -> str | None:
    """What makes a line's records disagree with each other or with the store's text policy.

    Returns:
        ``"rollout '<id>': <first problem> (+N more)"``, or ``None`` when the records are consistent: unique
        ids, every record naming the line's rollout, known attempts and spans, storable scalar text.
    """
    rid = rollout.rollout_id
    attempt_ids = {a.attempt_id for a in attempts}
    span_ids = {s.span_id for s in spans}
    problems = []
    if len(attempt_ids) < len(attempts) or len(span_ids) < len(spans):
        problems.append("duplicate attempt or span id")
    if len({r.reward_id for r in rewards}) < len(rewards):
        problems.append("duplicate reward id")
    problems += [
        f"attempt {a.attempt_id} names rollout {a.rollout_id!r}" for a in attempts if a.rollout_id != rid
    ]
    problems += [f"span {s.span_id} names rollout {s.rollout_id!r}" for s in spans if s.rollout_id != rid]
    problems += [
        f"reward {r.reward_id} names rollout {r.rollout_id!r}" for r in rewards if r.rollout_id != rid
    ]
    for obj in [*spans, *rewards]:
        if obj.attempt_id is not None and obj.attempt_id not in attempt_ids:
            problems.append(f"{type(obj).__name__.lower()} names unknown attempt {obj.attempt_id!r}")
    problems += [
        f"reward {r.reward_id} follows unknown span {r.span_id!r}"
        for r in rewards
        if r.span_id and r.span_id not in span_ids
    ]
    if not problems:
        try:  # the store's text policy for scalar columns (ids, names, errors)
            from agentforge.stores.tables import attempt_to_row, reward_to_row, rollout_to_row, span_to_row

            rollout_to_row(rollout)
            for a in attempts:
                attempt_to_row(a)
            for s in spans:
                span_to_row(s, 0)
            for r in rewards:
                reward_to_row(r, 0)
        except UserError as exc:
            problems.append(str(exc))
    if not problems:
        return None
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"rollout {rid!r}: {problems[0]}{more}"


def _token_problem(span: Span, vocab_size: int | None) -> str | None:
    call = span.llm
    if call is None:
        return None
    for name in ("prompt_token_ids", "completion_token_ids"):
        ids = getattr(call, name) or []
        bad = [t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            bound = f"[0, {vocab_size})" if vocab_size is not None else "non-negative"
            return f"span {span.span_id}: {len(bad)} {name} outside {bound}, e.g. {bad[0]}"
    bad_lp = [lp for lp in call.logprobs or [] if math.isnan(lp) or lp > 0]
    if bad_lp:
        return f"span {span.span_id}: {len(bad_lp)} logprobs NaN or above 0, e.g. {bad_lp[0]}"
    return None


def untrusted_content(
    rollout: Rollout,
    attempts: list[Attempt],
    spans: list[Span],
    rewards: list[Reward],
    *,
    vocab_size: int | None,
    max_abs_reward: float,
) -> tuple[str, str] | None:
    """The first rule of the module docstring that a parsed line breaks.

    Args:
        rollout, attempts, spans, rewards: the line's records (already valid models).
        vocab_size: token ids must be below it; ``None`` checks only that they are non-negative.
        max_abs_reward: the largest ``|reward|`` accepted.

    Returns:
        ``(reason, detail)`` for the first problem found, or ``None`` when the line may be imported.
    """
    state = RolloutState(rollout.state)
    if not state.finished:
        return "unfinished rollout", (
            f"rollout {rollout.rollout_id!r} is {state.value}; only finished rollouts are imported (as data, "
            "never as work for runners)"
        )
    running = [a.attempt_id for a in attempts if AttemptState(a.state) is AttemptState.running]
    if running:
        return "unfinished rollout", f"attempt {running[0]!r} is still running in a {state.value} rollout"
    for span in spans:
        problem = _token_problem(span, vocab_size)
        if problem is not None:
            return "bad token ids", problem
    for reward in rewards:
        value = reward.value
        if value is not None and (not math.isfinite(value) or abs(value) > max_abs_reward):
            return "bad reward", (
                f"reward {reward.reward_id} is {value!r}; rewards must be finite with |value| <= {max_abs_reward:g}"
            )
    return None
