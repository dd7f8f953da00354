"""Serving follows the store: hot-swap whatever adapter version another process activated.

The trainer and the engine need not share a process. A job anywhere (trace replay, a trainer on another
machine, a rollback from the command line) publishes an adapter version and activates it in the trace store
(:class:`~agentforge.trainers.publish.StorePublisher`); the :class:`StoreFollower` next to the engine polls the
store's active version of the alias and hot-swaps it in through the :class:`~agentforge.serving.hotswap.
HotSwapper` (canary first, old version drained). A version that is refused (it does not fit the served model,
fails to load or fails its canary) is logged once and skipped — the old version keeps serving — and the store's
active version is moved back to what is served (the previous store version, or a new base-model marker
``{"base": true, "refused": N}`` when the base model is served), so the store never names a version active that
serving refused. A newer activation is then followed as usual.

A swap cut short because the engine went down (its process exited, or the
:class:`~agentforge.serving.supervise.EngineSupervisor` has it marked down) refuses nothing: the version is not
at fault. The follower leaves the store as it is, waits while the engine is down (the supervisor restarts it
and loads what served before, so the old version serves again), then retries the swap; after
``engine_retries`` such cut-short swaps of one version (an adapter that crashes the engine each time) it is
refused as above.

Behind a load balancer, several replicas follow one store; with a
:class:`~agentforge.serving.barrier.SwapBarrier` each stages the new version first and flips only once every
replica has staged it (see that module).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Self

from agentforge.errors import AgentForgeError, ConfigError, EngineUnreachableError, NotFoundError, UserError
from agentforge.serving.polling import PollingThread
from agentforge.types import ResourceVersion

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.serving.barrier import SwapBarrier
    from agentforge.serving.hotswap import HotSwapper

__all__ = ["StoreFollower"]

log = logging.getLogger(__name__)


class StoreFollower(PollingThread):
    """Poll the store's active ``{alias}`` adapter version and serve it.

    Args:
        swapper: the engine's hot-swapper (its ``alias`` is the resource name followed).
        store: the trace store the publishers write to.
        poll_s: seconds between polls.
        engine_retries: swaps of one version the engine's going down may cut short before the version is
            refused.
        barrier: the replica set's barrier: stage each new version, record it, flip once every replica staged
            it (``None``: one process, swap at once).

    Attributes:
        applied: the store version number served now (``None`` before the first one).
        failed: store version numbers that could not be served (each logged once).
        cut_short: store version number → its swaps cut short by the engine going down.

    Raises:
        ConfigError: ``poll_s`` is not positive or ``engine_retries`` is below 1.
    """

    def __init__(
        self,
        swapper: HotSwapper,
        store: TraceStore,
        poll_s: float = 2.0,
        engine_retries: int = 3,
        barrier: SwapBarrier | None = None,
    ) -> None:
        super().__init__(poll_s, name="store-follower")
        if engine_retries < 1:
            raise ConfigError(f"engine_retries={engine_retries} must be >= 1")
        self.swapper, self.store, self.engine_retries = swapper, store, engine_retries
        self.applied: int | None = None
        self.failed: set[int] = set()
        self.cut_short: dict[int, int] = {}
        self.barrier = barrier
        self._staged: tuple[int, str, float] | None = None  # (store version, served name, staged at)
        self._first = False  # True during start()'s first sync

    def sync(self) -> str | None:
        """One poll: serve the store's active version if it is new (nothing while the engine is down).

        Returns:
            The version now served through the alias when this call changed it (``policy@v3``, or
            ``policy@v0`` for a rollback to the base model), else ``None``.
        """
        alias = self.swapper.alias
        try:
            active = self.store.get_resource(alias)
        except NotFoundError:
            return None
        if self._staged is not None and self._staged[0] != active.version:
            self._discard_staged()  # another version was activated, or a replica refused this one
        if active.version == self.applied or active.version in self.failed or self.engine_down():
            return None
        pid = getattr(self.swapper.server, "pid", None)
        try:
            if active.kind != "adapter":  # e.g. kind "other" with an "adapter_path": nothing serving can load
                raise UserError(
                    f"{active.ref} is a resource of kind {active.kind!r}; serving follows adapter versions only "
                    "(kind 'adapter' with payload.path, or base: true)"
                )
            if active.payload.get("base"):
                served = self.swapper.reset_to_base()
            elif self.swapper.router.alias(alias) == active.ref:
                served = None  # already served (e.g. swapped in-process by a HotSwapPublisher)
            elif self.barrier is not None:
                served = self._staged_swap(active)
                if served is None:
                    return None  # staged; waiting for the other replicas
            else:
                served = self.swapper.swap(active.payload["path"], version=active.ref)
        except (AgentForgeError, KeyError, OSError) as exc:
            down = (
                self.engine_down()
                or (pid != getattr(self.swapper.server, "pid", None) and "restarted")
                # no answer at all: the engine died while this thread had not yet seen it exit (its
                # supervisor may be restarting it already); a live engine's refusal is a ServingError
                or (isinstance(exc, EngineUnreachableError) and "unreachable")
            )
            if down and self._cut_short(active, down, exc):
                return None
            self.failed.add(active.version)
            log.error(
                "cannot serve %s (%s); %s keeps serving", active.ref, exc, self.swapper.router.alias(alias)
            )
            self._restore_active(active)
            return None
        self.applied = active.version
        if served is not None:
            log.info("now serving %s (activated in the store)", served)
        return served

    def _staged_swap(self, active: ResourceVersion) -> str | None:
        """With a barrier: stage ``active`` and record it (once), then flip when the barrier says so.

        Returns:
            The version now served, or ``None`` while other replicas have not staged it.
        """
        assert self.barrier is not None
        if self._staged is None:
            name = self.swapper.swap(active.payload["path"], version=active.ref, flip=False)
            self._staged = (active.version, name, time.monotonic())
            try:
                self.barrier.record(active.version)
            except AgentForgeError as exc:  # e.g. a store server that refuses this key the write
                log.error(
                    "could not record %s as staged (%s); the other replicas flip after %.0f s without it",
                    name,
                    exc,
                    self.barrier.timeout_s,
                )
        version, name, staged_at = self._staged
        if not self._first and not self.barrier.ready(version, staged_at):  # a starting replica serves
            return None  # nothing yet: it serves the store's version at once
        self._staged = None
        return self.swapper.promote(name)

    def _discard_staged(self) -> None:
        """Unload the version staged for a flip that will not come (a log line if it cannot be unloaded)."""
        assert self._staged is not None
        _, name, _ = self._staged
        self._staged = None
        try:
            self.swapper.discard(name)
        except AgentForgeError as exc:
            log.warning("could not unload staged %s: %s", name, exc)

    def _cut_short(self, active: ResourceVersion, down: str, exc: BaseException) -> bool:
        """Count a swap of ``active`` the engine's going down cut short; True while it may be retried."""
        tries = self.cut_short[active.version] = self.cut_short.get(active.version, 0) + 1
        if tries > self.engine_retries:
            return False
        log.warning(
            "the engine went down (%s) while %s was swapped in (%s); the old version serves again once the "
            "engine is back, then the swap is retried (%d/%d)",
            down,
            active.ref,
            exc,
            tries,
            self.engine_retries,
        )
        return True

    def engine_down(self) -> str | None:
        """Why the engine cannot take a swap now (its process exited, or a supervisor marked it down), or
        ``None`` while it serves."""
        server = self.swapper.server
        if getattr(server, "pid", None) is not None and not server.running:  # type: ignore[attr-defined]
            return f"exit code {server.exit_code}"  # type: ignore[attr-defined]
        return self.swapper.router.engines_down().get(self.swapper.base_version)

    def _restore_active(self, refused: ResourceVersion) -> None:
        """Point the store's active version back at what serving serves, unless another was activated since."""
        alias = self.swapper.alias
        try:
            if self.store.get_resource(alias).version != refused.version:
                return  # a newer activation arrived meanwhile: the next poll follows it
            if self.applied is not None:
                back = self.store.activate_resource(alias, self.applied)
            else:  # the base model serves: record that as a new version, as a rollback to the base does
                marker = ResourceVersion(
                    name=alias, kind="adapter", payload={"base": True, "refused": refused.version}
                )
                back = self.store.publish_resource(marker, activate=True)
                self.applied = back.version
        except AgentForgeError as exc:  # the next refusal or poll tries again; serving is unaffected
            log.error(
                "could not move the store's active %s back from refused %s: %s", alias, refused.ref, exc
            )
            return
        log.warning("the store's active %s is %s again (%s was refused)", alias, back.ref, refused.ref)

    def poll(self) -> None:
        """One poll on the follower's thread (see :meth:`sync`)."""
        self.sync()

    def start(self) -> Self:
        """Sync once now, then poll in a daemon thread. With a barrier the first sync stages the store's
        version and serves it without waiting for the others: a replica starts it before its gateway."""
        self._first = True
        try:
            self.sync()
        finally:
            self._first = False
        return super().start()
