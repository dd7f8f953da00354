"""Probation: a new version serves before its canary's verdict, but no client sees its answers until it passed.

A hot swap (:mod:`agentforge.serving.hotswap`) loads the new version, puts it on probation
(:meth:`~agentforge.gateway.router.ModelRouter.start_probation`), flips the alias and sends the canary, so the
canary and the first client requests reach the engine together (one engine batch) instead of one after the
other. The gateway holds every answer of a version on probation (:meth:`Probation.hold`) until the verdict:

* passed — the held answers go out as they are;
* failed — the router points the alias back at the version it served before (the *fallback*), each held
  answer is thrown away unseen and unrecorded, and the gateway sends the call again to the fallback
  (:class:`VersionRefused`), so a failed canary costs those clients time, never an error or a wrong answer.

A version's probation ends when it passed, or when it failed and drained (no held call is left).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Protocol

from agentforge.errors import AgentForgeError

__all__ = ["Probation", "VersionRefused"]


class VersionRefused(AgentForgeError):
    """A held answer's version failed its canary: send the call again to ``fallback``.

    Raised by :meth:`Probation.hold` inside the gateway (it never reaches a client).

    Attributes:
        version: the refused version.
        fallback: the version the alias served before it.
    """

    def __init__(self, version: str, fallback: str) -> None:
        super().__init__(f"{version} failed its canary; its held answer goes to {fallback} instead")
        self.version, self.fallback = version, fallback


class _Closable(Protocol):
    async def aclose(self) -> None: ...


class Probation:
    """The verdict on one version and the answers waiting for it. Thread-safe; ``hold`` runs on any event loop.

    Args:
        version: the version on probation.
        fallback: the version that serves its calls if it fails (the alias target before the swap).
    """

    def __init__(self, version: str, fallback: str) -> None:
        self.version, self.fallback = version, fallback
        self._changed = threading.Condition()
        self._passed: bool | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[bool]]] = []
        #: answers waiting for the verdict now
        self.waiting = 0
        #: answers that waited for the verdict, in all
        self.held = 0

    @property
    def passed(self) -> bool | None:
        """The verdict: ``True`` passed, ``False`` failed, ``None`` not decided yet."""
        return self._passed

    def decide(self, passed: bool) -> None:
        """Give the verdict (the first one counts) and release every held answer.

        Args:
            passed: whether the version passed its canary.
        """
        with self._changed:
            if self._passed is not None:
                return
            self._passed = passed
            waiters, self._waiters = self._waiters, []
            self._changed.notify_all()
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_settle, future, passed)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    async def verdict(self) -> bool:
        """Wait for the verdict (at once when given already); returns whether the version passed."""
        with self._changed:
            if self._passed is not None:
                return self._passed
            loop = asyncio.get_running_loop()
            future: asyncio.Future[bool] = loop.create_future()
            self._waiters.append((loop, future))
            self.waiting += 1
            self.held += 1
            self._changed.notify_all()
        try:
            return await future
        finally:
            with self._changed:
                self.waiting -= 1
                self._changed.notify_all()

    async def hold(self, response: _Closable) -> None:
        """Hold an engine answer of this version until the verdict.

        Args:
            response: the engine's answer (closed here unless the version passed).

        Raises:
            VersionRefused: the version failed; the answer was closed unread.
            asyncio.CancelledError: the client left while it was held (the answer was closed).
        """
        try:
            passed = await self.verdict()
        except BaseException:
            await response.aclose()
            raise
        if not passed:
            await response.aclose()
            raise VersionRefused(self.version, self.fallback)

    def wait_held(self, count: int = 1, timeout_s: float | None = None) -> bool:
        """Block until at least ``count`` answers wait for the verdict at once, or it was given.

        Args:
            count: how many answers.
            timeout_s: seconds to wait at most (``None``: no limit).

        Returns:
            Whether ``count`` answers are waiting (False on timeout or once decided).
        """
        with self._changed:
            self._changed.wait_for(lambda: self.waiting >= count or self._passed is not None, timeout_s)
            return self.waiting >= count and self._passed is None


def _settle(future: asyncio.Future[bool], passed: bool) -> None:
    if not future.done():
        future.set_result(passed)
