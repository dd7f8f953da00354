"""Putting work in and waiting for it: :func:`enqueue_tasks` (G rollouts per task, one group id),
:func:`wait_for_rollouts` (block until rollouts are finished, retries included), :func:`evaluate_tasks`
(mean reward of one pinned rollout per task) and :func:`load_tasks` (tasks from a JSONL file)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentforge.errors import ConfigError, RolloutTimeout, UserError
from agentforge.types import Rollout, Task, new_id

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = ["enqueue_tasks", "wait_for_rollouts", "task_scores", "evaluate_tasks", "load_tasks"]


def enqueue_tasks(
    store: TraceStore,
    tasks: Iterable[Task | Mapping[str, Any]],
    group_size: int = 1,
    resources: Mapping[str, str] | None = None,
    agent: str = "",
    *,
    max_attempts: int = 3,
    timeout_s: float = 600.0,
    metadata: Mapping[str, Any] | None = None,
    tenant: str | None = None,
) -> list[Rollout]:
    """Enqueue ``group_size`` rollouts per task; the rollouts of one task share a fresh ``group_id``.

    Args:
        store: the trace store.
        tasks: :class:`~agentforge.types.Task` objects, or mappings used as a task's ``input``.
        group_size: rollouts per task (GRPO's group size G), >= 1.
        resources: versions pinned to every rollout, e.g. ``{"policy": "policy@v3"}``.
        agent: ``Rollout.agent`` (runners with ``agent_name`` claim only their agent's rollouts).
        max_attempts: tries per rollout (first run + retries).
        timeout_s: wall-clock limit per attempt, seconds.
        metadata: stored with every rollout.
        tenant: the tenant every rollout belongs to (``Rollout.tenant``; ``None``: none).

    Returns:
        The stored rollouts, task by task, in enqueue order.

    Raises:
        ConfigError: ``group_size < 1``.
    """
    if group_size < 1:
        raise ConfigError(f"enqueue_tasks(group_size={group_size}): a group needs at least 1 rollout")
    out = []
    for item in tasks:
        task = item if isinstance(item, Task) else Task(input=dict(item))
        group_id = new_id("grp")
        for _ in range(group_size):
            rollout = Rollout(
                task=task,
                agent=agent,
                group_id=group_id,
                resources=dict(resources or {}),
                metadata=dict(metadata or {}),
                max_attempts=max_attempts,
                timeout_s=timeout_s,
                tenant=tenant,
            )
            out.append(store.enqueue_rollout(rollout))
    return out


def wait_for_rollouts(
    store: TraceStore,
    rollout_ids: Sequence[str],
    timeout_s: float | None = None,
    poll_s: float = 0.2,
    check: Callable[[], None] | None = None,
) -> list[Rollout]:
    """Block until every rollout is finished (succeeded, failed, timed out or cancelled, retries done).

    Args:
        store: the trace store.
        rollout_ids: the rollouts to wait for.
        timeout_s: give up after this many seconds (``None``: wait forever).
        poll_s: seconds between checks.
        check: called at every poll; may raise to stop waiting (the runner checks its workers).

    Returns:
        The finished rollouts, in the order of ``rollout_ids``.

    Raises:
        RolloutTimeout: ``timeout_s`` passed first; the message counts the unfinished rollouts by state.
        NotFoundError: an unknown rollout id.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    done: dict[str, Rollout] = {}
    pending = list(dict.fromkeys(rollout_ids))
    while True:
        if check is not None:
            check()
        still = []
        for rid in pending:
            rollout = store.get_rollout(rid)
            (done.__setitem__(rid, rollout) if rollout.state.finished else still.append(rollout))
        pending = [r.rollout_id for r in still]
        if not pending:
            return [done[rid] for rid in rollout_ids]
        if deadline is not None and time.monotonic() >= deadline:
            counts: dict[str, int] = {}
            for r in still:
                counts[r.state.value] = counts.get(r.state.value, 0) + 1
            raise RolloutTimeout(
                f"{len(pending)} of {len(set(rollout_ids))} rollouts unfinished after {timeout_s:g} s: {counts}"
            )
        time.sleep(poll_s)


def task_scores(
    store: TraceStore,
    tasks: Sequence[Task | Mapping[str, Any]],
    resources: Mapping[str, str] | None = None,
    *,
    label: str = "eval",
    agent: str = "",
    timeout_s: float = 1800.0,
    max_attempts: int = 2,
) -> list[float]:
    """Final reward of one rollout per task, in task order, run by whatever runners serve the store.

    The per-example scores of a held-out evaluation (the promotion gate's paired test compares two
    versions' lists example by example, :class:`agentforge.gate.EvalGate`). The tasks carry their own
    sampling settings (e.g. ``input["temperature"] = 0`` for greedy), ``resources`` pins what the rollouts
    use (``{"policy": "policy@v3"}``, ``{"prompt:triage": "2"}``), and a rollout that fails or has no reward
    scores 0.

    Args:
        store: the trace store the runners poll.
        tasks: the evaluation tasks (``N`` of them).
        resources: resource pins put on every rollout.
        label: stored as ``metadata["eval"]`` on the rollouts (to find or exclude them later).
        agent: the agent name on the rollouts (empty: any runner).
        timeout_s: how long to wait for all ``N`` rollouts, seconds.
        max_attempts: attempts per rollout.

    Returns:
        ``N`` rewards (for exact-match scorers: 0.0 or 1.0 each).

    Raises:
        UserError: no tasks.
        RolloutTimeout: the rollouts did not finish in ``timeout_s``.
    """
    if not tasks:
        raise UserError("an evaluation needs at least one task")
    rollouts = enqueue_tasks(
        store, tasks, resources=resources, agent=agent, metadata={"eval": label}, max_attempts=max_attempts
    )
    done = wait_for_rollouts(store, [r.rollout_id for r in rollouts], timeout_s=timeout_s)
    scores = []
    for rollout in done:
        final = store.final_reward(rollout.rollout_id)
        scores.append(float(final.value) if final is not None and final.value is not None else 0.0)
    return scores


def evaluate_tasks(
    store: TraceStore,
    tasks: Sequence[Task | Mapping[str, Any]],
    resources: Mapping[str, str] | None = None,
    *,
    label: str = "eval",
    agent: str = "",
    timeout_s: float = 1800.0,
    max_attempts: int = 2,
) -> float:
    """Mean final reward of one rollout per task (the mean of :func:`task_scores`, same arguments).

    The held-out evaluation every job uses; a rollout that fails or has no reward counts 0.

    Returns:
        The mean reward over the ``N`` tasks (for exact-match scorers: the accuracy in ``[0, 1]``).

    Raises:
        UserError: no tasks.
        RolloutTimeout: the rollouts did not finish in ``timeout_s``.
    """
    if not tasks:
        raise UserError("evaluate_tasks needs at least one task")
    scores = task_scores(
        store, tasks, resources, label=label, agent=agent, timeout_s=timeout_s, max_attempts=max_attempts
    )
    return sum(scores) / len(scores)


def load_tasks(path: str | Path) -> list[Task]:
    """Read tasks from a JSONL file: one JSON object per line with ``input`` (and optionally ``task_id``,
    ``metadata``); blank lines are ignored.

    Args:
        path: the file.

    Returns:
        The tasks, in file order.

    Raises:
        UserError: the file is missing, not UTF-8, empty, or a line is not a valid task (the message names
            the line number and the problem).
    """
    import json

    from pydantic import ValidationError

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"task file {path} does not exist") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"task file {path} is not UTF-8: {exc}") from None
    tasks: list[Task] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict) or "input" not in obj:
                raise UserError(
                    f'{path}:{number}: not a task (no "input" object); expected {{"input": {{...}}}}'
                )
            tasks.append(Task.model_validate(obj))
        except (json.JSONDecodeError, ValidationError) as exc:
            first = str(exc).splitlines()[0][:200]
            raise UserError(f'{path}:{number}: not a task ({first}); expected {{"input": {{...}}}}') from None
    if not tasks:
        raise UserError(f"task file {path} holds no tasks")
    return tasks
