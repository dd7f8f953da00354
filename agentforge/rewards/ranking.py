"""Reading a judge's ranking and turning it into rewards: the parsing half of :mod:`agentforge.rewards.judge`.

A ranking is a list of tie groups, best first: ``B > A = C`` is ``[["B"], ["A", "C"]]``. Rewards are linear in
rank, in [0, 1], with ties sharing the mean of the positions they span (fractional ranking).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

__all__ = ["parse_ranking", "rank_rewards"]

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_NOISE = re.compile(r"\b(?:candidate|response|answer|option)\s+(?=[A-Z]\b)|[\[\]()*`'\"]", re.IGNORECASE)
_CHAIN = re.compile(r"\b[A-Z]\b(?:\s*(?:>>?|=|≻)\s*\b[A-Z]\b)+")


def parse_ranking(text: str, labels: Sequence[str]) -> list[list[str]] | None:
    """Read a complete ranking of ``labels`` from a judge's answer.

    Accepted: a chain such as ``B > A = C`` (``>>``/``≻`` also mean better; brackets, quotes, bold and
    words like "Candidate" around labels are ignored; the last complete chain in the text wins, so the
    judge may reason first; ``<think>`` blocks are skipped), or JSON: a list of labels best first (an
    inner list is a tie) or an object with a ``"ranking"`` key holding such a list or chain.

    Args:
        text: the judge's answer.
        labels: the labels shown, e.g. ``["A", "B", "C"]``.

    Returns:
        Tie groups of labels, best first, or ``None`` when no ranking names every label exactly once.
    """
    text = _THINK.sub(" ", text or "")
    wanted = set(labels)
    for candidate in _json_rankings(text):
        if _complete(candidate, wanted):
            return candidate
    cleaned = _NOISE.sub(" ", text)
    for match in reversed(list(_CHAIN.finditer(cleaned))):
        chain = match.group(0).replace("≻", ">").replace(">>", ">")
        groups = [[label.strip() for label in tier.split("=")] for tier in chain.split(">")]
        if _complete(groups, wanted):
            return groups
    return None


def _complete(groups: list[list[str]], wanted: set[str]) -> bool:
    flat = [label for tier in groups for label in tier]
    return bool(flat) and len(flat) == len(set(flat)) and set(flat) == wanted


def _json_rankings(text: str) -> list[list[list[str]]]:
    """Rankings found in JSON values of ``text`` (lists of labels or of tie lists; ``{"ranking": ...}``)."""
    found: list[list[list[str]]] = []
    decoder = json.JSONDecoder()
    for start in (i for i, ch in enumerate(text) if ch in "[{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, Mapping):
            value = value.get("ranking")
            if isinstance(value, str):
                value = parse_ranking(value, sorted(set(re.findall(r"\b[A-Z]\b", value))))
        if isinstance(value, list) and value:
            groups = [[v] if isinstance(v, str) else v for v in value]
            if all(isinstance(g, list) and g and all(isinstance(x, str) for x in g) for g in groups):
                found.append([[x.strip().strip("[]").upper() for x in g] for g in groups])
    return found


def rank_rewards(ranking: Sequence[Sequence[int]], n: int) -> list[float]:
    """Turn tie groups of indices (best first) into linear rank rewards in [0, 1].

    Position ``p`` (0 = best) of ``n`` is worth ``1 - p / (n - 1)``; a tie group gets the mean value of
    the positions it spans (fractional ranking), so the rewards of a group average 0.5.

    Args:
        ranking: tie groups of indices ``0..n-1``, best first, each index exactly once.
        n: number of candidates, >= 2.

    Returns:
        ``n`` rewards, by index.
    """
    rewards = [0.0] * n
    position = 0
    for tier in ranking:
        mean_position = position + (len(tier) - 1) / 2
        for index in tier:
            rewards[index] = 1.0 - mean_position / (n - 1)
        position += len(tier)
    return rewards
