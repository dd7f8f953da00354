"""An LLM judge that ranks a group of rollouts relative to each other (any OpenAI-compatible judge).

Idea: GRPO only uses rewards *relative to the group* (advantages are normalised within the G rollouts
of one task), and an LLM judges relatively far more reliably than absolutely. So the judge sees the
whole group at once and orders it, instead of scoring each rollout alone. Sources: pairwise /
relative LLM-as-a-judge and its position bias (Zheng et al. 2023, "Judging LLM-as-a-Judge with
MT-Bench and Chatbot Arena", arXiv:2306.05685); RULER from OpenPipe ART, which has a judge score the
trajectories of one group against each other (https://art.openpipe.ai/fundamentals/ruler).

Protocol, per group: the candidates are shown labelled ``A``, ``B``, ``C`` … in an order shuffled with a
fixed seed (derived from ``seed`` and the group's content, so the same group is always shown the same
way and position bias does not line up with the rollout index); the judge answers a ranking, best
first, such as ``B > A = C`` or a JSON list ``["B", "A", "C"]`` (a nested list is a tie); the labels are
mapped back to the candidates. Rewards are linear in rank, in [0, 1]: best 1.0, worst 0.0; tied
candidates share the mean of the positions they occupy (fractional ranking), so a group's rewards always
average 0.5.

Never invented: an API error, or an answer that is not a complete ranking of the group's labels (each
exactly once), gives ``None`` for every candidate of that group — masked by the trainer, never 0 — and
the reason is logged on ``agentforge.rewards`` and returned by :meth:`GroupJudge.judge`.

Reading the answer and the rank rewards (:func:`parse_ranking`, :func:`rank_rewards`) live in
:mod:`agentforge.rewards.ranking` and are importable from here too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agentforge.errors import ConfigError, MissingExtraError, UserError
from agentforge.rewards.completions import RewardFunc, completion_text, message_text
from agentforge.rewards.ranking import parse_ranking, rank_rewards

if TYPE_CHECKING:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionMessageParam

__all__ = [
    "DEFAULT_JUDGE_CRITERIA",
    "JudgeResult",
    "GroupJudge",
    "parse_ranking",
    "rank_rewards",
    "make_group_judge_reward_func",
]

logger = logging.getLogger("agentforge.rewards")

#: What the judge is asked to prefer when no ``criteria`` are given.
DEFAULT_JUDGE_CRITERIA = (
    "Prefer the response that best accomplishes the task: correct, complete, following the instructions "
    "and policies it was given, and no longer than needed."
)

_LABELS = string.ascii_uppercase
_SYSTEM = (
    "You are an impartial judge. You compare several candidate responses to the same task and rank them "
    "from best to worst.\n\nCriteria: {criteria}\n\nJudge only the content; ignore the order in which the "
    "candidates are shown and their labels. Answer with the ranking only, best first, using every label "
    "exactly once, '>' for 'better than' and '=' for a tie. For example, with three candidates where C is "
    "best and A and B are equally good: C > A = B"
)


@dataclass(frozen=True)
class JudgeResult:
    """One group's judgement.

    Attributes:
        rewards: one per candidate, in the caller's order, in [0, 1]; all ``None`` when ``error``.
        ranking: tie groups of candidate indices (caller's order), best first; empty when ``error``.
        order: ``order[k]`` is the candidate index shown under label ``k`` (``A`` = 0).
        answer: the judge's raw answer (``""`` after an API error).
        error: why the group could not be scored, else ``None``.
    """

    rewards: list[float | None]
    ranking: list[list[int]] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    answer: str = ""
    error: str | None = None


class GroupJudge:
    """Ranks the candidates of one group with an OpenAI-compatible judge (see the module docstring).

    Args:
        client_or_base_url: an ``openai.OpenAI`` client, or the judge's base URL (``.../v1``); a client is
            then built with ``api_key``, ``timeout_s`` and ``max_retries``.
        model: the judge model's name.
        criteria: what makes a response better, in words (goes into the system prompt).
        max_tokens: completion budget of one judgement, tokens (room for a short reasoning is fine).
        temperature: sampling temperature of the judge (0: greedy, repeatable).
        seed: seeds the presentation shuffle, and is sent to the judge (``None``: not sent; the shuffle
            then uses 0).
        api_key: API key when a base URL is given (default ``"agentforge-no-key"``).
        timeout_s: request timeout when a base URL is given, seconds.
        max_retries: client retries when a base URL is given.
        max_candidate_chars: each candidate is cut to this many characters (head kept, marked).

    Raises:
        ConfigError: ``max_tokens < 1``, ``temperature < 0`` or ``max_candidate_chars < 1``.
        MissingExtraError: a base URL is given and ``openai`` is not installed.
    """

    def __init__(
        self,
        client_or_base_url: OpenAI | str,
        model: str,
        *,
        criteria: str = DEFAULT_JUDGE_CRITERIA,
        max_tokens: int = 256,
        temperature: float = 0.0,
        seed: int | None = 0,
        api_key: str = "agentforge-no-key",
        timeout_s: float = 120.0,
        max_retries: int = 2,
        max_candidate_chars: int = 4000,
    ) -> None:
        if max_tokens < 1 or temperature < 0 or max_candidate_chars < 1:
            raise ConfigError(
                f"GroupJudge(max_tokens={max_tokens}, temperature={temperature}, max_candidate_chars="
                f"{max_candidate_chars}): need max_tokens >= 1, temperature >= 0, max_candidate_chars >= 1"
            )
        if isinstance(client_or_base_url, str):
            try:
                from openai import OpenAI
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise MissingExtraError("openai", "agents", "GroupJudge") from exc
            client_or_base_url = OpenAI(
                base_url=client_or_base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries
            )
        self.client, self.model, self.criteria = client_or_base_url, model, criteria
        self.max_tokens, self.temperature, self.seed = max_tokens, temperature, seed
        self.max_candidate_chars = max_candidate_chars
        self.failures = 0  # groups that got None (API error or unreadable answer)

    def presentation_order(self, task_text: str, candidates: Sequence[str]) -> list[int]:
        """The shuffled order the judge sees: ``order[k]`` is the candidate shown under label ``k``.

        Deterministic in ``seed``, the task and the candidates.
        """
        digest = hashlib.sha256(json.dumps([self.seed or 0, task_text, list(candidates)]).encode()).digest()
        order = list(range(len(candidates)))
        random.Random(digest).shuffle(order)
        return order

    def messages(
        self, task_text: str, candidates: Sequence[str], order: Sequence[int]
    ) -> list[ChatCompletionMessageParam]:
        """The chat messages of one judgement (system: criteria and answer format; user: task and labelled
        candidates in ``order``)."""
        labels = _LABELS[: len(candidates)]
        parts = [f"Task:\n{task_text}"]
        for label, index in zip(labels, order, strict=True):
            parts.append(f"Candidate {label}:\n{self._cut(candidates[index])}")
        parts.append(f"Rank all {len(labels)} candidates ({', '.join(labels)}), best first.")
        return [
            {"role": "system", "content": _SYSTEM.format(criteria=self.criteria)},
            {"role": "user", "content": "\n\n".join(parts)},
        ]

    def _cut(self, text: str) -> str:
        if len(text) <= self.max_candidate_chars:
            return text
        return text[: self.max_candidate_chars] + f"…[truncated {len(text) - self.max_candidate_chars} chars]"

    def judge(self, task_text: str, candidates: Sequence[str]) -> JudgeResult:
        """Rank one group and say how (see :class:`JudgeResult`).

        Args:
            task_text: what the candidates were asked to do.
            candidates: the group's responses (2 to 26).

        Returns:
            The result; ``rewards`` are all ``None`` with ``error`` set after an API error or an answer
            that is not a complete ranking.

        Raises:
            UserError: fewer than 2 or more than 26 candidates, or a candidate is not a string.
        """
        if not 2 <= len(candidates) <= len(_LABELS):
            raise UserError(
                f"GroupJudge ranks groups of 2 to {len(_LABELS)} candidates, got {len(candidates)}"
            )
        if not all(isinstance(c, str) for c in candidates):
            raise UserError("GroupJudge candidates must be strings (use completion_text() on messages)")
        order = self.presentation_order(task_text, candidates)
        labels = list(_LABELS[: len(candidates)])
        try:
            answer = self._ask(self.messages(task_text, candidates, order))
        except _api_errors() as exc:  # no score, never 0
            return self._failed(len(candidates), order, "", f"judge call failed: {type(exc).__name__}: {exc}")
        ranked = parse_ranking(answer, labels)
        if ranked is None:
            return self._failed(len(candidates), order, answer, f"unparseable judge answer: {answer[:200]!r}")
        ranking = [[order[labels.index(label)] for label in tier] for tier in ranked]
        rewards: list[float | None] = list(rank_rewards(ranking, len(candidates)))
        return JudgeResult(rewards, ranking, order, answer)

    def rank(self, task_text: str, candidates: Sequence[str]) -> list[float | None]:
        """Rewards in [0, 1] by rank for one group (best 1.0, worst 0.0), or ``None`` for every candidate
        when the group could not be judged (reason logged).

        Args:
            task_text: what the candidates were asked to do.
            candidates: the group's responses (2 to 26).

        Returns:
            One reward per candidate, in the given order.

        Raises:
            UserError: see :meth:`judge`.
        """
        return self.judge(task_text, candidates).rewards

    def _ask(self, messages: list[ChatCompletionMessageParam]) -> str:
        extra: dict[str, Any] = {} if self.seed is None else {"seed": self.seed}
        response = self.client.chat.completions.create(
            model=self.model,
            messages=messages,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            **extra,
        )
        if not response.choices:
            return ""
        return message_text(response.choices[0].message.content) or ""

    def _failed(self, n: int, order: list[int], answer: str, reason: str) -> JudgeResult:
        self.failures += 1
        logger.warning("GroupJudge(%s): group of %d not scored (None): %s", self.model, n, reason)
        return JudgeResult([None] * n, [], order, answer, reason)


def _api_errors() -> tuple[type[BaseException], ...]:
    """What a failed judge call raises: the OpenAI client's errors, transport and timeout errors."""
    import httpx

    try:
        from openai import APIError
    except ImportError:  # pragma: no cover - depends on the environment
        return (httpx.HTTPError, OSError, TimeoutError)
    return (APIError, httpx.HTTPError, OSError, TimeoutError)


def _prompt_text(prompt: Any) -> str | None:
    """A prompt as text: a string, or chat messages rendered ``role: text`` one after another."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, Mapping):
        prompt = [prompt]
    if not isinstance(prompt, Sequence):
        return None
    parts = []
    for message in prompt:
        if isinstance(message, Mapping):
            text = message_text(message.get("content"))
            if text:
                parts.append(f"{message.get('role', 'user')}: {text}")
        elif isinstance(message, str):
            parts.append(message)
    return "\n\n".join(parts) if parts else None


def make_group_judge_reward_func(judge: GroupJudge, group_size: int) -> RewardFunc:
    """Build a TRL reward function that ranks each GRPO group with ``judge``.

    The returned function has TRL's shape ``f(completions, **kwargs) -> list[float | None]``:

    * ``completions``: B = n_groups × ``group_size`` completions, laid out as TRL's GRPO does: the G
      completions of one prompt are consecutive. Each is a string or a list of chat messages (assistant
      text is judged).
    * ``prompts`` (kwarg, always passed by TRL): one per completion; a string or chat messages, the same
      within a group. It is the task text the judge sees.
    * Other kwargs are ignored.

    Entry *i* is the rank reward of completion *i* within its group (see :meth:`GroupJudge.rank`), or
    ``None`` when its group could not be judged or the completion has an unsupported type (the others of
    its group are then ranked among themselves; fewer than 2 left → all ``None``).

    Args:
        judge: the judge.
        group_size: G, completions per prompt, 2 to 26 (one label per candidate).

    Returns:
        The reward function, named ``group_judge``.

    Raises:
        ConfigError: ``group_size`` outside 2..26.
        UserError: (when called) ``len(completions)`` is not a multiple of ``group_size``, ``prompts`` is
            missing or has the wrong length, or the prompts of one group differ (not the GRPO layout).
    """
    if not 2 <= group_size <= len(_LABELS):
        raise ConfigError(
            f"make_group_judge_reward_func(group_size={group_size}): a judged group has 2 to {len(_LABELS)} "
            "completions"
        )

    def group_judge(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n, prompts = len(completions), kwargs.get("prompts")
        if n % group_size:
            raise UserError(
                f"group_judge got {n} completions, not a multiple of group_size={group_size}; pass "
                "consecutive groups of G completions per prompt (TRL's GRPO layout)"
            )
        if not isinstance(prompts, Sequence) or isinstance(prompts, str) or len(prompts) != n:
            raise UserError(f"group_judge needs the kwarg 'prompts' with one prompt per completion ({n})")
        scores: list[float | None] = [None] * n
        for start in range(0, n, group_size):
            group = range(start, start + group_size)
            tasks = {json.dumps(prompts[i], sort_keys=True, default=str) for i in group}
            if len(tasks) != 1:
                raise UserError(
                    f"group_judge: completions {start}..{start + group_size - 1} have different prompts; "
                    f"group_size={group_size} must match the trainer's num_generations"
                )
            task_text = _prompt_text(prompts[start])
            texts = {i: completion_text(completions[i]) for i in group}
            valid = [i for i in group if texts[i] is not None]
            if task_text is None or len(valid) < 2:
                continue
            for i, reward in zip(valid, judge.rank(task_text, [texts[i] or "" for i in valid]), strict=True):
                scores[i] = reward
        return scores

    return group_judge
