"""The objects that cross boundaries: tasks, rollouts, attempts, spans, rewards, resource versions.

Every component (gateway, store, runner, trainer, serving) speaks these pydantic models; the store maps
them onto tables, the HTTP store server onto JSON. Modelled on agent-lightning ``schemas.py``.

State machines:

* A **rollout** is one episode of an agent on one task. ``queued → running → succeeded | failed |
  timed_out``; a failed or timed-out rollout with attempts left goes back to ``queued`` (a *retry*),
  and ``running → queued`` happens when a worker's heartbeat is lost (the attempt is abandoned).
* An **attempt** is one try at a rollout by one worker. Spans and rewards carry the attempt id, so a
  dead attempt's spans are never counted with the attempt that finally succeeded.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentforge.errors import InvalidTransitionError, UserError

__all__ = [
    "RolloutState",
    "AttemptState",
    "ROLLOUT_TRANSITIONS",
    "check_transition",
    "Task",
    "Rollout",
    "Attempt",
    "SpanKind",
    "SpanStatus",
    "Span",
    "LLMCall",
    "ToolCall",
    "Reward",
    "ResourceVersion",
    "ResourceKind",
    "Version",
    "new_id",
    "new_ordered_id",
    "parse_version_number",
    "now",
    "ROLLOUT_PATH_PREFIX",
    "ROLLOUT_ID_HEADER",
    "ATTEMPT_ID_HEADER",
    "TENANT_HEADER",
    "check_tenant",
    "tenant_of_name",
    "LOGPROBS_MODES",
    "LOGPROBS_MODE_ATTRIBUTE",
    "rollout_base_url",
]

#: What an engine's returned logprobs can be (vLLM's ``--logprobs-mode`` values that are log-probabilities):
#: ``raw_logprobs`` (vLLM's default: log-softmax of the raw logits, before temperature and truncation) or
#: ``processed_logprobs`` (of the distribution sampled from). The trainer recomputes each span accordingly.
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")
#: The LLM span attribute that holds the serving engine's log-prob mode (the gateway writes it).
LOGPROBS_MODE_ATTRIBUTE = "logprobs_mode"

#: The gateway path prefix that attributes a call to a rollout: ``{gateway}/rollouts/{rollout_id}/v1/...``.
ROLLOUT_PATH_PREFIX = "/rollouts/"
#: The header that attributes a call to a rollout when the URL carries no prefix (the prefix wins).
ROLLOUT_ID_HEADER = "X-Rollout-Id"
#: The header naming the attempt a call belongs to (the runner sends it; the store otherwise stamps the
#: rollout's running attempt).
ATTEMPT_ID_HEADER = "X-Attempt-Id"
#: The header naming the tenant of a call that arrives on loopback without a tenant key (a tenant key wins).
TENANT_HEADER = "X-Tenant"

_TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def check_tenant(tenant: object) -> str:
    """Return ``tenant`` if it is a valid tenant name, else raise.

    A tenant name is 1-63 characters of lower-case ASCII letters, digits, ``_`` and ``-``, starting with a
    letter or digit: it becomes part of version names (``policy@acme/v3``), so it holds no ``@`` or ``/``.

    Raises:
        UserError: the name breaks that rule (the message shows a valid one).
    """
    if not isinstance(tenant, str) or _TENANT.fullmatch(tenant) is None:
        raise UserError(f"tenant {tenant!r} is not a tenant name; use 1-63 of a-z 0-9 _ -, e.g. 'acme-eu'")
    return tenant


def rollout_base_url(gateway_url: str, rollout_id: str) -> str:
    """The OpenAI base URL that attributes every call to ``rollout_id``.

    Args:
        gateway_url: the gateway root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/`` is ignored).
        rollout_id: the rollout the calls belong to.

    Returns:
        ``{gateway_url}/rollouts/{rollout_id}/v1``.
    """
    return f"{gateway_url.rstrip('/')}{ROLLOUT_PATH_PREFIX}{rollout_id}/v1"


class _RandomBits:
    """64-bit values from the OS CSPRNG (``os.urandom``), read 4 KiB at a time.

    Ids must not be predictable: a store answers an idempotent write with the record it holds, and a tenant that
    could rebuild a seeded generator from its own ids could name another tenant's next rollout (issue 36). One
    ``os.urandom`` call per id would release the interpreter lock on every span (a busy gateway waited up to a
    thread switch interval, 5 ms, to get it back), so 512 ids share one call. A forked child drops the parent's
    unread bytes, so parent and child never hand out the same id.
    """

    _CHUNK = 4096

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        # a new lock in a forked child too: one held by another thread at fork time would stay held there
        self._lock = threading.Lock()
        self._buf, self._pos = b"", 0

    def bits64(self) -> int:
        """A uniformly random integer in ``[0, 2**64)``."""
        with self._lock:
            if self._pos >= len(self._buf):
                self._buf, self._pos = os.urandom(self._CHUNK), 0
            pos = self._pos
            self._pos = pos + 8
            return int.from_bytes(self._buf[pos : pos + 8], "little")


_ids = _RandomBits()


def new_id(prefix: str) -> str:
    """Return a fresh unique id like ``ro-1f2e...`` (prefix + 16 hex chars: 64 bits from the OS CSPRNG).

    Ids are unpredictable (:class:`_RandomBits`): knowing any number of earlier ids tells nothing of the next.
    """
    return f"{prefix}-{_ids.bits64():016x}"


def new_ordered_id(prefix: str) -> str:
    """Return a fresh unique id that sorts by creation time, like ``sp-0193a4c5e2f1-1f2e...``.

    Prefix + 12 hex chars of the wall-clock millisecond + 16 hex chars (64 bits from the OS CSPRNG, as :func:`new_id`).
    Ids made close in time are close in a B-tree index, so a store inserting many of them touches the index's
    right edge instead of a random page per id (the trace store's unique span-id index dirtied its own 4 kB
    page for almost every span with random ids; the idea of ULID / UUIDv7, RFC 9562 §5.7).
    """
    return f"{prefix}-{int(time.time() * 1000):012x}{_ids.bits64():016x}"


def now() -> float:
    """Wall-clock time in seconds since the epoch (the unit of every timestamp here)."""
    return time.time()


class RolloutState(StrEnum):
    """Life cycle of a rollout; see the module docstring."""

    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    timed_out = "timed_out"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        """True for states no worker will move on from without a retry."""
        return self in (
            RolloutState.succeeded,
            RolloutState.failed,
            RolloutState.timed_out,
            RolloutState.cancelled,
        )


class AttemptState(StrEnum):
    """Life cycle of one attempt: ``running`` then exactly one terminal state."""

    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    timed_out = "timed_out"
    abandoned = "abandoned"  # the worker stopped heartbeating (killed); its spans are not counted


#: The one transition table for rollouts. Keys are current states, values the states they may move to.
ROLLOUT_TRANSITIONS: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.queued: frozenset({RolloutState.running, RolloutState.cancelled}),
    RolloutState.running: frozenset(
        {RolloutState.succeeded, RolloutState.failed, RolloutState.timed_out, RolloutState.queued}
    ),
    RolloutState.failed: frozenset({RolloutState.queued}),
    RolloutState.timed_out: frozenset({RolloutState.queued}),
    RolloutState.succeeded: frozenset(),
    RolloutState.cancelled: frozenset(),
}


def check_transition(current: RolloutState, target: RolloutState) -> None:
    """Raise if ``current → target`` is not an edge of :data:`ROLLOUT_TRANSITIONS`.

    Raises:
        InvalidTransitionError: naming both states and the allowed targets.
    """
    allowed = ROLLOUT_TRANSITIONS[RolloutState(current)]
    if RolloutState(target) not in allowed:
        names = ", ".join(sorted(s.value for s in allowed)) or "none (terminal state)"
        raise InvalidTransitionError(f"rollout cannot go from {current} to {target}; allowed: {names}")


#: A name or id that is text, not layout: no control characters (C0, DEL), so it prints on one line in a log,
#: a table or a page and cannot forge a line of its own.
_ONE_LINE = r"^[^\x00-\x1f\x7f]*$"


class Task(BaseModel):
    """One unit of work for an agent: an input payload plus metadata (dataset, split, gold answer).

    ``task_id``: 1-500 characters, no control characters (e.g. ``bitext/123``; it groups a task's rollouts
    and names it in reports). Raises ``pydantic.ValidationError`` otherwise (a 422 at the store API)."""

    task_id: str = Field(
        default_factory=lambda: new_id("task"), min_length=1, max_length=500, pattern=_ONE_LINE
    )
    input: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class Rollout(BaseModel):
    """One episode of an agent on a task.

    Attributes:
        resources: resource versions pinned to this rollout, e.g. ``{"policy": "policy@v3",
            "prompt:cs-system": "2"}``; the runner hands them to the agent and the gateway serves them.
        group_id: rollouts of the same task sampled together for GRPO share a group id.
        max_attempts: total tries (first run + retries) before the rollout stays failed.
        timeout_s: wall-clock limit per attempt, seconds.
        tenant: the customer of the app this rollout belongs to (``None``: no tenant); a tenant key sees and
            writes only its own rollouts (:mod:`agentforge.stores.tenants`).
        user_id / session_id: the person and the conversation this rollout holds data of, set by the
            application that knows them (its own login, its own session), once, when the rollout is enqueued.
            ``agentforge forget --user/--session`` deletes by these fields only, never by ``metadata`` or the
            task, which carry what clients wrote (:mod:`agentforge.stores.forget`). At most 200 characters.
        agent: the agent's name (workers claim by it): at most 200 characters, no control characters.
    """

    rollout_id: str = Field(default_factory=lambda: new_id("ro"))
    task: Task = Field(default_factory=Task)
    state: RolloutState = RolloutState.queued
    agent: str = Field(default="", max_length=200, pattern=_ONE_LINE)
    group_id: str | None = None
    resources: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    attempts: int = 0
    max_attempts: int = Field(default=3, ge=1)
    timeout_s: float = Field(default=600.0, gt=0)
    error: str | None = None
    created_at: float = Field(default_factory=now)
    updated_at: float = Field(default_factory=now)
    tenant: str | None = None
    user_id: str | None = Field(default=None, min_length=1, max_length=200)
    session_id: str | None = Field(default=None, min_length=1, max_length=200)


class Attempt(BaseModel):
    """One try at a rollout by one worker. ``heartbeat_at`` is refreshed while the worker is alive."""

    attempt_id: str = Field(default_factory=lambda: new_id("at"))
    rollout_id: str
    number: int = Field(ge=1)
    worker_id: str = ""
    state: AttemptState = AttemptState.running
    error: str | None = None
    started_at: float = Field(default_factory=now)
    heartbeat_at: float = Field(default_factory=now)
    ended_at: float | None = None


class SpanKind(StrEnum):
    """What a span records."""

    llm = "llm"
    tool = "tool"
    custom = "custom"


#: How a span ended.
SpanStatus = Literal["ok", "error"]


class ToolCall(BaseModel):
    """A tool call the model emitted, parsed from the engine's answer.

    Attributes:
        arguments: the raw argument string exactly as the engine sent it.
        parsed: the decoded JSON object, or ``None`` when ``arguments`` is not valid JSON.
        flags: e.g. ``"empty_arguments_normalised"``, ``"malformed_arguments"``.
    """

    id: str | None = None
    name: str = ""
    arguments: str = ""
    parsed: dict[str, Any] | None = None
    flags: list[str] = Field(default_factory=list)


class LLMCall(BaseModel):
    """The token-exact record of one LLM call, as the inference engine saw and sampled it.

    ``prompt_token_ids`` and ``completion_token_ids`` come from the engine (vLLM's
    ``return_token_ids``), never from re-tokenising text. ``logprobs[i]`` is the log-probability
    (natural log) of ``completion_token_ids[i]`` under the serving policy, so
    ``len(logprobs) == len(completion_token_ids)`` whenever ``trainable`` is true.

    Attributes:
        model: the model name the client asked for (e.g. the alias ``policy``).
        version: the resolved version that served the call (e.g. ``policy@v3``).
        trainable: false when ids/logprobs are missing or inconsistent; ``flags`` says why.
        request: the request body as the client sent it (messages, tools, sampling parameters).
        response_text: the assistant text returned.
        latency_s: seconds from receiving the request to the last byte of the answer.

    Its JSON keeps ``NaN`` and ``±Infinity`` as JSON's non-standard constants (``-Infinity`` is a real
    log-probability: a token the policy gives no chance), as Python's :mod:`json` does, instead of
    pydantic's default ``null``: a stored record reads back as it was written.
    """

    model_config = ConfigDict(ser_json_inf_nan="constants")

    model: str = ""
    version: str = ""
    endpoint: Literal["chat", "completions"] = "chat"
    stream: bool = False
    request: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, Any] = Field(default_factory=dict)
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    response_text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list[ToolCall])
    finish_reason: str | None = None
    usage: dict[str, Any] = Field(default_factory=dict)
    latency_s: float = 0.0
    trainable: bool = True
    flags: list[str] = Field(default_factory=list)


class Span(BaseModel):
    """One recorded operation inside a rollout (an LLM call, a tool call, or anything custom).

    A span whose ``rollout_id`` is ``None`` is an *orphan*: it reached the gateway without
    attribution. ``sequence`` orders spans and rewards of a rollout; the store assigns it on insert.
    ``tenant`` names the tenant the call was made for (the gateway sets it from the tenant's key).
    Its JSON keeps ``NaN``/``Infinity`` in ``attributes`` as constants, like :class:`LLMCall`'s.
    """

    model_config = ConfigDict(ser_json_inf_nan="constants")

    span_id: str = Field(default_factory=lambda: new_ordered_id("sp"))
    rollout_id: str | None = None
    attempt_id: str | None = None
    kind: SpanKind = SpanKind.custom
    name: str = ""
    status: SpanStatus = "ok"
    error: str | None = None
    llm: LLMCall | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    started_at: float = Field(default_factory=now)
    ended_at: float | None = None
    sequence: int | None = None
    tenant: str | None = None


#: ``Rollout.metadata`` key: the 0-based optimizer step that trained on the rollout (set after the update).
TRAINED_STEP = "trained_step"
#: ``Reward.metadata`` key: a ``final`` reward that arrived after a step trained on its rollout (stored non-final).
LATE_FINAL = "late_final"


class Reward(BaseModel):
    """A scalar reward for a rollout, emitted at any time (inside a node, at the end, hours later).

    Attachment rule (one rule everywhere): a reward belongs to its rollout; ``span_id`` is the span it
    follows — given explicitly, or else the latest span of the rollout recorded before the reward
    (``None`` if there is none). A rollout's training reward is its **last** reward by ``sequence``
    (a ``final`` reward wins over non-final ones regardless of order). ``value=None`` or NaN is kept,
    marked ``valid=False`` and never turned into a number. Once an optimizer step has trained on the rollout
    (``Rollout.metadata[TRAINED_STEP]``) its training reward is frozen: a later ``final`` reward is stored
    with ``final=False`` and ``metadata[LATE_FINAL] = True`` (listed, never the training reward).
    """

    reward_id: str = Field(default_factory=lambda: new_id("rw"))
    rollout_id: str
    attempt_id: str | None = None
    span_id: str | None = None
    name: str = "reward"
    value: float | None = None
    final: bool = False
    source: str = "agent"
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: float = Field(default_factory=now)
    sequence: int | None = None
    tenant: str | None = None

    @field_validator("value")
    @classmethod
    def _nan_to_none(cls, v: float | None) -> float | None:
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)

    @property
    def valid(self) -> bool:
        """Whether the value is a usable number."""
        return self.value is not None


#: What a versioned resource holds.
ResourceKind = Literal["prompt", "adapter", "other"]


class ResourceVersion(BaseModel):
    """A versioned resource: a prompt template, an adapter, or any JSON payload.

    ``name`` identifies the resource (e.g. ``prompt:cs-system`` or ``policy``); versions count up from
    1 per name. ``active`` marks the version served by default.

    Attributes:
        kind: ``"prompt"``, ``"adapter"`` or ``"other"``.
        payload: for prompts ``{"template": str}``; for adapters ``{"path": str, "base_model": str,
            "rank": int}``.
    """

    name: str
    version: int = Field(default=0, ge=0)
    kind: ResourceKind = "other"
    payload: dict[str, Any] = Field(default_factory=dict)
    active: bool = False
    created_at: float = Field(default_factory=now)

    @property
    def ref(self) -> str:
        """``name@vN``, the versioned name used by serving and the gateway (``str`` of :class:`Version`)."""
        return str(Version(self.name, self.version))


_VERSION_NUMBER = re.compile(
    r"(?:(?P<name>.+)@|(?P<lineage>[^@]+@[a-z0-9][a-z0-9_-]{0,62})/)?v?(?P<number>[0-9]{1,9})"
)


class _NotAVersion(UserError):
    """The value holds no version number at all (``parse_version_number(default=...)`` catches only this)."""


@dataclass(frozen=True, order=True)
class Version:
    """One version of a named resource: ``name`` plus an integer ``number``, spelled ``name@vN``.

    The one version type of records, pins, the CLI and the registry: :class:`ResourceVersion` holds its two
    parts (``ref`` is its ``str``), spans and rollout pins store its ``str`` (``"policy@v3"``), and
    :meth:`parse` reads every spelling a user or a record gives. Number 0 of an adapter alias is the base
    model (``policy@v0``).

    A tenant's own lineage of a resource is the resource ``name@tenant`` (:meth:`lineage`), spelled
    ``policy@acme/v3`` (``/`` instead of a second ``@``).

    Attributes:
        name: the resource, e.g. ``policy``, ``prompt:cs-system`` or the tenant lineage ``policy@acme``.
        number: the version number, ``0, 1, 2, …``.
    """

    name: str
    number: int

    def __str__(self) -> str:
        return f"{self.name}{'/' if '@' in self.name else '@'}v{self.number}"

    @staticmethod
    def lineage(name: str, tenant: str) -> str:
        """The resource holding ``tenant``'s own versions of ``name``: ``lineage("policy", "acme")`` is
        ``"policy@acme"`` (its versions: ``policy@acme/v1``, ...).

        Raises:
            UserError: ``tenant`` is not a tenant name (:func:`check_tenant`) or ``name`` already names one.
        """
        if "@" in name:
            raise UserError(f"resource {name!r} is already a tenant lineage; give the shared name")
        return f"{name}@{check_tenant(tenant)}"

    @property
    def tenant(self) -> str | None:
        """The tenant whose lineage this version belongs to (``policy@acme/v3`` → ``acme``), else ``None``."""
        return self.name.partition("@")[2] or None

    @classmethod
    def parse(cls, value: int | str | Version, name: str | None = None) -> Version:
        """Read a version: ``Version.parse("policy@v3")``, ``Version.parse("v3", name="policy")``.

        Args:
            value: ``3``, ``"3"``, ``"v3"``, ``"name@v3"`` or a :class:`Version` (ASCII digits, at most 9).
            name: the resource the version must belong to; required when ``value`` names none.

        Returns:
            The version, e.g. ``Version("policy", 3)``.

        Raises:
            UserError: ``value`` is not a version, is negative, names another resource than ``name``, or
                names none while ``name`` is ``None``.
        """
        found, number = _split_version(value, name)
        if found is None and name is None:
            raise UserError(f"version {value!r} names no resource; write it as name@v{number}")
        return cls(found or name or "", number)


def _split_version(value: int | str | Version, name: str | None) -> tuple[str | None, int]:
    """``(the name it spells or None, number)``: the one parser behind :class:`Version`.

    Raises:
        UserError: ``value`` is not a version (``_NotAVersion``), is negative, or names another resource.
    """
    if isinstance(value, Version):
        found, number = value.name, value.number
    elif isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise UserError(f"version {value} is negative; versions are 0, 1, 2, …")
        found, number = None, value
    elif (match := _VERSION_NUMBER.fullmatch(str(value).strip())) is None:
        raise _NotAVersion(f"{value!r} is not a version number; use e.g. 3, 'v3' or 'name@v3'")
    else:
        found, number = match.group("name") or match.group("lineage"), int(match.group("number"))
    if name is not None and found not in (None, name):
        raise UserError(f"version {value!r} names {found!r}, not {name!r}")
    return found, number


def tenant_of_name(value: str) -> str | None:
    """The tenant whose lineage a resource name or version names, else ``None`` (shared).

    ``"policy@acme"`` and ``"policy@acme/v3"`` → ``"acme"``; ``"policy"``, ``"policy@v3"`` and
    ``"prompt:cs-system"`` → ``None``. A pin, a requested model or a listed resource of another tenant than the
    caller's is refused by the gateway and the store API alike.
    """
    try:
        return Version.parse(value).tenant
    except UserError:
        return str(value).partition("@")[2] or None


def parse_version_number(
    value: int | str | Version, name: str | None = None, *, default: int | None = None
) -> int:
    """The number of a resource version: ``3``, ``"3"``, ``"v3"`` and ``"policy@v3"`` are all 3.

    Args:
        value: the version as typed or stored (any spelling :meth:`Version.parse` reads).
        name: when given, a ``"name@v3"`` spelling must name this resource.
        default: returned instead of raising when ``value`` holds no version number at all, e.g. ``0`` for
            the bare alias ``"policy"`` (the base model); a version of another resource still raises.

    Returns:
        The version number (``0`` is the base model for adapter aliases).

    Raises:
        UserError: ``value`` is not a version number (without ``default``), is negative, or names another
            resource.
    """
    try:
        return _split_version(value, name)[1]
    except _NotAVersion:
        if default is None:
            raise
        return default
