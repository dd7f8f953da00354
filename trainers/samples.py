"""Token-exact training samples from stored LLM spans.

Every id here comes from the spans the gateway recorded (the engine's ``prompt_token_ids`` and sampled
``completion_token_ids``); nothing is re-tokenised (DESIGN fact 1).

**Merge rule.** The LLM spans of one rollout are walked in ``sequence`` order. A call *continues* a
trajectory when its prompt ids start with the trajectory's ids so far (prompt + every completion
and in-between token) exactly — any trajectory of the rollout, not only the latest, so conversations whose
calls interleave in time (the parallel branches of a LangGraph graph, each its own chat) each stay one
trajectory; where several match, the longest (the most specific history) continues; the extra prompt tokens between the previous completion and this call's
completion (tool results, user turns, template glue) are appended with ``env_mask`` 0 and logprob 0.0,
then the sampled ids with ``env_mask`` 1 and the engine's logprobs. A call that does not continue it
(the chat template rewrote history, e.g. stripped earlier reasoning) **starts a new trajectory**; it is
never re-wrapped. Every trajectory of a rollout carries that rollout's reward.

**Masked answers.** When the model wrote personal data, the gateway stores the answer with placeholders and
ids re-tokenised from it (:mod:`agentforge.privacy.answer`); the completion tokens from
``attributes["privacy_unsampled_from"]`` on were not sampled by the policy and get ``env_mask`` 0
(:func:`sampled_mask`).

**Grammar-forced tokens.** A guided call (a forced tool call, a JSON ``response_format``; see
:mod:`agentforge.gateway.guided`) whose logprobs the gateway recomputed (flag ``guided_logprobs_recomputed``)
keeps the grammar-masked logprobs in ``span.attributes["guided_logprobs"]`` (:data:`GUIDED_LOGPROBS_ATTRIBUTE`).
A token whose masked logprob is exactly 0.0 had probability 1 under the grammar: the grammar chose it, the
policy made no decision there, so GRPO must not credit or blame the policy's unconstrained log-probability of
it. Such tokens are marked in :attr:`Trajectory.forced`; they stay in the sequence (the following tokens are
conditioned on them, and ``env_mask`` still says the engine sampled them) but the GRPO samples
(:func:`grpo_sample`) give them loss mask 0, so they add nothing to the loss, its token count, the importance
ratio or the entropy. (A free token the model gives probability 1 up to float32 rounding is caught too; its
gradient ``∇ log p`` is 0 up to the same rounding, so nothing is lost.) Replay SFT and the dataset export keep
``env_mask`` as it is: there, learning the structure the grammar imposed is the point.

One sample is one trajectory laid out as the :data:`SAMPLE_COLUMNS` of TRL's ``rollout_func`` dict
(``trl.GRPOTrainer``): :func:`trajectory_sample` builds it, :func:`masked_sample` builds the slot-keeping
sample that trains nothing, and :func:`to_rollout_func_output` lays out a batch. Every sample source (live
rollouts, stored groups) and the dataset export use these, so the columns are written once. The GRPO sources
use :func:`grpo_sample`: forced tokens masked, plus :data:`TEMPERATURE_COLUMN` (:func:`with_token_columns`):
per completion token, the temperature at which the trainer recomputes the token's log-probability so that it
matches the stored one (:mod:`agentforge.trainers.logprob_match`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentforge.errors import UserError
from agentforge.privacy.answer import UNSAMPLED_FROM
from agentforge.trainers.logprob_match import GUIDED_RECOMPUTED, stored_logprob_temperature
from agentforge.trainers.part_credit import PARTS_COLUMN, ROLE_COLUMN, WHOLE, span_role
from agentforge.types import Span, SpanKind

__all__ = [
    "GRPO_COLUMNS",
    "GUIDED_LOGPROBS_ATTRIBUTE",
    "SAMPLE_COLUMNS",
    "TEMPERATURE_COLUMN",
    "DoubledStartTokenError",
    "SampleValidationError",
    "Trajectory",
    "build_trajectories",
    "check_single_start",
    "grammar_forced",
    "grpo_sample",
    "masked_sample",
    "sampled_mask",
    "to_rollout_func_output",
    "trajectory_sample",
    "with_token_columns",
]

#: The columns of one sample, in order: TRL's required ``prompt_ids`` / ``completion_ids`` / ``logprobs``,
#: its optional ``env_mask``, and the extra fields TRL hands reward functions (``reward``, ``rollout_id``,
#: ``version``: the policy version that sampled the trajectory's last call).
SAMPLE_COLUMNS = ("prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "rollout_id", "version")
#: Per completion token, the temperature the stored log-probability was computed at (``None``: a token the
#: policy did not sample, or a masked sample; the trainer's configured temperature applies).
TEMPERATURE_COLUMN = "temperature"
#: The columns the GRPO sample sources return: :data:`SAMPLE_COLUMNS` + :data:`TEMPERATURE_COLUMN` and part
#: credit's :data:`~agentforge.trainers.part_credit.ROLE_COLUMN` and ``PARTS_COLUMN``.
GRPO_COLUMNS = (*SAMPLE_COLUMNS, TEMPERATURE_COLUMN, ROLE_COLUMN, PARTS_COLUMN)
#: Span attribute holding a recomputed guided call's grammar-masked logprobs, one per completion token.
GUIDED_LOGPROBS_ATTRIBUTE = "guided_logprobs"


class SampleValidationError(UserError):
    """A span cannot be trained on (no engine token ids or logprobs, or inconsistent lengths)."""


class DoubledStartTokenError(SampleValidationError):
    """A prompt starts with the same token twice: a doubled BOS (or other special token), never trained on.

    The classic cause: a chat template that already emits BOS, rendered to text and tokenised again with
    ``add_special_tokens=True`` (or a template that writes BOS and then a turn header that is the BOS too).
    The model never saw such a prefix in pre-training; results move by several points. After BPE merges, a
    rendered prompt does not start with one token repeated, so the check needs no tokenizer.
    """


@dataclass
class Trajectory:
    """One training sequence. ``completion_ids``, ``logprobs`` and ``env_mask`` have equal length.

    Attributes:
        prompt_ids: ids of the first call's prompt, shape ``(P,)``.
        completion_ids: sampled ids and interleaved environment ids, shape ``(C,)``.
        logprobs: engine log-probabilities of sampled ids; 0.0 where ``env_mask`` is 0, shape ``(C,)``.
        env_mask: 1 for tokens the policy sampled, 0 for tokens it did not, shape ``(C,)``.
        versions: the policy versions that produced the sampled parts, in order.
        truncated: some call in it ended with ``finish_reason == "length"``.
        span_ids: the spans merged into it.
        temperatures: per completion token, the temperature its stored log-probability was computed at
            (``None`` where ``env_mask`` is 0 or the span cannot be matched), shape ``(C,)``.
        unmatched: one line per merged span whose stored log-probabilities the trainer cannot recompute
            (:func:`~agentforge.trainers.logprob_match.stored_logprob_temperature`); GRPO excludes the
            trajectory when any.
        forced: per completion token, whether a grammar forced it (module docstring), shape ``(C,)``; may be
            empty (a trajectory built by hand): nothing forced.
        roles: per completion token, the role of the span it came from for part credit
            (:func:`~agentforge.trainers.part_credit.span_role`; environment tokens ``WHOLE``), shape ``(C,)``;
            may be empty (a trajectory built by hand): every token ``WHOLE``.
    """

    rollout_id: str | None
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    truncated: bool = False
    span_ids: list[str] = field(default_factory=list)
    temperatures: list[float | None] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    roles: list[int] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        """Prompt followed by completion ids."""
        return self.prompt_ids + self.completion_ids

    @property
    def sampled_tokens(self) -> int:
        """Number of tokens the engine sampled (``sum(env_mask)``), grammar-forced ones included."""
        return sum(self.env_mask)

    @property
    def forced_tokens(self) -> int:
        """Number of sampled tokens a grammar forced (``sum(forced)``)."""
        return sum(self.forced)

    @property
    def loss_mask(self) -> list[int]:
        """GRPO's loss mask, shape ``(C,)``: ``env_mask`` with the grammar-forced tokens set to 0."""
        if not any(self.forced):
            return self.env_mask
        return [0 if f else m for m, f in zip(self.env_mask, self.forced, strict=True)]


def _checked(span: Span) -> tuple[list[int], list[int], list[float]]:
    llm = span.llm
    if llm is None or llm.prompt_token_ids is None or llm.completion_token_ids is None:
        raise SampleValidationError(
            f"span {span.span_id} has no engine token ids (flags: {llm.flags if llm else []}); serve the policy "
            "through vLLM or the embedded backend so the gateway records return_token_ids"
        )
    if llm.logprobs is None or len(llm.logprobs) != len(llm.completion_token_ids):
        got = None if llm.logprobs is None else len(llm.logprobs)
        raise SampleValidationError(
            f"span {span.span_id} has {got} logprobs for {len(llm.completion_token_ids)} completion tokens; "
            "request logprobs from the engine (the gateway does this by default)"
        )
    if not llm.trainable:
        raise SampleValidationError(f"span {span.span_id} is flagged not trainable: {', '.join(llm.flags)}")
    check_single_start(llm.prompt_token_ids, f"span {span.span_id}'s prompt")
    return llm.prompt_token_ids, llm.completion_token_ids, llm.logprobs


def check_single_start(ids: Sequence[int], what: str = "the sample") -> None:
    """Reject ids that start with the same token twice (a doubled BOS), with what to fix.

    Args:
        ids: prompt (or whole-sequence) token ids, shape ``(T,)``.
        what: names the ids in the message (e.g. ``"span sp-1's prompt"``).

    Raises:
        DoubledStartTokenError: ``ids[0] == ids[1]``.
    """
    if len(ids) >= 2 and ids[0] == ids[1]:
        raise DoubledStartTokenError(
            f"{what} starts with token id {ids[0]} twice (a doubled BOS/special token): the chat template "
            "already emits it and the rendered text was tokenised again with add_special_tokens=True, or the "
            "template writes it twice. Send token ids (or tokenise rendered text with "
            "add_special_tokens=False) and fix the template; such samples are never trained on"
        )


def grammar_forced(span: Span) -> list[bool]:
    """Which of ``span``'s completion tokens a grammar forced (masked logprob exactly 0.0; module docstring).

    Args:
        span: an LLM span with engine ids; only a span flagged ``guided_logprobs_recomputed`` that carries
            ``attributes["guided_logprobs"]`` can have forced tokens.

    Returns:
        One flag per completion token, shape ``(C,)`` (all ``False`` for any other span).

    Raises:
        SampleValidationError: the attribute is not a list of ``C`` numbers.
    """
    llm = span.llm
    completion = (llm.completion_token_ids or []) if llm is not None else []
    masked = span.attributes.get(GUIDED_LOGPROBS_ATTRIBUTE)
    if llm is None or GUIDED_RECOMPUTED not in llm.flags or masked is None:
        return [False] * len(completion)
    if not isinstance(masked, list) or len(masked) != len(completion):
        got = len(masked) if isinstance(masked, list) else type(masked).__name__
        raise SampleValidationError(
            f"span {span.span_id} has {got} {GUIDED_LOGPROBS_ATTRIBUTE} for {len(completion)} completion tokens"
        )
    try:
        return [float(v) == 0.0 for v in masked]
    except (TypeError, ValueError):
        raise SampleValidationError(
            f"span {span.span_id}'s {GUIDED_LOGPROBS_ATTRIBUTE} are not all numbers"
        ) from None


def sampled_mask(span: Span) -> list[int]:
    """``env_mask`` of ``span``'s completion tokens, shape ``(C,)``: 1 where the policy sampled the token, 0 from
    ``attributes["privacy_unsampled_from"]`` on (a masked answer's re-tokenised tail, see the module docstring).

    Raises:
        SampleValidationError: the attribute is not an integer in ``[0, C]``.
    """
    completion = (span.llm.completion_token_ids or []) if span.llm is not None else []
    start = span.attributes.get(UNSAMPLED_FROM)
    if start is None:
        return [1] * len(completion)
    if type(start) is not int or not 0 <= start <= len(completion):
        raise SampleValidationError(
            f"span {span.span_id} has {UNSAMPLED_FROM}={start!r} for {len(completion)} completion tokens"
        )
    return [1] * start + [0] * (len(completion) - start)


def build_trajectories(spans: Sequence[Span], *, explored: bool = False) -> list[Trajectory]:
    """Merge a rollout's LLM spans into trajectories by the module's merge rule.

    Args:
        spans: spans of one rollout (one attempt), any kinds; only ``kind == llm`` spans with
            ``status == "ok"`` are used, in ``sequence`` order.
        explored: raw-logprob spans sampled at a temperature other than 1 are matched at 1.0 instead of
            unmatched (:func:`~agentforge.trainers.logprob_match.stored_logprob_temperature`).

    Returns:
        Trajectories in order of their first call; one per conversation of continuing calls (interleaved
        conversations each keep theirs).

    Raises:
        SampleValidationError: an LLM span lacks engine token ids or logprobs, is flagged not trainable, or
            has malformed ``guided_logprobs``; :class:`DoubledStartTokenError` when its prompt starts with the
            same token twice.
    """
    calls = sorted(
        (s for s in spans if s.kind == SpanKind.llm and s.status == "ok"),
        key=lambda s: (s.sequence if s.sequence is not None else 0, s.started_at),
    )
    out: list[Trajectory] = []
    for span in calls:
        prompt, completion, logprobs = _checked(span)
        version = span.llm.version if span.llm else ""
        current = continued(out, prompt)
        if current is not None:
            gap = prompt[len(current.ids) :]
            current.completion_ids += gap
            current.logprobs += [0.0] * len(gap)
            current.env_mask += [0] * len(gap)
            current.temperatures += [None] * len(gap)
            current.forced += [False] * len(gap)
            current.roles += [WHOLE] * len(gap)
        else:
            current = Trajectory(rollout_id=span.rollout_id, prompt_ids=list(prompt))
            out.append(current)
        current.completion_ids += completion
        current.logprobs += logprobs
        current.env_mask += sampled_mask(span)
        current.forced += grammar_forced(span)
        current.roles += [span_role(span, first=not current.span_ids)] * len(completion)
        temperature, unmatched = stored_logprob_temperature(span, explored=explored)
        current.temperatures += [temperature] * len(completion)
        if unmatched:
            current.unmatched.append(f"span {span.span_id}: {unmatched}")
        current.versions.append(version)
        current.truncated |= span.llm is not None and span.llm.finish_reason == "length"
        current.span_ids.append(span.span_id)
    return out


def continued(trajectories: Sequence[Trajectory], prompt: Sequence[int]) -> Trajectory | None:
    """The trajectory a call with ``prompt`` continues: the longest whose ids so far ``prompt`` starts with (the
    latest of equal length), or ``None``."""
    best: Trajectory | None = None
    best_len = -1
    for traj in trajectories:
        ids = traj.ids
        if best_len <= len(ids) <= len(prompt) and prompt[: len(ids)] == ids:
            best, best_len = traj, len(ids)
    return best


def trajectory_sample(traj: Trajectory, reward: float | None, rollout_id: str | None) -> dict[str, Any]:
    """One sample of TRL's ``rollout_func`` dict from a trajectory (keys :data:`SAMPLE_COLUMNS`).

    Args:
        traj: the trajectory; its ids and logprobs are used as they are (no copy).
        reward: its reward (``None`` = missing: TRL masks it, never a 0).
        rollout_id: the rollout it came from.

    Returns:
        ``{"prompt_ids": (P,), "completion_ids": (C,), "logprobs": (C,), "env_mask": (C,), "reward",
        "rollout_id", "version"}``; ``version`` is the last call's version (``""`` when none is recorded).
    """
    return {
        "prompt_ids": traj.prompt_ids,
        "completion_ids": traj.completion_ids,
        "logprobs": traj.logprobs,
        "env_mask": traj.env_mask,
        "reward": reward,
        "rollout_id": rollout_id,
        "version": traj.versions[-1] if traj.versions else "",
    }


def grpo_sample(
    traj: Trajectory, reward: float | None, rollout_id: str | None, parts: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The GRPO sample of a trajectory (keys :data:`GRPO_COLUMNS`): :func:`trajectory_sample` with
    ``env_mask`` replaced by :attr:`Trajectory.loss_mask` (grammar-forced tokens 0), its temperatures, token
    roles and the reward's ``parts`` (``metadata["parts"]``, for part credit; ``{}`` when none)."""
    sample = {**trajectory_sample(traj, reward, rollout_id), "env_mask": traj.loss_mask}
    return with_token_columns({**sample, PARTS_COLUMN: dict(parts or {})}, traj)


def with_token_columns(sample: dict[str, Any], traj: Trajectory | None) -> dict[str, Any]:
    """``sample`` with its :data:`TEMPERATURE_COLUMN` and :data:`ROLE_COLUMN` (all ``None`` and ``WHOLE`` for a
    masked sample: ``traj`` ``None``) and :data:`PARTS_COLUMN` (``{}`` unless ``sample`` has it)."""
    width = len(sample["completion_ids"])
    temperatures = traj.temperatures if traj is not None else [None] * width
    roles = traj.roles if traj is not None and traj.roles else [WHOLE] * width
    return {
        **sample,
        TEMPERATURE_COLUMN: temperatures,
        ROLE_COLUMN: roles,
        PARTS_COLUMN: sample.get(PARTS_COLUMN, {}),
    }


def masked_sample(rollout_id: str | None, placeholder_token_id: int = 0) -> dict[str, Any]:
    """A slot-keeping sample with no gradient: one placeholder token, ``env_mask`` 0, reward ``None``.

    Args:
        rollout_id: the rollout whose slot it keeps (``None`` for a missing group member).
        placeholder_token_id: the id of the one prompt and completion token (e.g. the tokenizer's EOS).

    Returns:
        A sample with the keys :data:`SAMPLE_COLUMNS` (``version`` ``""``).
    """
    placeholder = Trajectory(rollout_id, [placeholder_token_id], [placeholder_token_id], [0.0], [0])
    return trajectory_sample(placeholder, None, rollout_id)


def to_rollout_func_output(
    trajectories: Sequence[Trajectory], rewards: Sequence[float | None], **extra: Sequence[Any]
) -> dict[str, list[Any]]:
    """Lay trajectories out as TRL's ``rollout_func`` output.

    Args:
        trajectories: ``N`` trajectories.
        rewards: ``N`` rewards (``None`` = missing; reward functions mask it).
        **extra: further per-sample fields (length ``N`` each), passed to reward functions by TRL.

    Returns:
        ``{"prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "rollout_id", "version", ...}``,
        each a list of length ``N``.

    Raises:
        UserError: the lengths of ``rewards`` or an ``extra`` field differ from ``N``.
    """
    n = len(trajectories)
    for name, values in {"rewards": rewards, **extra}.items():
        if len(values) != n:
            raise UserError(f"{name} has {len(values)} entries for {n} trajectories")
    samples = [trajectory_sample(t, r, t.rollout_id) for t, r in zip(trajectories, rewards, strict=True)]
    out = {column: [s[column] for s in samples] for column in SAMPLE_COLUMNS}
    return {**out, **{k: list(v) for k, v in extra.items()}}
