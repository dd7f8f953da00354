"""``GroupCommitWriter``: one writer thread per store and process that commits spans and rewards in batches.

Every ``add_span`` / ``add_reward`` of a store goes through its writer: the caller's item joins a queue,
the writer thread takes everything queued (up to ``max_batch`` items), writes it with the store's
``write_batch`` (one transaction for SQL stores, one request for the HTTP store) and only then resolves
each caller's future. So a caller is acknowledged only after its item is committed (nothing acknowledged
is ever lost), and while one batch commits the next one fills up: under load many spans share one
transaction (group commit, as in database write-ahead logs), and a lone caller waits for one commit only.

A batch's fixed cost (its transaction, the lookups, the commit's sync, the thread and loop wake-ups) is
large against an item's own (a durable SQLite commit: ~0.3 ms against ~30 µs a span), so under concurrent
load the writer may wait ``commit_delay_s`` before taking the next batch, letting it fill: after a batch
that served at least ``commit_siblings`` callers (evidence of many concurrent callers; a ``submit_many``
group counts once), never after one that served fewer, so a lone caller never waits for it (however many
items it hands over at once), and not when ``commit_siblings`` items or more are queued already (a backlog,
as in a burst of flushes, fills the next batch by itself). A ``close`` may wait for one delay. This is
PostgreSQL's ``commit_delay`` / ``commit_siblings`` (and MySQL's ``binlog_group_commit_sync_delay``); see
:class:`GroupCommitWriter` for the trade.

A caller holding many items at once (a tracer flushing a rollout's spans) uses
:meth:`GroupCommitWriter.submit_many`: one future for the lot, resolved once the last of them is committed,
with one outcome per item (its items may share batches with other callers' and span several batches). That
saves a future, a lock and a thread wake-up per item, and the items stay in order with everyone else's.

Async callers use :meth:`GroupCommitWriter.submit_async`: their ``asyncio`` futures are resolved with one
``call_soon_threadsafe`` per event loop and batch (a thread-safe ``concurrent.futures.Future`` per item,
chained to the loop one by one, costs a lock, a condition and a loop wake-up per item).

Items keep their submission order inside and across batches, so a reward submitted after its span was
acknowledged is written after it. An item the store rejects (unknown rollout, bad text) fails alone; a
batch that fails as a whole (the database stayed unreachable through the store's retries) fails every
item of it with that error.

A store that exports what it commits (:mod:`agentforge.stores.otlp`) sets :attr:`GroupCommitWriter.on_commit`:
the writer thread hands it each batch's stored items after resolving the callers' futures, so a listener never
delays an acknowledgement; ``None`` (the default) costs one attribute read per batch.

After ``os.fork`` the child starts a writer thread of its own on first use (threads do not survive a
fork) and items queued in the parent stay the parent's. The store's database connections must not cross a
fork, though (SQLite's own rule; PostgreSQL pools likewise): a forked child opens a new store, as the
runner's spawned worker processes do (:func:`agentforge.open.open_store`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from time import sleep as _sleep
from typing import Generic, TypeVar

from agentforge.errors import UserError

__all__ = ["GroupCommitWriter"]

logger = logging.getLogger("agentforge.stores")

T = TypeVar("T")
R = TypeVar("R")


class _Group(Generic[R]):
    """The shared acknowledgement of one :meth:`GroupCommitWriter.submit_many` call: its future, the outcome
    slots and how many items are still uncommitted (touched by the writer thread only)."""

    __slots__ = ("future", "outcomes", "left", "live")

    def __init__(self, n: int) -> None:
        self.future: Future[list[R | BaseException]] = Future()
        self.outcomes: list[R | BaseException | None] = [None] * n
        self.left = n
        self.live: bool | None = None  # None: no item taken yet; False: cancelled before that

    def start(self) -> bool:
        """Whether the group's items are to be written (its future was not cancelled before the first)."""
        if self.live is None:
            self.live = self.future.set_running_or_notify_cancel()
        return self.live

    def settle(self, index: int, outcome: R | BaseException) -> None:
        self.outcomes[index] = outcome
        self.left -= 1
        if self.left == 0:
            self.future.set_result(self.outcomes)  # type: ignore[arg-type]


#: Where an item's outcome goes: its own future, or a slot ``(group, index)`` of a :meth:`submit_many` call.
_Sink = Future | asyncio.Future | tuple


class GroupCommitWriter(Generic[T, R]):
    """A writer thread with group commit (see the module docstring).

    Args:
        write_batch: writes items in order and returns one entry per item: the stored item, or the
            exception that item alone failed with. Raising fails the whole batch.
        name: the thread's name (for logs and debuggers).
        max_batch: most items per ``write_batch`` call.
        commit_delay_s: seconds the writer waits before taking the next batch after a batch that served at
            least ``commit_siblings`` callers, unless that many items are queued already (0: never waits).
            Under sustained concurrent load the batches grow, and the CPU per item falls, by about the delay
            times the arrival rate; each item of such a load waits up to this much longer for its
            acknowledgement.
        commit_siblings: the fewest callers in a batch that make the writer wait ``commit_delay_s`` before
            the next, and the backlog (items) that makes it not wait.

    Attributes:
        on_commit: called on the writer thread with each batch's stored items (those that did not fail), after
            the batch's futures are resolved; must not block (an exception is logged and ignored). ``None``:
            nothing is called.

    Raises (from :meth:`submit`):
        UserError: the writer is closed.
    """

    on_commit: Callable[[Sequence[R]], None] | None = None

    def __init__(
        self,
        write_batch: Callable[[Sequence[T]], Sequence[R | BaseException]],
        name: str,
        max_batch: int = 512,
        commit_delay_s: float = 0.0,
        commit_siblings: int = 4,
    ) -> None:
        if max_batch < 1:
            raise UserError(f"max_batch must be at least 1, got {max_batch}")
        if not 0.0 <= commit_delay_s <= 1.0:
            raise UserError(f"commit_delay_s must be between 0 and 1 second, got {commit_delay_s}")
        if commit_siblings < 1:
            raise UserError(f"commit_siblings must be at least 1, got {commit_siblings}")
        self._write_batch, self._name, self.max_batch = write_batch, name, max_batch
        self.commit_delay_s, self.commit_siblings = commit_delay_s, commit_siblings
        self._delay_next = False  # the last batch was large enough for the next one to wait
        self._cond = threading.Condition()
        self._queue: deque[tuple[T, _Sink]] = deque()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False

    def submit(self, item: T) -> Future[R]:
        """Queue ``item``; the future resolves to the stored item once its batch is committed.

        The future's exception is what the store raised for this item (e.g. ``NotFoundError``) or for
        the whole batch (e.g. ``StoreError``).
        """
        future: Future[R] = Future()
        self._enqueue(item, future)
        return future

    def submit_async(self, item: T) -> asyncio.Future[R]:
        """:meth:`submit` for a coroutine: queue ``item``, return a future of the running event loop.

        The item is written even when the future is cancelled (a caller that leaves cannot un-write
        it); the future resolves as :meth:`submit`'s does.

        Raises:
            UserError: the writer is closed. RuntimeError: no running event loop.
        """
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._enqueue(item, future)
        return future

    def submit_many(self, items: Sequence[T]) -> Future[list[R | BaseException]]:
        """Queue ``items`` in order behind one future, which resolves once every one of them is committed.

        Args:
            items: the items; they may be written in several batches, shared with other callers' items.

        Returns:
            A future of one outcome per item, in order: the stored item, or the exception that item failed
            with (alone, e.g. ``NotFoundError``, or with its whole batch, e.g. ``StoreError``). Cancelling it
            before the writer takes the first item skips them all; after that every item is written.

        Raises:
            UserError: the writer is closed.
        """
        group: _Group[R] = _Group(len(items))
        if not items:
            group.future.set_running_or_notify_cancel()
            group.future.set_result([])
            return group.future
        self._enqueue_all([(item, (group, i)) for i, item in enumerate(items)])
        return group.future

    def _enqueue(self, item: T, future: Future[R] | asyncio.Future[R]) -> None:
        self._enqueue_all([(item, future)])

    def _enqueue_all(self, entries: list[tuple[T, _Sink]]) -> None:
        with self._cond:
            if self._closed:
                raise UserError(f"{self._name} is closed; create a new store")
            if self._pid != os.getpid():  # forked child: the parent's thread and queue are not ours
                self._pid, self._thread, self._queue = os.getpid(), None, deque()
            self._queue.extend(entries)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

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

    def _take(self) -> list[tuple[T, _Sink]] | None:
        if self._delay_next:  # concurrent callers: let the next batch fill (see the module docstring)
            self._delay_next = False
            if len(self._queue) < self.commit_siblings and not self._closed:  # a backlog: no wait
                _sleep(self.commit_delay_s)
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            if len(self._queue) <= self.max_batch:  # everything queued (the usual case): one copy
                batch = list(self._queue)
                self._queue.clear()
                return batch
            return [self._queue.popleft() for _ in range(self.max_batch)]

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            items: list[T] = []
            sinks: list[_Sink] = []
            for item, sink in batch:  # skip what its caller cancelled before the writer took it
                if type(sink) is tuple:
                    group = sink[0]
                    if not (group.live if group.live is not None else group.start()):
                        continue
                elif isinstance(sink, Future) and not sink.set_running_or_notify_cancel():
                    continue
                items.append(item)
                sinks.append(sink)
            if not items:
                continue
            self._delay_next = self.commit_delay_s > 0 and _callers(sinks) >= self.commit_siblings
            outcomes: list[R | BaseException]
            try:
                results = self._write_batch(items)
                if len(results) != len(items):
                    raise RuntimeError(f"write_batch returned {len(results)} results for {len(items)} items")
                outcomes = list(results)
            except BaseException as exc:  # the batch failed as a whole: every caller gets the error
                logger.debug("%s: a batch of %d items failed: %s", self._name, len(items), exc)
                outcomes = [exc] * len(items)
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[R], R | BaseException]]] = {}
            for sink, outcome in zip(sinks, outcomes, strict=True):
                if isinstance(sink, tuple):
                    sink[0].settle(sink[1], outcome)
                elif isinstance(sink, Future):
                    if isinstance(outcome, BaseException):
                        sink.set_exception(outcome)
                    else:
                        sink.set_result(outcome)
                else:
                    by_loop.setdefault(sink.get_loop(), []).append((sink, outcome))
            for loop, settled in by_loop.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # the loop closed meanwhile: nobody is waiting any more
                    pass
            if (listener := self.on_commit) is not None:
                stored = [o for o in outcomes if o is not None and not isinstance(o, BaseException)]
                _notify(listener, stored, self._name)


def _callers(sinks: list[_Sink]) -> int:
    """How many callers a batch serves: one per future, one per :meth:`GroupCommitWriter.submit_many` group."""
    groups = [sink[0] for sink in sinks if type(sink) is tuple]
    if not groups:
        return len(sinks)
    return len(sinks) - len(groups) + len({id(group) for group in groups})


def _notify(listener: Callable[[Sequence[R]], None], stored: list[R], name: str) -> None:
    """Hand a committed batch to the writer's listener; its failure is logged, never the writer's."""
    try:
        listener(stored)
    except Exception:
        logger.exception("%s: the commit listener failed (the batch itself is committed)", name)


def _settle(settled: list[tuple[asyncio.Future[R], R | BaseException]]) -> None:
    """Resolve a batch's asyncio futures inside their own loop (skipping those their callers cancelled)."""
    for fut, outcome in settled:
        if fut.done():
            continue
        if isinstance(outcome, BaseException):
            fut.set_exception(outcome)
        else:
            fut.set_result(outcome)
