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
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Self

from agentforge.errors import AgentForgeError, NotFoundError
from agentforge.types import ResourceVersion

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.serving.hotswap import HotSwapper

__all__ = ["StoreFollower"]

log = logging.getLogger(__name__)


class StoreFollower:
    """Poll the store's active ``{alias}`` adapter version and serve it.

    Args:
        swapper: the engine's hot-swapper (its ``alias`` is the resource name followed).
        store: the trace store the publishers write to.
        poll_s: seconds between polls.

    Attributes:
        applied: the store version number served now (``None`` before the first one).
        failed: store version numbers that could not be served (each logged once).
    """

    def __init__(self, swapper: HotSwapper, store: TraceStore, poll_s: float = 2.0) -> None:
        if poll_s <= 0:
            from agentforge.errors import ConfigError

            raise ConfigError(f"poll_s={poll_s} must be > 0 seconds")
        self.swapper, self.store, self.poll_s = swapper, store, poll_s
        self.applied: int | None = None
        self.failed: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sync(self) -> str | None:
        """One poll: serve the store's active version if it is new.

        Returns:
            The version now served through the alias when this call changed it (``policy@v3``, or
            ``policy@v0`` for a rollback to the base model), else ``None``.
        """
        alias = self.swapper.alias
        try:
            active = self.store.get_resource(alias)
        except NotFoundError:
            return None
        if active.version == self.applied or active.version in self.failed:
            return None
        try:
            if active.payload.get("base"):
                served = self.swapper.reset_to_base()
            elif self.swapper.router.alias(alias) == active.ref:
                served = None  # already served (e.g. swapped in-process by a HotSwapPublisher)
            else:
                served = self.swapper.swap(active.payload["path"], version=active.ref)
        except (AgentForgeError, KeyError, OSError) as exc:
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

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.sync()
            except Exception:  # a store hiccup must not kill the follower; the next poll retries
                log.exception("store follower poll failed")

    def start(self) -> Self:
        """Sync once now, then poll in a daemon thread."""
        self.sync()
        self._thread = threading.Thread(target=self._loop, name="store-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (safe to call twice)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
