"""A swap seen by every gateway replica before any of them serves it: a barrier kept in the trace store.

Behind a load balancer, N ``agentforge serve`` replicas (``serve --workers N``, :mod:`agentforge.scale`) each
follow the store's active adapter version (:class:`~agentforge.serving.follow.StoreFollower`) into their own
engine. Without coordination one replica would serve ``policy@v4`` while another still loads it. With a
:class:`SwapBarrier` the follower works in two phases: it *stages* the new version (loaded, canaried,
routable by its own name, the alias unchanged: ``HotSwapper.swap(flip=False)``) and records that in the
store, then it flips the alias only once every replica of the set has recorded the same version staged — or
after ``timeout_s`` seconds, for the replicas that did not (a dead replica must not hold the others back; it
syncs when it comes back, before it serves). A version a replica refuses is moved back in the store by that
replica (the follower's rule), and the others discard what they staged.

The records are versions of one store resource, ``replicas:{alias}`` (kind ``other``, never active),
payload ``{"replica": id, "version": n}``: one per replica and swap, read with a cursor, so a poll reads
only what is new.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from agentforge.errors import ConfigError, NotFoundError
from agentforge.types import ResourceVersion

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = ["SwapBarrier", "barrier_resource"]

log = logging.getLogger(__name__)


def barrier_resource(alias: str) -> str:
    """The store resource holding the replicas' staged records of ``alias``."""
    return f"replicas:{alias}"


class SwapBarrier:
    """One replica's view of the replica set's staged versions.

    Args:
        store: the store every replica follows.
        alias: the served alias (``policy``).
        replica: this replica's id (e.g. ``r0``).
        replicas: the ids of every replica of the set (``replica`` among them).
        timeout_s: seconds after staging a version after which this replica flips even if some replicas have
            not staged it (they are reported as missing).

    Raises:
        ConfigError: ``replica`` is not in ``replicas``, an id is empty, or ``timeout_s`` is not positive.
    """

    def __init__(
        self, store: TraceStore, alias: str, replica: str, replicas: list[str], timeout_s: float = 30.0
    ) -> None:
        if not replica or replica not in replicas or not all(replicas):
            raise ConfigError(f"replica id {replica!r} must be one of the set's non-empty ids {replicas!r}")
        if not timeout_s > 0:
            raise ConfigError(f"barrier timeout_s={timeout_s} must be > 0")
        self.store, self.alias, self.replica = store, alias, replica
        self.replicas, self.timeout_s = list(dict.fromkeys(replicas)), timeout_s
        self.name = barrier_resource(alias)
        self._cursor = 0  # the last record version read
        self._staged: dict[int, set[str]] = {}  # alias version → replicas that staged it

    def record(self, version: int) -> None:
        """Record in the store that this replica has staged ``version`` of the alias."""
        payload = {"replica": self.replica, "version": version}
        self.store.publish_resource(
            ResourceVersion(name=self.name, kind="other", payload=payload), activate=False
        )

    def missing(self, version: int) -> list[str]:
        """The replicas that have not recorded ``version`` staged (reads the records added since the last
        call)."""
        try:
            new = self.store.list_resources(self.name, after=(self.name, self._cursor))
        except NotFoundError:
            new = []
        for rec in new:
            self._cursor = max(self._cursor, rec.version)
            replica, staged = rec.payload.get("replica"), rec.payload.get("version")
            if isinstance(replica, str) and isinstance(staged, int):
                self._staged.setdefault(staged, set()).add(replica)
        done = self._staged.get(version, set())
        return [r for r in self.replicas if r not in done]

    def ready(self, version: int, staged_at: float) -> bool:
        """Whether a replica that staged ``version`` at ``staged_at`` (``time.monotonic()``) may flip now:
        every replica staged it, or ``timeout_s`` passed (the missing ones are logged)."""
        missing = self.missing(version)
        if not missing:
            return True
        if time.monotonic() - staged_at < self.timeout_s:
            return False
        log.warning(
            "%s: replicas %s did not stage %s@v%d within %.0fs; %s flips without them",
            self.alias,
            ", ".join(missing),
            self.alias,
            version,
            self.timeout_s,
            self.replica,
        )
        return True
