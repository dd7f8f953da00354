"""Select stored traces for replay training (SFT, offline GRPO) with filters, counting every skip.

A *trace* is one finished rollout with its valid spans, its final reward and the token-exact
trajectories built from its LLM spans (:func:`agentforge.trainers.samples.build_trajectories`).
:func:`select_traces` walks the store's rollouts oldest first and keeps those that pass every filter
of a :class:`TraceFilter`; each rollout it drops is counted under one reason in
:attr:`Selection.skipped` (the first filter it fails, checked in this order):

``"state"``, ``"before since"`` / ``"after until"``, ``"agent"``, ``"task id"``, ``"group id"``,
``"resource mismatch"`` (pinned resources, or the policy version recorded on the LLM spans),
``"privacy: must not leave the store"`` (a span whose privacy policy forbids exports:
:func:`agentforge.privacy.ledger.must_stay`),
``"no reward"`` (none stored, or ``None``/NaN/inf), ``"reward below threshold"`` / ``"reward above
threshold"``, ``"over per-task cap"`` (``max_per_task`` rollouts of its task were kept already), ``"doubled start token"`` (a prompt that starts with the same token twice, a doubled BOS:
:class:`~agentforge.trainers.samples.DoubledStartTokenError`), ``"no token ids"`` (an LLM span without engine
ids/logprobs: :class:`~agentforge.trainers.samples.SampleValidationError`), ``"no llm spans"``.

Rewards follow the store's rule (:meth:`TraceStore.final_reward`): the last ``final`` reward, else
the last reward; ``None``/NaN is never turned into a number (DESIGN fact 4). ``agent``, ``group_id`` and
``since`` are filtered by the store's query, so rollouts they exclude are not counted in
:attr:`Selection.considered`; every other filter runs here and is counted.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from agentforge.errors import UserError
from agentforge.ports import TraceStore
from agentforge.privacy.ledger import must_stay
from agentforge.trainers.samples import (
    DoubledStartTokenError,
    SampleValidationError,
    Trajectory,
    build_trajectories,
)
from agentforge.types import Rollout, RolloutState, Span, SpanKind

__all__ = ["EmptySelectionError", "Selection", "TraceFilter", "TraceRecord", "select_traces"]

#: Resource names whose value is also checked against ``span.llm.version`` of the LLM spans.
POLICY_RESOURCES = frozenset({"policy"})


@dataclass(frozen=True)
class TraceFilter:
    """Which stored rollouts to replay. Every field left at its default filters nothing.

    Attributes:
        min_reward: keep rollouts whose final reward is ``>= min_reward``.
        max_reward: keep rollouts whose final reward is ``<= max_reward``.
        since: keep rollouts with ``created_at >= since`` (epoch seconds).
        until: keep rollouts with ``created_at < until`` (epoch seconds).
        agent: keep rollouts of this agent name.
        task_ids: keep rollouts of these tasks.
        resources: resource name → value every kept rollout must have pinned, e.g.
            ``{"policy": "policy@v3"}`` or ``{"prompt:triage": "2"}``. For ``"policy"`` every LLM span's
            recorded version (``span.llm.version``, when set) must equal the value too, and a rollout
            without a pin still matches when its spans record that version.
        group_id: keep rollouts of this GRPO group.
        states: keep rollouts in these states (default: succeeded only).
        require_reward: drop rollouts without a valid final reward (counted ``"no reward"``).
        require_tokens: drop rollouts whose LLM spans cannot be trained on (``"no token ids"``) or that
            have none (``"no llm spans"``); with ``False`` they are kept with the trajectories that
            could be built (possibly none), e.g. to archive everything with :func:`export_jsonl`.
        limit: keep at most this many rollouts (the oldest that pass).
        max_per_task: keep at most this many rollouts of one task (the oldest that pass; the rest are
            counted ``"over per-task cap"``): rejection sampling keeps a few distinct successes per problem
            (Yuan et al. 2023) so that easy tasks, which succeed in every sample, do not outweigh the hard ones.
    """

    min_reward: float | None = None
    max_reward: float | None = None
    since: float | None = None
    until: float | None = None
    agent: str | None = None
    task_ids: tuple[str, ...] | None = None
    resources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    group_id: str | None = None
    states: tuple[RolloutState, ...] = (RolloutState.succeeded,)
    require_reward: bool = True
    require_tokens: bool = True
    limit: int | None = None
    max_per_task: int | None = None

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 0:
            raise UserError(f"TraceFilter.limit must be >= 0, got {self.limit}")
        if self.max_per_task is not None and self.max_per_task < 1:
            raise UserError(f"TraceFilter.max_per_task must be >= 1, got {self.max_per_task}")
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise UserError(
                f"TraceFilter.min_reward ({self.min_reward}) is above max_reward ({self.max_reward})"
            )
        if isinstance(self.task_ids, str):
            raise UserError("TraceFilter.task_ids takes a tuple of ids, not one string: use (task_id,)")
        if isinstance(self.states, str):
            object.__setattr__(self, "states", (self.states,))
        object.__setattr__(self, "states", tuple(RolloutState(s) for s in self.states))
        if self.task_ids is not None:
            object.__setattr__(self, "task_ids", tuple(self.task_ids))

    def describe(self) -> str:
        """The fields that differ from the defaults, e.g. ``min_reward=0.5, agent='triage'``."""
        default = TraceFilter()
        parts = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if name == "resources":
                if value:
                    parts.append(f"resources={dict(value)!r}")
            elif value != getattr(default, name):
                shown = [s.value for s in value] if name == "states" else value
                parts.append(f"{name}={shown!r}")
        return ", ".join(parts) or "(default filter)"


@dataclass
class TraceRecord:
    """One selected rollout, ready to train on.

    Attributes:
        rollout: the stored rollout.
        reward: its final reward value (store's ``final_reward`` rule); ``None`` when it has no valid
            reward (only possible with ``require_reward=False``).
        spans: its valid spans (``list_spans(valid_only=True)``), by sequence.
        trajectories: ``build_trajectories(spans)``; empty only with ``require_tokens=False``.
        parts: the final reward's ``metadata["parts"]`` (``{}`` when none): GRPO's part credit reads them.
    """

    rollout: Rollout
    reward: float | None
    spans: list[Span]
    trajectories: list[Trajectory]
    parts: dict[str, Any] = field(default_factory=dict)

    @property
    def rollout_id(self) -> str:
        """The rollout's id."""
        return self.rollout.rollout_id

    @property
    def policy_version(self) -> str:
        """The policy version that produced the last trajectory's sampled tokens, else the pinned one."""
        for traj in reversed(self.trajectories):
            for version in reversed(traj.versions):
                if version:
                    return version
        return self.rollout.resources.get("policy", "")


@dataclass
class Selection:
    """The result of :func:`select_traces`.

    Attributes:
        records: the kept traces, oldest rollout first.
        considered: rollouts examined (after the store-side filters ``agent``/``group_id``/``since``).
        skipped: count per skip reason (see the module docstring).
        filter: the filter used.
    """

    records: list[TraceRecord]
    considered: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    filter: TraceFilter = field(default_factory=TraceFilter)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[TraceRecord]:
        return iter(self.records)

    def groups(self) -> dict[str, list[TraceRecord]]:
        """Records by ``rollout.group_id``, in first-seen order; a record without a group id is its own
        group, keyed by its rollout id."""
        out: dict[str, list[TraceRecord]] = {}
        for rec in self.records:
            out.setdefault(rec.rollout.group_id or rec.rollout_id, []).append(rec)
        return out

    def summary(self) -> str:
        """One line: kept / considered and the skip counts, e.g. ``3 of 10 rollouts kept; skipped: ...``."""
        skips = ", ".join(f"{reason}: {n}" for reason, n in self.skipped.most_common()) or "none"
        return f"{len(self.records)} of {self.considered} rollouts kept; skipped: {skips}"


class EmptySelectionError(UserError):
    """The filter selected no trace; the message lists the filter, the skip counts and how to widen it."""

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        super().__init__(
            f"no stored trace matches {selection.filter.describe()}: {selection.summary()}. "
            f"{_widen_hint(selection)}"
        )


_HINTS = {
    "state": "pass states=(...) with more states",
    "before since": "lower or drop since",
    "after until": "raise or drop until",
    "task id": "drop or extend task_ids",
    "resource mismatch": "drop or change resources (compare with the rollouts' pinned versions)",
    "no reward": "score the rollouts first, or pass require_reward=False",
    "reward below threshold": "lower min_reward",
    "reward above threshold": "raise max_reward",
    "no token ids": "serve the policy through vLLM or the embedded backend so the gateway records token "
    "ids, or pass require_tokens=False",
    "no llm spans": "check the agent's LLM calls go through the gateway, or pass require_tokens=False",
    "doubled start token": "the served chat template emits BOS and the prompt was tokenised again with "
    "add_special_tokens=True (or the template writes it twice): fix the template or the tokenisation",
}


def _widen_hint(selection: Selection) -> str:
    if selection.considered == 0:
        return (
            "The store holds no rollout for this agent/group_id/since: check the store URL and those fields."
        )
    hints = [_HINTS[r] for r, _ in selection.skipped.most_common() if r in _HINTS]
    return "To widen it: " + "; ".join(hints[:3]) + "." if hints else ""


def _rollout_reason(rollout: Rollout, flt: TraceFilter) -> str | None:
    """The first rollout-level filter ``rollout`` fails, or ``None``."""
    if rollout.state not in flt.states:
        return "state"
    if flt.since is not None and rollout.created_at < flt.since:
        return "before since"
    if flt.until is not None and rollout.created_at >= flt.until:
        return "after until"
    if flt.agent is not None and rollout.agent != flt.agent:
        return "agent"
    if flt.task_ids is not None and rollout.task.task_id not in flt.task_ids:
        return "task id"
    if flt.group_id is not None and rollout.group_id != flt.group_id:
        return "group id"
    for name, value in flt.resources.items():
        pinned = rollout.resources.get(name)
        if pinned != value and not (name in POLICY_RESOURCES and pinned is None):
            return "resource mismatch"
    return None


def _reward_reason(value: float | None, flt: TraceFilter) -> str | None:
    if value is None:
        return (
            "no reward"
            if flt.require_reward or flt.min_reward is not None or flt.max_reward is not None
            else None
        )
    if flt.min_reward is not None and value < flt.min_reward:
        return "reward below threshold"
    if flt.max_reward is not None and value > flt.max_reward:
        return "reward above threshold"
    return None


def _policy_matches(rollout: Rollout, spans: list[Span], flt: TraceFilter) -> bool:
    """Whether every policy resource in the filter matches the versions the LLM spans recorded."""
    for name, value in flt.resources.items():
        if name not in POLICY_RESOURCES:
            continue
        versions = {s.llm.version for s in spans if s.kind == SpanKind.llm and s.llm and s.llm.version}
        if versions - {value}:
            return False
        if not versions and rollout.resources.get(name) != value:
            return False
    return True


def _rollouts(store: TraceStore, flt: TraceFilter) -> list[Rollout]:
    """Candidate rollouts, oldest first; ``state`` is filtered here, not by the store, so it is counted."""
    return store.list_rollouts(group_id=flt.group_id, agent=flt.agent, since=flt.since)


def select_traces(
    store: TraceStore, flt: TraceFilter = TraceFilter(), *, allow_empty: bool = False
) -> Selection:
    """Select the stored traces that pass ``flt`` (see the module docstring for the skip reasons).

    Args:
        store: any trace store.
        flt: the filter; the default keeps succeeded rollouts with a valid reward and token ids.
        allow_empty: return an empty selection instead of raising.

    Returns:
        The kept records (oldest rollout first, at most ``flt.limit``), the number of rollouts
        considered and the skip counts.

    Raises:
        EmptySelectionError: nothing was kept and ``allow_empty`` is false.
    """
    selection = Selection(records=[], filter=flt)
    per_task: Counter[str] = Counter()
    for rollout in _rollouts(store, flt):
        if flt.limit is not None and len(selection.records) >= flt.limit:
            break
        selection.considered += 1
        record, reason = _examine(store, rollout, flt)
        if reason is None and record is not None and flt.max_per_task is not None:
            if per_task[rollout.task.task_id] >= flt.max_per_task:
                reason = "over per-task cap"
        if reason is not None:
            selection.skipped[reason] += 1
        elif record is not None:
            per_task[rollout.task.task_id] += 1
            selection.records.append(record)
    if not selection.records and not allow_empty:
        raise EmptySelectionError(selection)
    return selection


def _examine(store: TraceStore, rollout: Rollout, flt: TraceFilter) -> tuple[TraceRecord | None, str | None]:
    """Build the record of one rollout, or say which filter it fails."""
    reason = _rollout_reason(rollout, flt)
    if reason is not None:
        return None, reason
    final = store.final_reward(rollout.rollout_id)
    value = None if final is None or final.value is None or not math.isfinite(final.value) else final.value
    reason = _reward_reason(value, flt)
    if reason is not None:
        return None, reason
    spans = store.list_spans(rollout_id=rollout.rollout_id, valid_only=True)
    if not _policy_matches(rollout, spans, flt):
        return None, "resource mismatch"
    if any(must_stay(s) for s in spans):  # the deployment's privacy policy keeps it in the store
        return None, "privacy: must not leave the store"
    try:
        trajectories = build_trajectories(spans)
    except DoubledStartTokenError:  # never trained on, whatever require_tokens says
        return None, "doubled start token"
    except SampleValidationError:
        if flt.require_tokens:
            return None, "no token ids"
        trajectories = []
    if not trajectories and flt.require_tokens:
        return None, "no llm spans"
    parts = dict((final.metadata.get("parts") or {}) if final is not None else {})
    return TraceRecord(
        rollout=rollout, reward=value, spans=spans, trajectories=trajectories, parts=parts
    ), None
