"""Model routing for the gateway: aliases (``policy``) → active versions (``policy@v3``) → upstreams.

Serving registers each loaded version with the upstream that serves it, then flips the alias; the
gateway resolves every request through here and counts in-flight requests per version so serving can
unload an old version only after its last request finished. A version flipped in before its canary's verdict is
on probation (:mod:`agentforge.gateway.probation`): the gateway holds its answers until the verdict.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentforge.errors import NotFoundError, ServingError
from agentforge.gateway.probation import Probation

__all__ = ["EngineChooser", "Upstream", "ModelRouter"]


@runtime_checkable
class EngineChooser(Protocol):
    """Several engines behind one version (:class:`agentforge.scale.pool.EnginePool`): picks one per call."""

    engines: list[Any]

    def route(self, upstream: Upstream, key: str | None, avoid: Collection[str] = ()) -> Upstream:
        """``upstream`` with the URL and key of the engine that serves this call (``key``: the rollout id),
        none of whose URLs is in ``avoid``."""
        ...

    def engines_out(self) -> dict[int, str]:
        """Engines that take no calls now: index in ``engines`` → why."""
        ...

    def each(self, upstream: Upstream) -> list[tuple[int, Upstream]]:
        """``(index, upstream on that engine)`` for every engine serving now (a swap's canary checks each)."""
        ...

    def at(self, upstream: Upstream, index: int) -> Upstream:
        """``upstream`` on engine ``index``, serving or not (a rejoining engine's canary)."""
        ...


@dataclass(frozen=True)
class Upstream:
    """Where a version is served.

    Attributes:
        base_url: OpenAI-compatible base URL of the engine, ending in ``/v1``.
        model: the model name the engine knows this version by (vLLM's LoRA name).
        api_key: sent as ``Authorization: Bearer`` when set (hosted APIs).
        token_ids: whether the engine returns token ids/logprobs (vLLM does; hosted APIs do not).
        logprobs_mode: what the engine's logprobs are (vLLM's ``--logprobs-mode``: ``raw_logprobs`` or
            ``processed_logprobs``; ``None``: not known); the gateway records it on each span.
        token_in: whether the engine renders chats on ``/tokenize`` and takes token-id prompts on
            ``/v1/completions`` (vLLM, the embedded backend): a rollout's follow-up chat calls are then sent
            as ids (:mod:`agentforge.gateway.prefix`), so one conversation stays one trajectory.
        pool: the engines that serve the version when there are several (``None``: ``base_url`` alone):
            :meth:`ModelRouter.acquire` asks it for one engine per call.
    """

    base_url: str
    model: str
    api_key: str | None = None
    token_ids: bool = True
    logprobs_mode: str | None = None
    token_in: bool = False
    pool: EngineChooser | None = field(default=None, compare=False, repr=False)


class ModelRouter:
    """Thread-safe alias/version table with per-version in-flight counters.

    ``resolve(name)`` accepts an alias (``policy``), a version (``policy@v3``) or a plain registered
    model name, and returns ``(version, upstream)``. Unknown names raise ``NotFoundError``.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._versions: dict[str, Upstream] = {}
        self._aliases: dict[str, str] = {}
        self._inflight: dict[str, int] = {}
        self._down: dict[str, str] = {}  # engine base URL → why it is down (set by serving's supervisor)
        self._canaries: dict[str, tuple[str, float]] = {}  # alias → (candidate version, share of rollouts)
        self._probation: dict[str, Probation] = {}  # version → the verdict its answers wait for
        self._awaited: dict[str, int] = {}  # version → threads in wait_for_call (acquire then notifies)

    def register(self, version: str, upstream: Upstream) -> None:
        """Make ``version`` routable (does not change any alias)."""
        with self._lock:
            self._versions[version] = upstream
            self._inflight.setdefault(version, 0)

    def set_alias(self, alias: str, version: str) -> str | None:
        """Point ``alias`` at ``version``; returns the version it pointed at before (or ``None``).

        Raises: ``NotFoundError`` if ``version`` is not registered.
        """
        with self._lock:
            if version not in self._versions:
                raise NotFoundError(f"cannot point alias {alias!r} at unregistered version {version!r}")
            old = self._aliases.get(alias)
            self._aliases[alias] = version
            self._lock.notify_all()  # wake wait_alias
            return old

    def wait_alias(self, alias: str, away_from: str | None, timeout_s: float | None = None) -> str | None:
        """Block until ``alias`` points at a version other than ``away_from`` (at once if it does already).

        Args:
            alias: the alias to watch.
            away_from: the version it pointed at (``None``: it pointed nowhere).
            timeout_s: seconds to wait at most (``None``: no limit).

        Returns:
            The version it points at now, or ``None`` if it did not move within ``timeout_s``.
        """
        with self._lock:
            moved = self._lock.wait_for(lambda: self._aliases.get(alias) != away_from, timeout_s)
            return self._aliases.get(alias) if moved else None

    def start_probation(self, version: str, fallback: str) -> Probation:
        """Hold ``version``'s answers until :meth:`end_probation` (call before the version takes requests).

        Args:
            version: the version whose canary has not passed yet.
            fallback: the version its calls go to if it fails (the alias target before the swap).

        Returns:
            The :class:`~agentforge.gateway.probation.Probation` the gateway's held answers wait on.
        """
        with self._lock:
            probation = self._probation[version] = Probation(version, fallback)
            return probation

    def probation(self, version: str) -> Probation | None:
        """The probation ``version``'s answers must wait for, or ``None`` (the usual case: no lock taken)."""
        return self._probation.get(version)

    def end_probation(self, version: str, passed: bool) -> None:
        """Give ``version``'s verdict. Passed: its held answers go out. Failed: every alias pointing at it points
        at the fallback again, then the held answers are refused (the gateway sends them to the fallback); the
        probation stays until the version is drained, so an answer arriving later is refused too. No-op for a
        version not on probation."""
        with self._lock:
            probation = self._probation.get(version)
            if probation is None:
                return
            if passed:
                del self._probation[version]
            else:
                for alias, target in self._aliases.items():
                    if target == version:
                        self._aliases[alias] = probation.fallback
                self._lock.notify_all()
        probation.decide(passed)

    def set_canary(self, alias: str, version: str, share: float) -> None:
        """Serve ``share`` (in (0, 1)) of the rollouts that ask for ``alias`` with ``version`` instead, sticky
        by rollout id (see :meth:`canary_target`); requests outside a rollout keep the alias target.

        Raises: ``NotFoundError`` if ``version`` is not registered; ``ValueError`` for a share outside (0, 1).
        """
        if not 0.0 < share < 1.0:
            raise ValueError(f"canary share {share} must be in (0, 1)")
        with self._lock:
            if version not in self._versions:
                raise NotFoundError(f"cannot canary unregistered version {version!r} behind {alias!r}")
            self._canaries[alias] = (version, share)

    def clear_canary(self, alias: str) -> None:
        """Stop the canary behind ``alias`` (every rollout gets the alias target again); no-op without one."""
        with self._lock:
            self._canaries.pop(alias, None)

    def canary_target(self, alias: str, rollout_id: str) -> str | None:
        """The canary version for this rollout, or ``None`` (no canary behind ``alias``, or the rollout falls
        outside its share). The choice is ``crc32(rollout_id) / 2**32 < share``: the same for every call of a
        rollout (sticky) and uniform over random ids. Lock-free: one dict read (``set_canary``/``clear_canary``
        replace the entry whole, under the lock), so the gateway's per-call lookups never wait for the lock."""
        canary = self._canaries.get(alias)
        if canary is None or zlib.crc32(rollout_id.encode()) / 2**32 >= canary[1]:
            return None
        return canary[0]

    def alias(self, alias: str) -> str | None:
        """The version an alias points at, or ``None``."""
        with self._lock:
            return self._aliases.get(alias)

    def resolve(self, name: str) -> tuple[str, Upstream]:
        """Return ``(version, upstream)`` for an alias or version name. Raises: ``NotFoundError``."""
        with self._lock:
            version = self._aliases.get(name, name)
            if version not in self._versions:
                known = sorted(set(self._aliases) | set(self._versions))
                raise NotFoundError(f"model {name!r} does not exist; available: {', '.join(known) or 'none'}")
            return version, self._versions[version]

    def mark_engine(self, base_url: str, down: str | None) -> None:
        """Record that the engine at ``base_url`` is down (``down``: why, without its address) or up again
        (``None``); the gateway's ``/health`` reports the versions it serves while it is down."""
        with self._lock:
            if down is None:
                self._down.pop(base_url, None)
            else:
                self._down[base_url] = down

    def has_other_engine(self, version: str, avoid: Collection[str]) -> bool:
        """Whether ``version`` is served by a pool with an engine serving now whose URL is not in ``avoid``."""
        with self._lock:
            upstream = self._versions.get(version)
        if upstream is None or upstream.pool is None:
            return False
        return any(u.base_url not in avoid for _, u in upstream.pool.each(upstream))

    def engines_down(self) -> dict[str, str]:
        """Registered version → why its engine is down, for every version whose engine is marked down or
        whose engine pool has no engine serving (the first half of :meth:`engine_health`)."""
        return self.engine_health()[0]

    def engine_health(self) -> tuple[dict[str, str], dict[str, dict[int, str]]]:
        """``(down, partial)`` for the gateway's ``/health``: ``down`` as :meth:`engines_down`; ``partial``:
        version → {pool index: why} for every pooled version with an engine out while another serves. Each
        pool is asked once (the base and every adapter version of a pool share it)."""
        with self._lock:
            versions = sorted(self._versions.items())
            down = {v: self._down[u.base_url] for v, u in versions if u.base_url in self._down}
        partial: dict[str, dict[int, str]] = {}
        asked: dict[int, dict[int, str]] = {}
        for v, u in versions:
            if u.pool is None:
                continue
            if id(u.pool) not in asked:
                asked[id(u.pool)] = u.pool.engines_out()
            out = asked[id(u.pool)]
            if len(out) == len(u.pool.engines):
                down[v] = "no engine of its pool serves: " + "; ".join(out.values())
            elif out:
                partial[v] = out
        return down, partial

    def models(self) -> list[str]:
        """Every alias and version name the gateway can serve."""
        with self._lock:
            return sorted(set(self._aliases) | set(self._versions))

    def acquire(self, name: str, key: str | None = None, avoid: Collection[str] = ()) -> tuple[str, Upstream]:
        """``resolve`` and count one in-flight request on the resolved version (pair with ``release``).

        Args:
            name: an alias or version name.
            key: the rollout id of the call: a version served by an engine pool (``Upstream.pool``) sends all
                calls of one key to one engine.
            avoid: engine URLs of the version's pool not to choose (they refused this call's connection).

        Raises:
            NotFoundError: unknown name. ServingError: the version's pool has no engine serving (not counted).
        """
        with self._lock:
            version, upstream = self.resolve(name)
            if upstream.pool is not None:
                upstream = upstream.pool.route(upstream, key, avoid)
            self._inflight[version] = self._inflight.get(version, 0) + 1
            if self._awaited and version in self._awaited:  # a swap's canary waits for this call
                self._lock.notify_all()
            return version, upstream

    def release(self, version: str) -> None:
        """End one in-flight request on ``version``."""
        with self._lock:
            self._inflight[version] = max(0, self._inflight.get(version, 0) - 1)
            self._lock.notify_all()

    def wait_for_call(self, version: str, timeout_s: float) -> bool:
        """Block until a request is in flight on ``version`` (:meth:`acquire` counted one), at once if one is.

        Args:
            version: the version to watch.
            timeout_s: seconds to wait at most.

        Returns:
            Whether a request is in flight on it (False on timeout).
        """
        with self._lock:
            self._awaited[version] = self._awaited.get(version, 0) + 1
            try:
                return self._lock.wait_for(lambda: self._inflight.get(version, 0) > 0, timeout_s)
            finally:
                self._awaited[version] -= 1
                if not self._awaited[version]:
                    del self._awaited[version]

    def inflight(self, version: str) -> int:
        """Requests currently in flight on ``version``."""
        with self._lock:
            return self._inflight.get(version, 0)

    def drain(self, version: str, timeout_s: float = 60.0) -> None:
        """Block until no request is in flight on ``version``, then unregister it.

        Raises:
            ServingError: if an alias still points at it, or requests remain after ``timeout_s`` seconds.
        """
        deadline = time.monotonic() + timeout_s
        with self._lock:
            if version in self._aliases.values():
                raise ServingError(f"cannot drain {version!r}: an alias still points at it")
            while self._inflight.get(version, 0) > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ServingError(
                        f"{self._inflight[version]} requests still in flight on {version!r} after {timeout_s}s"
                    )
                self._lock.wait(left)
            self._versions.pop(version, None)
            self._inflight.pop(version, None)
            self._probation.pop(version, None)
