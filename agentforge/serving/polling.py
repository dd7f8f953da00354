"""The thread behind serving's watchers (:class:`~agentforge.serving.follow.StoreFollower`,
:class:`~agentforge.serving.supervise.EngineSupervisor`): call ``poll`` every ``poll_s`` seconds until stopped."""

from __future__ import annotations

import logging
import threading
from typing import Self

from agentforge.errors import ConfigError

__all__ = ["PollingThread"]

log = logging.getLogger(__name__)


class PollingThread:
    """Run :meth:`poll` from one daemon thread every ``poll_s`` seconds; a poll that raises is logged and
    the next one runs as usual (a store hiccup or a failed restart must not end the watching).

    Subclasses implement :meth:`poll` and may extend :meth:`start` and :meth:`stop`.

    Args:
        poll_s: seconds between polls.
        name: the thread's name (shown in thread dumps and log records).

    Raises:
        ConfigError: ``poll_s`` is not positive.
    """

    def __init__(self, poll_s: float, name: str) -> None:
        if poll_s <= 0:
            raise ConfigError(f"poll_s={poll_s} must be > 0 seconds")
        self.poll_s, self._name = poll_s, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        """One round of watching (runs on the polling thread)."""
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - logged; the next poll tries again
                log.exception("%s: poll failed", self._name)

    def start(self) -> Self:
        """Start the polling thread (the first poll runs ``poll_s`` seconds from now)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and wait for a poll in progress (up to ``poll_s + 5`` seconds); safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_s + 5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
