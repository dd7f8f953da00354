"""Many tenants' adapters on one engine: loaded on demand, least recently used unloaded first, never mid-request.

Each tenant may own a lineage of the policy (``policy@acme``, versions ``policy@acme/vN``, published like any
resource; :meth:`agentforge.types.Version.lineage`). :class:`TenantAdapters` is the gateway's
:class:`~agentforge.gateway.tenancy.TenantModels`: for a call of tenant ``acme`` asking for ``policy`` it finds the
lineage's active version in the store, and

* if that version is loaded, counts the call in flight on it (a dictionary lookup under a lock: the warm path);
* else (a **cold start**) loads it into the engine and registers it in the router while the call waits; the call is
  served by its tenant's version or fails, never by another tenant's adapter (no alias is shared between tenants);
* before a load, when ``max_loaded`` tenant versions are loaded, unloads the least recently used idle one, else
  the least recently used one once its in-flight calls have finished: it leaves the loaded set first (under the
  lock every tenant call takes), so no new call starts on it and busy tenants cannot keep a cold one waiting for
  ever; a version is never unloaded while a call runs on it (the load fails after ``slot_wait_s``);
* a tenant without a lineage gets the shared alias (``policy``), which this class never loads or unloads.

Loads are one at a time (vLLM loads adapters one after another anyway). Unloading a version and loading the same
version again later reuses its name: its weights are the same, so vLLM's prefix cache stays right (DESIGN fact 2
forbids reusing a name for *other* weights); so a version an eviction failed to unload is out of service, and its
next load keeps what the engine still holds (:mod:`agentforge.serving.engine_names`). After the engine restarts
:meth:`TenantAdapters.engine_lost` forgets what was loaded: each tenant's next call loads its own version into the
new engine. Counts and cold-start latencies are in :meth:`TenantAdapters.metrics`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING

from agentforge.errors import ConfigError, NotFoundError, ServingError, UserError
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.serving.engine_names import load_or_reuse, unload_if_held
from agentforge.types import Version, tenant_of_name

if TYPE_CHECKING:
    from agentforge.ports import PolicyServer, TraceStore

__all__ = ["TenantAdapters"]

log = logging.getLogger(__name__)


class TenantAdapters:
    """Loads each tenant's live adapter version into ``server`` on demand (see the module docstring).

    Args:
        server: the engine (started), with ``load_adapter``/``unload_adapter``.
        router: the gateway's router (the shared ``alias`` is registered there by serving as usual).
        store: where each lineage's versions are published (``get_resource``).
        alias: the shared alias; a tenant's lineage is ``{alias}@{tenant}``.
        max_loaded: most tenant versions loaded at once; default: the engine's adapter capacity
            (``--max-cpu-loras``, else ``--max-loras``) minus the shared policy's slots: ``shared_retain + 2``
            (the versions its hot-swapper keeps behind the active one, plus old + new during a swap).
        shared_retain: the shared hot-swapper's ``retain`` (:class:`~agentforge.serving.hotswap.HotSwapper`);
            these versions stay loaded, so they count against the capacity whether ``max_loaded`` is given or not.
        refresh_s: seconds a lineage's active version is reused before the store is asked again (a newly
            activated version serves after at most this long).
        slot_wait_s: seconds a cold start waits for the calls in flight on the version it unloads before it fails.

    Raises:
        ConfigError: ``max_loaded`` is below 1 or above the engine's adapter capacity.
    """

    def __init__(
        self,
        server: PolicyServer,
        router: ModelRouter,
        store: TraceStore,
        alias: str = "policy",
        *,
        max_loaded: int | None = None,
        shared_retain: int = 0,
        refresh_s: float = 2.0,
        slot_wait_s: float = 30.0,
    ) -> None:
        self.server, self.router, self.store, self.alias = server, router, store, alias
        capacity: int | None = getattr(server, "max_cpu_loras", None) or getattr(server, "max_loras", None)
        if shared_retain < 0:
            raise ConfigError(
                f"shared_retain={shared_retain}: the shared swapper keeps 0 or more earlier versions"
            )
        room = None if capacity is None else capacity - shared_retain  # the retained versions stay loaded
        if max_loaded is None:
            if capacity is None:
                raise ConfigError("the engine does not say how many adapters it holds; pass max_loaded")
            max_loaded = capacity - 2 - shared_retain
        if max_loaded < 1 or (room is not None and max_loaded > room):
            raise ConfigError(
                f"max_loaded={max_loaded} tenant adapters must be in [1, {room}] (the engine's --max-cpu-loras, "
                f"else --max-loras, {capacity}, less the {shared_retain} versions the shared swapper retains); start the "
                "engine with a larger --max-cpu-loras"
            )
        self.max_loaded, self.refresh_s, self.slot_wait_s = max_loaded, refresh_s, slot_wait_s
        self._lock = threading.Lock()  # the loaded set and the counters; held only for dictionary work
        self._load_lock = threading.Lock()  # one load (and its evictions) at a time
        self._loaded: OrderedDict[str, str] = OrderedDict()  # version → tenant, least recently used first
        # lineage → (read at, (version, path) or None); pinned version → adapter path (published: never changes)
        self._live: dict[str, tuple[float, tuple[str, str] | None]] = {}
        self._paths: dict[str, str] = {}
        # lineage → refresh() calls so far: a store read that straddles one is read again, not cached
        self._moves: dict[str, int] = {}
        self.loads = self.evictions = self.cold_starts = self.hits = 0
        self.cold_start_s: list[float] = []  # seconds each cold start's call waited for its load

    # --- what a call gets ---------------------------------------------------------------------------
    def acquire(self, tenant: str, model: str) -> tuple[str, Upstream]:
        """See :meth:`~agentforge.gateway.tenancy.TenantModels.acquire`.

        ``model`` is the shared alias or the tenant's lineage alias (→ the lineage's active version, else the
        shared alias), a version of the tenant's lineage (→ that version), or anything else (→ the router). A
        lineage version whose payload marks the base model (``agentforge rollback policy 0 --tenant T``
        publishes one) is served by the shared alias: the tenant is back on the shared policy.

        Raises:
            NotFoundError: the version is not published, or nothing serves ``model``.
            ServingError: the load failed, or the version to unload still had calls after ``slot_wait_s``.
        """
        found = self._version(tenant, model)
        # not the tenant's, no lineage yet, or a version that is the base (a rollback to v0)
        if found is None:
            shared = model == Version.lineage(self.alias, tenant) or self._paths.get(model) == ""
            return self.router.acquire(self.alias if shared else model)
        name, path = found
        with self._lock:
            if name in self._loaded:
                self._loaded.move_to_end(name)
                self.hits += 1
                return self.router.acquire(name)
        return self._load(tenant, name, path, cold=True)

    def preload(self, tenant: str, model: str | None = None) -> str | None:
        """Load ``tenant``'s active version (or ``model``: a version of its lineage, e.g. a candidate the promotion
        gate puts on a canary) ahead of its first call; counted as a load, not a cold start.

        Returns:
            The version, or ``None`` when the tenant has no lineage (or ``model`` is a version marking the base).

        Raises:
            NotFoundError: ``model`` is not a published version of the tenant's lineage.
            AdapterIncompatibleError, ServingError: the engine refused it, or no slot went idle in ``slot_wait_s``.
        """
        if model is not None and tenant_of_name(model) != tenant:
            raise NotFoundError(f"{model!r} is not a version of tenant {tenant!r}'s lineage")
        found = self._version(tenant, model or self.alias)
        if found is None:
            return None
        with self._lock:
            if found[0] in self._loaded:
                self._loaded.move_to_end(found[0])  # used now: the last to be evicted
                return found[0]
        version, _ = self._load(tenant, *found, cold=False)
        self.router.release(version)
        return version

    def _version(self, tenant: str, model: str) -> tuple[str, str] | None:
        """``(version, adapter path)`` a call of ``tenant`` for ``model`` needs, or ``None`` (not the tenant's)."""
        lineage = Version.lineage(self.alias, tenant)
        if model in (self.alias, lineage):
            return self._active(lineage)
        if tenant_of_name(model) != tenant:
            return None
        version = Version.parse(model)
        if version.name != lineage:
            return None
        name = str(version)
        if name not in self._paths:
            payload = self.store.get_resource(lineage, version.number).payload
            self._paths[name] = "" if payload.get("base") else self._path(payload, model)
        return (name, self._paths[name]) if self._paths[name] else None

    def acquire_cached(self, tenant: str, model: str) -> tuple[str, Upstream] | None:
        """:meth:`acquire` when it needs neither a store read nor a load (the warm path, called on the gateway's
        event loop), else ``None`` (then call :meth:`acquire` in a worker thread).

        Raises:
            NotFoundError: as :meth:`acquire`.
        """
        lineage = Version.lineage(self.alias, tenant)
        if model in (self.alias, lineage):
            hit = self._live.get(lineage)
            if hit is None or time.monotonic() - hit[0] >= self.refresh_s:
                return None
            if hit[1] is None:
                return self.router.acquire(self.alias)
            name = hit[1][0]
        elif tenant_of_name(model) != tenant:
            return self.router.acquire(model)
        else:
            name = str(Version.parse(model))
        with self._lock:
            if name not in self._loaded:
                return None
            self._loaded.move_to_end(name)
            self.hits += 1
            return self.router.acquire(name)

    def serves_own(self, tenant: str, model: str) -> bool:
        """See :meth:`~agentforge.gateway.tenancy.TenantModels.serves_own`: ``model`` is the shared alias or the
        tenant's lineage alias and the lineage's active version is an adapter (not one marking the base). Reads
        the store only when the tenant's active version is not cached at all (a stale cached one is used).

        Raises:
            UserError: the active version names no adapter directory.
        """
        lineage = Version.lineage(self.alias, tenant)
        if model not in (self.alias, lineage):
            return False
        hit = self._live.get(lineage)
        return (hit[1] if hit is not None else self._active(lineage)) is not None

    def _active(self, lineage: str) -> tuple[str, str] | None:
        now = time.monotonic()
        hit = self._live.get(lineage)
        if hit is not None and now - hit[0] < self.refresh_s:
            return hit[1]
        while True:
            moves = self._moves.get(lineage, 0)
            try:
                resource = self.store.get_resource(lineage)
                found: tuple[str, str] | None = (
                    None
                    if resource.payload.get("base")
                    else (resource.ref, self._path(resource.payload, resource.ref))
                )  # a rollback to v0 activates a version marking the base: the shared policy serves again
            except NotFoundError:
                found = None
            with self._lock:  # a move (refresh) during the read may have made it stale: read again
                if self._moves.get(lineage, 0) == moves:
                    self._live[lineage] = (now, found)
                    return found

    @staticmethod
    def _path(payload: dict[str, object], version: str) -> str:
        path = payload.get("path")
        if not isinstance(path, str) or not path:
            raise UserError(f"{version} names no adapter directory (payload['path']); publish it with one")
        return path

    # --- loading and unloading ------------------------------------------------------------------------
    def _load(self, tenant: str, name: str, path: str, *, cold: bool) -> tuple[str, Upstream]:
        t0 = time.monotonic()
        with self._load_lock:
            with self._lock:  # another call of this tenant may have loaded it while this one waited
                if name in self._loaded:
                    self._loaded.move_to_end(name)
                    if cold:
                        self.cold_starts += 1
                        self.cold_start_s.append(time.monotonic() - t0)
                    return self.router.acquire(name)
            self._make_room(name)
            load_or_reuse(self.server, name, path)  # an engine still holding it (a failed unload) keeps it
            self.router.register(name, self._upstream(name))
            with self._lock:
                self._loaded[name] = tenant
                self.loads += 1
                if cold:
                    self.cold_starts += 1
                    self.cold_start_s.append(time.monotonic() - t0)
                acquired = self.router.acquire(name)
        log.info("loaded %s for tenant %s (%.3f s)", name, tenant, time.monotonic() - t0)
        return acquired

    def _make_room(self, name: str) -> None:
        """Unload one version if none more fits (holding the load lock): the least recently used idle one, else the
        least recently used one once its in-flight calls finish. Taking it out of the loaded set first stops new
        calls on it (every tenant call takes this lock; its tenant's next call waits for a reload), so busy tenants
        cannot keep a cold one waiting for ever. An unload the engine fails is logged and the load goes ahead.

        Raises:
            ServingError: the chosen version still had calls in flight after ``slot_wait_s`` (it stays loaded).
        """
        with self._lock:
            if len(self._loaded) < self.max_loaded:
                return
            victim = next((v for v in self._loaded if self.router.inflight(v) == 0), next(iter(self._loaded)))
            owner = self._loaded.pop(victim)
        try:
            self._drain(victim, owner)
        except ServingError as exc:
            raise ServingError(
                f"{victim} (least recently used of {self.max_loaded} loaded tenant adapters) still had calls in "
                f"flight after {self.slot_wait_s}s; {name} was not loaded. Raise max_loaded (and --max-cpu-loras)"
            ) from exc
        try:
            unload_if_held(self.server, victim)
        except ServingError as exc:  # out of service all the same; a later load of it reuses what it holds
            log.warning("unloading %s failed (%s); loading %s all the same", victim, exc, name)
        with self._lock:
            self.evictions += 1
        log.info("unloaded %s (least recently used) to load %s", victim, name)

    def _drain(self, version: str, owner: str) -> None:
        """Wait until ``version``, already out of the loaded set, has no call in flight (none start: a call for it
        finds it out of the set and waits for the load lock, which the caller holds), then take it out of the
        router; after ``slot_wait_s`` it goes back into the set, least recently used.

        Raises:
            ServingError: calls were still in flight after ``slot_wait_s`` (it stays loaded).
        """
        try:
            self.router.drain(version, timeout_s=self.slot_wait_s)
        except ServingError:
            with self._lock:
                self._loaded[version] = owner
                self._loaded.move_to_end(version, last=False)
            raise

    def unload(self, version: str) -> None:
        """Unload a tenant version now (a candidate the promotion gate refused), once its in-flight calls finished;
        a no-op when it is not loaded. A call that asks for it later loads it again (it is published).

        Raises:
            ServingError: calls were still in flight on it after ``slot_wait_s`` (it stays loaded), or the engine
                failed to unload it (out of service all the same; a later load reuses what the engine holds).
        """
        with self._load_lock:
            with self._lock:
                owner = self._loaded.pop(version, None)
            if owner is not None:
                self._drain(version, owner)
                unload_if_held(self.server, version)
                log.info("unloaded %s of tenant %s", version, owner)

    def engine_lost(self) -> list[str]:
        """Forget every loaded tenant version: the engine died and its restart will hold none of them (under
        ``agentforge serve`` the :class:`~agentforge.serving.supervise.EngineSupervisor` calls this between the
        stop and the start). Each tenant's next call then cold-starts its own version on the new engine, under
        the engine's new URL and key; a load under way finishes first. A version with calls still in flight (on
        the dead engine) stays in the router until its next load registers it again.

        Returns:
            The versions forgotten, least recently used first.
        """
        with self._load_lock, self._lock:
            lost, self._loaded = list(self._loaded), OrderedDict()
            for name in lost:
                try:
                    self.router.drain(name, timeout_s=0.0)  # no call can start on it: it left the set
                except ServingError:
                    pass  # calls on the dead engine still finishing: its next load registers it again
        if lost:
            log.warning("the engine went down: tenant versions %s load again on demand", ", ".join(lost))
        return lost

    def refresh(self, tenant: str) -> None:
        """Forget ``tenant``'s cached active version: its next call reads the store (a promotion or rollback
        serves at once instead of after up to ``refresh_s``); a call whose store read was under way meanwhile reads
        again rather than cache what it read before the move."""
        lineage = Version.lineage(self.alias, tenant)
        with self._lock:
            self._moves[lineage] = self._moves.get(lineage, 0) + 1
            self._live.pop(lineage, None)

    def _upstream(self, model: str) -> Upstream:
        return Upstream(
            base_url=self.server.base_url,
            model=model,
            api_key=getattr(self.server, "api_key", None),
            token_in=True,
            logprobs_mode=getattr(self.server, "logprobs_mode", None),
        )

    def loaded(self) -> list[str]:
        """The tenant versions loaded now, least recently used first."""
        with self._lock:
            return list(self._loaded)

    def close(self) -> None:
        """Unload every tenant version that has no request in flight (the engine keeps serving the rest)."""
        with self._load_lock:
            for name in self.loaded():
                with self._lock:
                    if self.router.inflight(name):
                        continue
                    self.router.drain(name, timeout_s=0.0)
                    del self._loaded[name]
                try:
                    self.server.unload_adapter(name)
                except (NotFoundError, ServingError) as exc:
                    log.warning("could not unload %s: %s", name, exc)

    def metrics(self) -> dict[str, float]:
        """``tenants/loads``, ``/evictions``, ``/cold_starts``, ``/hits`` (counts since start), ``/loaded`` (now),
        ``/cold_start_s_mean`` and ``/cold_start_s_max`` (seconds a cold call waited for its load; NaN: none)."""
        with self._lock:
            waits = list(self.cold_start_s)
            out = {
                "tenants/loads": float(self.loads),
                "tenants/evictions": float(self.evictions),
                "tenants/cold_starts": float(self.cold_starts),
                "tenants/hits": float(self.hits),
                "tenants/loaded": float(len(self._loaded)),
            }
        out["tenants/cold_start_s_mean"] = sum(waits) / len(waits) if waits else float("nan")
        out["tenants/cold_start_s_max"] = max(waits) if waits else float("nan")
        return out
