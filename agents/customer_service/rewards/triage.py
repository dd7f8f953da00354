"""Triage rewards: exact match of the predicted intent (and order id) against labelled data.

Used with Bitext (27 intents + order-id spans), Banking77 (77 intents) and CLINC150 (150 intents, with
out-of-scope mapped to ``"escalate"``). Labels are compared after :func:`normalize_intent`; order ids
after :func:`normalize_entity`.

Completion format (what :func:`parse_triage` reads, first match wins):

1. a JSON object with an ``"intent"`` key (and optionally ``"order_id"`` or ``"entity"``);
2. lines ``intent: <label>`` and ``order_id: <id or none>`` (the triage graph's format);
3. a bare label: the whole completion is one line of at most 64 characters without spaces inside words,
   e.g. ``cancel_order``.

Anything else is *unparseable*: the TRL reward functions return ``None`` for it by default (masked and
counted by the trainer, never turned into 0), or a fixed value given as ``unparseable=`` (e.g. 0.0 to
teach the format).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentforge.errors import UserError
from agentforge.rewards.completions import RewardFunc, completion_text

__all__ = [
    "ESCALATE",
    "INTENT_ALIASES",
    "TriagePrediction",
    "normalize_intent",
    "normalize_entity",
    "intent_match",
    "entity_match",
    "triage_reward",
    "parse_triage",
    "make_triage_reward_func",
    "intent_reward_func",
    "triage_reward_func",
]

#: The label for "hand the customer over to a human".
ESCALATE = "escalate"
#: Labels that mean the same as another (after normalisation): CLINC150's out-of-scope is escalation.
INTENT_ALIASES: dict[str, str] = {"oos": ESCALATE, "out_of_scope": ESCALATE, "outofscope": ESCALATE}
_NONE_WORDS = frozenset({"", "none", "null", "n/a", "na", "no", "-"})
_SEPARATORS = re.compile(r"[\s_\-]+")
_INTENT_LINE = re.compile(r"^\W*intent\W*[:=]\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_ORDER_LINE = re.compile(r"^\W*(?:order[\s_-]?id|entity)\W*[:=]\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)
_BARE_LABEL = re.compile(r"^[\w\-]+$")


@dataclass(frozen=True)
class TriagePrediction:
    """A parsed triage answer: normalised intent and order id (``None`` when the answer gave none)."""

    intent: str
    order_id: str | None = None


def normalize_intent(label: str) -> str:
    """Canonical form of an intent label: lower case, runs of spaces/``_``/``-`` become one ``_``.

    Surrounding quotes, backticks and trailing punctuation are dropped, and aliases are resolved
    (``oos``/``out of scope`` → ``escalate``).

    Args:
        label: e.g. ``" Cancel Order."``.

    Returns:
        e.g. ``"cancel_order"``.
    """
    text = label.strip().strip("\"'`*").strip().rstrip(".!;,").strip()
    text = _SEPARATORS.sub("_", text.lower()).strip("_")
    return INTENT_ALIASES.get(text, text)


def normalize_entity(value: Any) -> str | None:
    """Canonical form of an order id: stripped of spaces, quotes, a leading ``#`` and trailing punctuation.

    Case-insensitive (upper-cased); digits are kept as written (leading zeros matter: ``00123842`` is
    not ``123842``). ``None`` and words like ``none``/``null``/``n/a`` mean "no order id".

    Args:
        value: a string, a number, or ``None``.

    Returns:
        The canonical id, or ``None``.
    """
    if value is None:
        return None
    text = str(value).strip().strip("\"'`").strip().rstrip(".!;,").lstrip("#").strip()
    return None if text.lower() in _NONE_WORDS else text.upper()


def intent_match(pred: str | None, gold: str) -> float:
    """1.0 if the normalised intents are equal, else 0.0 (a missing prediction is wrong).

    Args:
        pred: the predicted label, or ``None``.
        gold: the gold label.

    Returns:
        1.0 or 0.0.

    Raises:
        UserError: ``gold`` is not a non-empty string.
    """
    if not isinstance(gold, str) or not gold.strip():
        raise UserError(f"intent_match needs a gold label, got {gold!r}")
    return float(pred is not None and normalize_intent(pred) == normalize_intent(gold))


def entity_match(pred: Any, gold: Any) -> float:
    """1.0 if the normalised order ids are equal (both absent counts as equal), else 0.0.

    Args:
        pred: the predicted order id or ``None``.
        gold: the gold order id or ``None`` (the message names no order).

    Returns:
        1.0 or 0.0.
    """
    return float(normalize_entity(pred) == normalize_entity(gold))


def triage_reward(
    pred_intent: str | None,
    pred_order_id: Any,
    gold_intent: str,
    gold_order_id: Any,
    intent_weight: float = 0.5,
) -> float:
    """Weighted exact match: ``intent_weight · intent + (1 − intent_weight) · order id``.

    With the default 0.5: 1.0 both right, 0.5 one right, 0.0 both wrong.

    Args:
        pred_intent: predicted label or ``None``.
        pred_order_id: predicted order id or ``None``.
        gold_intent: gold label.
        gold_order_id: gold order id, or ``None`` when the message names none.
        intent_weight: weight of the intent term, in [0, 1].

    Returns:
        A reward in [0, 1].

    Raises:
        UserError: ``intent_weight`` outside [0, 1] or no gold intent.
    """
    if not 0.0 <= intent_weight <= 1.0:
        raise UserError(f"intent_weight must be in [0, 1], got {intent_weight}")
    intent = intent_match(pred_intent, gold_intent)
    return intent_weight * intent + (1.0 - intent_weight) * entity_match(pred_order_id, gold_order_id)


def _from_json(text: str) -> TriagePrediction | None:
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("intent"), str) and obj["intent"].strip():
            order_id = obj.get("order_id", obj.get("entity"))
            return TriagePrediction(normalize_intent(obj["intent"]), normalize_entity(order_id))
    return None


def parse_triage(text: str | None, labels: Collection[str] | None = None) -> TriagePrediction | None:
    """Parse a triage answer (formats in the module docstring).

    Args:
        text: the completion text.
        labels: if given, a bare-label answer must be one of these (normalised) to count as parsed;
            labelled answers (JSON, ``intent:`` lines) are parsed whatever they say.

    Returns:
        The prediction, or ``None`` when the text is unparseable.
    """
    if not text or not text.strip():
        return None
    if parsed := _from_json(text):
        return parsed
    if match := _INTENT_LINE.search(text):
        order = _ORDER_LINE.search(text)
        intent = normalize_intent(match.group(1))
        if intent:
            return TriagePrediction(intent, normalize_entity(order.group(1)) if order else None)
    candidate = text.strip()
    if "\n" not in candidate and len(candidate) <= 64:
        intent = normalize_intent(candidate)
        allowed = labels is None or intent in {normalize_intent(label) for label in labels}
        if intent and _BARE_LABEL.match(intent) and allowed:
            return TriagePrediction(intent)
    return None


def _gold_column(kwargs: Mapping[str, Any], name: str, n: int) -> list[Any]:
    values = kwargs.get(name)
    if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
        raise UserError(f"reward kwarg {name!r} must be a list with one gold value per completion ({n})")
    return list(values)


def make_triage_reward_func(
    use_order_id: bool = True,
    intent_weight: float = 0.5,
    unparseable: float | None = None,
    labels: Collection[str] | None = None,
) -> RewardFunc:
    """Build a TRL reward function for triage (``reward_funcs=[make_triage_reward_func()]``).

    The returned function has TRL's shape ``f(completions, **kwargs) -> list[float | None]``:

    * ``completions[i]``: the model's answer, a string or a list of chat messages (assistant text is read).
    * ``intent[i]`` (kwarg, a dataset column): the gold label; ``None`` for a row that has none.
    * ``order_id[i]`` (kwarg, a dataset column; needed when ``use_order_id``): the gold order id or
      ``None`` when the message names no order.
    * Other kwargs TRL passes (``prompts``, ``completion_ids``, ``trainer_state``, …) are ignored.

    Entry *i* is :func:`triage_reward` (or :func:`intent_match` without order ids); ``None`` when the row
    has no gold intent or the completion has an unsupported type; ``unparseable`` when
    :func:`parse_triage` cannot read the answer.

    Args:
        use_order_id: score the order id too (Bitext); ``False`` for intent-only data (Banking77, CLINC150).
        intent_weight: weight of the intent term when ``use_order_id``.
        unparseable: the value for an unreadable answer (default ``None``: masked, not scored).
        labels: optional label set for bare-label answers (see :func:`parse_triage`).

    Returns:
        The reward function, named ``triage_reward`` or ``intent_reward``.

    Raises:
        UserError: ``intent_weight`` outside [0, 1]; (when called) a gold column is missing or has the
            wrong length.
    """
    if not 0.0 <= intent_weight <= 1.0:
        raise UserError(f"intent_weight must be in [0, 1], got {intent_weight}")

    def reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        intents = _gold_column(kwargs, "intent", n)
        order_ids = _gold_column(kwargs, "order_id", n) if use_order_id else [None] * n
        scores: list[float | None] = []
        for completion, gold_intent, gold_order in zip(completions, intents, order_ids, strict=True):
            text = completion_text(completion)
            if text is None or not isinstance(gold_intent, str) or not gold_intent.strip():
                scores.append(None)
                continue
            pred = parse_triage(text, labels)
            if pred is None:
                scores.append(unparseable)
            elif use_order_id:
                scores.append(
                    triage_reward(pred.intent, pred.order_id, gold_intent, gold_order, intent_weight)
                )
            else:
                scores.append(intent_match(pred.intent, gold_intent))
        return scores

    reward.__name__ = reward.__qualname__ = "triage_reward" if use_order_id else "intent_reward"
    return reward


#: Intent + order id, 0.5 each; unparseable answers → ``None`` (see :func:`make_triage_reward_func`).
triage_reward_func: RewardFunc = make_triage_reward_func()
#: Intent only; unparseable answers → ``None``.
intent_reward_func: RewardFunc = make_triage_reward_func(use_order_id=False)
