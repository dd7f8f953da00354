"""Prompt templates as versioned resources in the trace store: publish, read, pin, roll back.

A prompt is a :class:`~agentforge.types.ResourceVersion` of kind ``"prompt"`` whose payload is
``{"template": str}`` (plus ``"metadata"`` when given). Versions count up from 1 per name; one version is
*active* (what a rollout gets when it pins none). Agents read their prompt at the start of every rollout
(``ctx.prompt(name, default)``, see :meth:`agentforge.runtime.RolloutContext.prompt`), so publishing a new
version changes the next rollouts with nothing restarted, and a rollout records the version it used in
``Rollout.resources[name]``, so traces can be filtered by prompt version (:func:`rollouts_with_prompt`)::

    v2 = publish_prompt(store, "prompt:triage", "Category options: ...")   # the next rollouts use v2
    rollback_prompt(store, "prompt:triage", 1)                              # one call back to v1
    enqueue_tasks(store, tasks, resources={"prompt:triage": "2"})          # pin v2 for these rollouts
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agentforge.errors import NotFoundError, UserError
from agentforge.types import ResourceVersion, parse_version_number

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.types import Rollout, RolloutState

__all__ = [
    "publish_prompt",
    "get_prompt",
    "rollback_prompt",
    "list_prompts",
    "rollouts_with_prompt",
    "start_prompt_canary",
    "end_prompt_canary",
    "canary_prompt_version",
]

#: The traffic canary of prompt ``name`` is the active version of the resource ``f"{CANARY_PREFIX}{name}"``.
CANARY_PREFIX = "canary:"


def publish_prompt(
    store: TraceStore,
    name: str,
    template: str,
    activate: bool = True,
    metadata: Mapping[str, Any] | None = None,
) -> ResourceVersion:
    """Store ``template`` as the next version of prompt ``name``.

    Args:
        store: the trace store.
        name: the resource name, e.g. ``prompt:triage``.
        template: the prompt text.
        activate: make it the active version (the next unpinned rollouts use it). ``False`` stores it for
            rollouts that pin it (e.g. a prompt optimiser's candidates) without changing live traffic.
        metadata: JSON-serialisable provenance stored in ``payload["metadata"]`` (e.g. optimiser scores).

    Returns:
        The stored version (``version`` assigned by the store).

    Raises:
        UserError: ``template`` is not a string.
    """
    if not isinstance(template, str):
        raise UserError(f"publish_prompt({name!r}): template must be a str, got {type(template).__name__}")
    payload: dict[str, Any] = {"template": template}
    if metadata:
        payload["metadata"] = dict(metadata)
    return store.publish_resource(
        ResourceVersion(name=name, kind="prompt", payload=payload), activate=activate
    )


def get_prompt(
    store: TraceStore,
    name: str,
    version: int | str | None = None,
    default: str | None = None,
    rollout_id: str | None = None,
) -> ResourceVersion:
    """Read a prompt version: the pinned ``version``, else the canary's for this rollout, else the active one.

    When the store has no version of ``name`` at all and ``default`` is given, ``default`` is published
    (and activated) as version 1 first. Writers racing to do so may each publish an inactive copy; every one
    of them then activates and returns the *lowest* version holding the default text (always the first copy
    committed), so every reader sees and records that one version; the extra copies stay inactive.

    Args:
        store: the trace store (or a runner's ``ctx.store``).
        name: the resource name.
        version: a pinned version (``Rollout.resources[name]``: ``"2"``, ``2``, ``"v2"`` or ``"name@v2"``);
            ``None``: the active version.
        default: the template to publish as version 1 when ``name`` is absent.
        rollout_id: the rollout that reads it; while a traffic canary runs for ``name``
            (:func:`start_prompt_canary`), an unpinned rollout in its share gets the canary's version.

    Returns:
        The resource; the text is ``payload["template"]``.

    Raises:
        NotFoundError: the pinned ``version`` does not exist, or ``name`` is absent and there is no
            ``default`` (the message lists the versions that exist).
        UserError: ``version`` is not a version number.
    """
    if version is None and rollout_id is not None:
        version = canary_prompt_version(store, name, rollout_id)
    if version is not None:
        number = parse_version_number(version, name=name)
        try:
            return store.get_resource(name, number)
        except NotFoundError:
            have = [r.version for r in store.list_resources(name)]
            raise NotFoundError(
                f"prompt {name!r} has no version {number} (versions: {have or 'none'}); "
                f"publish it with publish_prompt or pin an existing version"
            ) from None
    try:
        return store.get_resource(name)
    except NotFoundError:
        if default is None:
            raise NotFoundError(
                f"prompt {name!r} has no active version; publish one with publish_prompt(store, {name!r}, "
                "template) or pass default="
            ) from None
        publish_prompt(store, name, default, activate=False, metadata={"source": "default"})
        first = min(
            (r for r in store.list_resources(name) if r.payload.get("template") == default),
            key=lambda r: r.version,
        )
        return first if first.active else store.activate_resource(name, first.version)


def start_prompt_canary(store: TraceStore, name: str, version: int, share: float) -> None:
    """Let ``share`` (in (0, 1)) of the unpinned rollouts that read prompt ``name`` use ``version`` instead of
    the active one, sticky by rollout id (``crc32(rollout_id) / 2**32 < share``, as the model router's canary).

    Stored as the active version of ``canary:{name}``, so every runner on the store sees it at its next read.

    Raises:
        UserError: ``share`` outside (0, 1). NotFoundError: ``version`` does not exist.
    """
    if not 0.0 < share < 1.0:
        raise UserError(f"canary share {share} must be in (0, 1)")
    store.get_resource(name, version)
    record = ResourceVersion(
        name=CANARY_PREFIX + name, kind="other", payload={"version": version, "share": share}
    )
    store.publish_resource(record, activate=True)


def end_prompt_canary(store: TraceStore, name: str) -> None:
    """End the traffic canary of prompt ``name``: every unpinned rollout reads the active version again."""
    store.publish_resource(
        ResourceVersion(name=CANARY_PREFIX + name, kind="other", payload={"version": None})
    )


def canary_prompt_version(store: TraceStore, name: str, rollout_id: str) -> int | None:
    """The canary's version of prompt ``name`` for this rollout, or ``None`` (no canary, or outside its share)."""
    try:
        canary = store.get_resource(CANARY_PREFIX + name).payload
    except NotFoundError:
        return None
    if canary.get("version") is None or zlib.crc32(rollout_id.encode()) / 2**32 >= canary.get("share", 0.0):
        return None
    return int(canary["version"])


def rollback_prompt(store: TraceStore, name: str, version: int | str) -> ResourceVersion:
    """Make an earlier (or any) version the active one again; the next unpinned rollouts use it.

    Returns:
        The now-active version.

    Raises:
        NotFoundError: ``name`` has no such version.
    """
    number = parse_version_number(version, name=name)
    try:
        return store.activate_resource(name, number)
    except NotFoundError:
        have = [r.version for r in store.list_resources(name)]
        raise NotFoundError(
            f"cannot roll back prompt {name!r} to version {number}: versions are {have or 'none'}"
        ) from None


def list_prompts(store: TraceStore, name: str | None = None) -> list[ResourceVersion]:
    """Every prompt version (of ``name``, or of all prompts), by name then version."""
    return [r for r in store.list_resources(name) if r.kind == "prompt"]


def rollouts_with_prompt(
    store: TraceStore,
    name: str,
    version: int | str,
    *,
    state: RolloutState | None = None,
    agent: str | None = None,
    since: float | None = None,
) -> list[Rollout]:
    """The rollouts that ran with ``version`` of prompt ``name`` (recorded in ``Rollout.resources``).

    Args:
        store: the trace store.
        name: the prompt's resource name.
        version: the version (any form :func:`agentforge.types.parse_version_number` reads).
        state, agent, since: filters passed to ``store.list_rollouts``.

    Returns:
        Matching rollouts, oldest first.
    """
    number = parse_version_number(version, name=name)
    out = []
    for rollout in store.list_rollouts(state=state, agent=agent, since=since):
        try:
            used = parse_version_number(rollout.resources.get(name, ""))
        except UserError:  # no version of this prompt recorded
            continue
        if used == number:
            out.append(rollout)
    return out
