"""The τ-bench reward: database-hash match with the gold actions, plus (v1) the required outputs.

Definition (τ-bench, Yao et al. 2024, arXiv:2406.12045, and ``../shared/data/README.md``): replay the
task's gold actions on a fresh copy of the database and hash it (SHA-256 of ``json.dumps(data,
sort_keys=True)``); a rollout scores **1.0** only if the database after the agent's run has the same
hash and every string in the task's ``outputs`` appears, case-insensitively and ignoring commas, in
some agent message; otherwise **0.0**. Gold actions are one valid path, not the only one: any sequence
of tool calls that leaves the same database scores 1.

The scorer works with any environment that has ``new_db()`` returning a database with
``call_tool(name, arguments) -> str`` and ``db_hash() -> str`` (the τ-retail
:class:`~agentforge.agents.customer_service.tau_retail.TauRetail` is the default). Gold hashes are
cached per environment and action list, so scoring a group of rollouts of one task replays once.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeGuard

from agentforge.errors import UserError
from agentforge.rewards.completions import RewardFunc, agent_texts
from agentforge.types import Task

__all__ = [
    "ToolDB",
    "ToolEnv",
    "TauRewardResult",
    "gold_of",
    "gold_hash",
    "outputs_found",
    "tau_reward",
    "tau_reward_details",
    "make_tau_reward_func",
    "tau_reward_func",
]


class ToolDB(Protocol):
    """One rollout's database: tools run against it, and it hashes canonically."""

    def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str: ...

    def db_hash(self) -> str: ...


class ToolEnv(Protocol):
    """A domain that hands out fresh databases (``new_db`` must not share writes between calls)."""

    def new_db(self) -> ToolDB: ...


@dataclass(frozen=True)
class TauRewardResult:
    """The reward and why.

    Attributes:
        reward: 1.0 or 0.0.
        db_match: the agent's database hash equals the gold one.
        missing_outputs: required output strings no agent message contained.
        agent_hash: hash of the agent's database.
        gold_hash: hash after replaying the gold actions.
    """

    reward: float
    db_match: bool
    missing_outputs: list[str] = field(default_factory=list)
    agent_hash: str = ""
    gold_hash: str = ""


_GOLD_CACHE: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def gold_of(task: Task | Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """Return ``(actions, outputs)`` of a τ task.

    Args:
        task: a :class:`~agentforge.types.Task` (gold in ``metadata``), its ``model_dump()``, or a raw v1
            task dict ``{"actions": [{"name", "kwargs"}], "outputs": [str]}``.

    Returns:
        The gold actions and the required output strings (empty list if none).

    Raises:
        UserError: the task has no ``actions`` list.
    """
    if isinstance(task, Task):
        source: Mapping[str, Any] = task.metadata
    elif isinstance(task, Mapping):
        source = (
            task["metadata"] if "actions" not in task and isinstance(task.get("metadata"), Mapping) else task
        )
    else:
        raise UserError(f"a τ task must be a Task or a dict, got {type(task).__name__}")
    actions = source.get("actions")
    if not isinstance(actions, list):
        raise UserError(
            "a τ task needs gold 'actions' (a list of {name, kwargs}) in the task or its metadata"
        )
    return actions, list(source.get("outputs") or [])


def _is_env(value: object) -> TypeGuard[ToolEnv]:
    """Whether ``value`` hands out databases (has a callable ``new_db``)."""
    return callable(getattr(value, "new_db", None))


def _default_env() -> ToolEnv:
    from agentforge.agents.customer_service.tau_retail import load_tau_retail

    return load_tau_retail()


def _dataset_of(task: Task | Mapping[str, Any]) -> Any:
    """The ``dataset`` a task names, read where :func:`gold_of` reads its actions, or ``None``."""
    if isinstance(task, Task):
        return task.metadata.get("dataset")
    metadata = task.get("metadata")
    source = metadata if "actions" not in task and isinstance(metadata, Mapping) else task
    return source.get("dataset")


def _check_retail(
    db: ToolDB | str, task: Task | Mapping[str, Any], actions: Sequence[Mapping[str, Any]]
) -> None:
    """Refuse to score a task of another domain on the τ-retail database (the default when ``env`` is None).

    Replaying another domain's gold actions on the retail database never matches the agent's database, so
    every rollout would silently score 0.0.

    Raises:
        UserError: ``db`` is a database object of another domain, the task names another ``dataset``, or a
            gold action names a tool τ-retail does not have; the message says to pass ``env=``.
    """
    from agentforge.agents.customer_service.tau_retail import DATASET, TOOLS

    dataset = _dataset_of(task)
    unknown = sorted({str(a.get("name")) for a in actions if a.get("name") not in TOOLS})
    if not isinstance(db, str):
        why = f"the database is a {type(db).__name__}, not a τ-retail database"
    elif dataset not in (None, DATASET):
        why = f"the task is from dataset {dataset!r}, not {DATASET!r}"
    elif unknown:
        why = f"its gold actions call tools τ-retail does not have ({', '.join(unknown)})"
    else:
        return
    raise UserError(
        f"τ reward without env=: {why}, so its gold actions would be replayed on the τ-retail database and "
        "every rollout would score 0.0; pass your domain's environment (an object with new_db() whose "
        "databases have call_tool(name, arguments) and db_hash()): tau_reward(..., env=ENV) or "
        "make_tau_reward_func(ENV)"
    )


def gold_hash(env: ToolEnv, actions: Sequence[Mapping[str, Any]]) -> str:
    """Replay gold actions on a fresh database of ``env`` and return its hash (cached per env).

    Args:
        env: the domain (see :class:`ToolEnv`).
        actions: ``[{"name": tool, "kwargs": {...}}]``; an action that returns ``Error: ...`` leaves the
            database as the tool leaves it, exactly as in the benchmark.

    Returns:
        The canonical hash after the replay.
    """
    key = json.dumps(list(actions), sort_keys=True)
    try:
        cache = _GOLD_CACHE.setdefault(env, {})
    except TypeError:  # env not weak-referenceable: no cache
        cache = {}
    if key not in cache:
        db = env.new_db()
        for action in actions:
            db.call_tool(action["name"], action.get("kwargs") or action.get("arguments") or {})
        cache[key] = db.db_hash()
    return cache[key]


def _normalise(text: str) -> str:
    return text.lower().replace(",", "")


def outputs_found(outputs: Sequence[str], agent_messages: Any) -> list[str]:
    """Return the required outputs that no agent message contains (case-insensitive, commas ignored).

    Args:
        outputs: required strings, e.g. ``["1093.34"]``.
        agent_messages: the agent's messages (see :func:`~agentforge.rewards.completions.agent_texts`).

    Returns:
        The missing outputs (empty when all are present).

    Raises:
        UserError: ``agent_messages`` has an unsupported type.
    """
    texts = agent_texts(agent_messages)
    if texts is None:
        raise UserError(
            f"agent_messages must be a string or a list of strings/messages, got {type(agent_messages).__name__}"
        )
    said = [_normalise(t) for t in texts]
    return [o for o in outputs if not any(_normalise(o) in s for s in said)]


def tau_reward_details(
    db: ToolDB | str,
    task: Task | Mapping[str, Any],
    agent_messages: Any = (),
    *,
    env: ToolEnv | None = None,
) -> TauRewardResult:
    """Score one finished τ rollout and say why (see the module docstring for the definition).

    Args:
        db: the agent's database after the rollout, or its hash (``db.db_hash()``).
        task: the τ task (see :func:`gold_of`).
        agent_messages: what the agent said: strings or OpenAI message dicts (assistant turns count).
        env: the domain to replay the gold actions in; default: the database's own snapshot when ``db``
            is a τ-retail database, else the τ-retail environment from :func:`load_tau_retail` — only for
            τ-retail tasks: another domain must pass its own ``env``.

    Returns:
        A :class:`TauRewardResult`; ``reward`` is 1.0 or 0.0.

    Raises:
        UserError: bad ``task``/``agent_messages`` types, the τ-retail data is missing, or ``env`` is
            ``None`` for a task or database of another domain (see :func:`_check_retail`).
    """
    actions, outputs = gold_of(task)
    if env is None:
        snapshot = getattr(db, "data", None)
        if _is_env(snapshot):
            env = snapshot
        else:
            _check_retail(db, task, actions)
            env = _default_env()
    agent_hash = db if isinstance(db, str) else db.db_hash()
    expected = gold_hash(env, actions)
    missing = outputs_found(outputs, agent_messages)
    db_match = agent_hash == expected
    reward = 1.0 if db_match and not missing else 0.0
    return TauRewardResult(reward, db_match, missing, agent_hash, expected)


def tau_reward(
    db: ToolDB | str,
    task: Task | Mapping[str, Any],
    agent_messages: Any = (),
    *,
    env: ToolEnv | None = None,
) -> float:
    """Score one finished τ rollout: 1.0 iff the database matches the gold replay and outputs were said.

    Args:
        db: the agent's database after the rollout, or its hash.
        task: the τ task (see :func:`gold_of`).
        agent_messages: the agent's messages (assistant turns count; strings count as agent messages).
        env: the domain (see :func:`tau_reward_details`).

    Returns:
        1.0 or 0.0.

    Raises:
        UserError: see :func:`tau_reward_details`.
    """
    return tau_reward_details(db, task, agent_messages, env=env).reward


def _column(kwargs: Mapping[str, Any], names: Sequence[str], n: int) -> list[Any] | None:
    for name in names:
        if name in kwargs and kwargs[name] is not None:
            values = kwargs[name]
            if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
                raise UserError(f"reward kwarg {name!r} must be a list with one entry per completion ({n})")
            return list(values)
    return None


def make_tau_reward_func(env: ToolEnv | None = None) -> RewardFunc:
    """Build a TRL reward function for τ rollouts (``reward_funcs=[make_tau_reward_func()]``).

    The returned function has TRL's shape ``f(completions, **kwargs) -> list[float | None]``:

    * ``completions[i]``: the agent's side of rollout *i*: the list of its chat messages (assistant turns
      are searched for the required outputs) or one string.
    * ``task[i]`` (kwarg, a dataset column or a ``rollout_func`` extra field): the τ task, a
      :class:`~agentforge.types.Task`, its ``model_dump()`` or a raw v1 dict.
    * ``db_hash[i]`` (kwarg, a ``rollout_func`` extra field) — or ``db[i]``, the database object: the
      agent's database after the rollout. ``None`` marks a rollout that did not finish.
    * Other kwargs TRL passes (``prompts``, ``completion_ids``, ``trainer_state``, …) are ignored.

    Entry *i* is 1.0 or 0.0, or ``None`` (masked, never 0) when the rollout has no database, no task,
    or a completion of an unsupported type.

    Args:
        env: the domain to replay gold actions in (default: τ-retail, loaded on first call; a task or
            database of another domain then raises ``UserError`` instead of scoring 0.0).

    Returns:
        The reward function, named ``tau_reward`` (TRL logs it under that name).

    Raises:
        UserError: (when called) the ``task`` or ``db_hash``/``db`` column is missing or has the wrong length.
    """

    def tau_reward(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        n = len(completions)
        tasks = _column(kwargs, ["task"], n)
        dbs = _column(kwargs, ["db_hash", "db"], n)
        if tasks is None or dbs is None:
            raise UserError("tau_reward needs the kwargs 'task' and 'db_hash' (or 'db'), one per completion")
        scores: list[float | None] = []
        for completion, task, db in zip(completions, tasks, dbs, strict=True):
            if db is None or task is None or agent_texts(completion) is None:
                scores.append(None)
                continue
            scores.append(tau_reward_details(db, task, completion, env=env).reward)
        return scores

    return tau_reward


#: The τ reward function with the default environment (see :func:`make_tau_reward_func`).
tau_reward_func: RewardFunc = make_tau_reward_func()
