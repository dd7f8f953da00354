"""``GroupCommitWriter``: one writer thread per store and process that commits spans and rewards in batches.

Every ``add_span`` / ``add_reward`` of a store goes through its writer: the caller's item joins a queue,
the writer thread takes everything queued (up to ``max_batch`` items), writes it with the store's
``write_batch`` (one transaction for SQL stores, one request for the HTTP store) and only then resolves
each caller's future. So a caller is acknowledged only after its item is committed (nothing acknowledged
is ever lost), and while one batch commits the next one fills up: under load many spans share one
transaction (group commit, as in database write-ahead logs), and a lone caller waits for one commit only.

Items keep their submission order inside and across batches, so a reward submitted after its span was
acknowledged is written after it. An item the store rejects (unknown rollout, bad text) fails alone; a
batch that fails as a whole (the database stayed unreachable through the store's retries) fails every
item of it with that error.

After ``os.fork`` the child starts a writer thread of its own on first use (threads do not survive a
fork) and items queued in the parent stay the parent's. The store's database connections must not cross a
fork, though (SQLite's own rule; PostgreSQL pools likewise): a forked child opens a new store, as the
runner's spawned worker processes do (:func:`agentforge.open.open_store`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

from agentforge.errors import UserError

__all__ = ["GroupCommitWriter"]

logger = logging.getLogger("agentforge.stores")

T = TypeVar("T")
R = TypeVar("R")


class GroupCommitWriter(Generic[T, R]):
    """A writer thread with group commit (see the module docstring).

    Args:
        write_batch: writes items in order and returns one entry per item: the stored item, or the
            exception that item alone failed with. Raising fails the whole batch.
        name: the thread's name (for logs and debuggers).
        max_batch: most items per ``write_batch`` call.

    Raises (from :meth:`submit`):
        UserError: the writer is closed.
    """

    def __init__(
        self,
        write_batch: Callable[[Sequence[T]], Sequence[R | BaseException]],
        name: str,
        max_batch: int = 512,
    ) -> None:
        if max_batch < 1:
            raise UserError(f"max_batch must be at least 1, got {max_batch}")
        self._write_batch, self._name, self.max_batch = write_batch, name, max_batch
        self._cond = threading.Condition()
        self._queue: deque[tuple[T, Future[R]]] = deque()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False

    def submit(self, item: T) -> Future[R]:
        """Queue ``item``; the future resolves to the stored item once its batch is committed.

        The future's exception is what the store raised for this item (e.g. ``NotFoundError``) or for
        the whole batch (e.g. ``StoreError``).
        """
        future: Future[R] = Future()
        with self._cond:
            if self._closed:
                raise UserError(f"{self._name} is closed; create a new store")
            if self._pid != os.getpid():  # forked child: the parent's thread and queue are not ours
                self._pid, self._thread, self._queue = os.getpid(), None, deque()
            self._queue.append((item, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return future

    def write(self, item: T) -> R:
        """Submit ``item`` and block until it is committed. Returns: the stored item. Raises: as the store."""
        return self.submit(item).result()

    def close(self, timeout_s: float = 30.0) -> None:
        """Write what is queued, then stop the thread (waits at most ``timeout_s`` seconds). Safe twice."""
        with self._cond:
            self._closed = True
            thread = self._thread if self._pid == os.getpid() else None
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _take(self) -> list[tuple[T, Future[R]]] | None:
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            n = min(len(self._queue), self.max_batch)
            return [self._queue.popleft() for _ in range(n)]

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            live = [(item, fut) for item, fut in batch if fut.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                results = self._write_batch([item for item, _ in live])
                if len(results) != len(live):
                    raise RuntimeError(f"write_batch returned {len(results)} results for {len(live)} items")
            except BaseException as exc:  # the batch failed as a whole: every caller gets the error
                logger.debug("%s: a batch of %d items failed: %s", self._name, len(live), exc)
                for _, fut in live:
                    fut.set_exception(exc)
                continue
            for (_, fut), result in zip(live, results, strict=True):
                if isinstance(result, BaseException):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)
