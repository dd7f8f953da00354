"""``WalCheckpointer``: a SQLite store's WAL checkpoints on a thread of their own, off the writer's path.

In WAL mode a commit appends the changed pages to the ``-wal`` file and syncs it: from then on the commit
survives a crash or a killed process. A *checkpoint* later copies those pages into the database file so the
WAL can start over. By default SQLite runs one inside every commit that finds the WAL past 1,000 pages (the
``wal_autocheckpoint``), so about every fourth span batch paid 10-14 ms of copying and syncing on the span
writer's thread, with every caller of that batch waiting for it.

With a checkpointer, the store's connections run no automatic checkpoints (``wal_autocheckpoint = 0``);
after write transactions the store calls :meth:`WalCheckpointer.committed` with the rows written, and this
thread runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own connection, which copies what is committed without
blocking writers or readers: after the first commit that follows a pass, at most once per ``interval_s``,
sooner once ``pass_rows`` rows were committed since the last pass. Passes far apart copy a page that many
commits changed (an index page that every batch touches) once instead of once per pass: at 32 clients
through the gateway a pass every 0.1 s instead of every 0.02 s took 3-5 % off a call's CPU. The row
count bounds what a burst adds to the WAL between two passes. Durability does not depend on any of this: a
checkpoint only copies pages whose commit is already synced in the WAL (and SQLite replays the WAL on open
after a crash).

A PASSIVE checkpoint cannot restart the WAL while a writer keeps appending (SQLite starts a WAL over only at
the start of a write transaction that finds every frame copied), so under sustained load the file would grow
without bound. Hence the bound: once a pass sees at least ``max_wal_pages`` in the WAL, :attr:`behind` is set,
and the span writer calls :meth:`catch_up` before its next transaction: it waits for a running pass, copies
the few pages committed since, and its next transaction then starts the WAL over.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time

__all__ = ["WalCheckpointer"]

logger = logging.getLogger("agentforge.stores")


class WalCheckpointer:
    """Checkpoints one SQLite database file's WAL from a daemon thread (see the module docstring).

    Args:
        path: the database file.
        busy_timeout_s: the checkpoint connection's ``busy_timeout``, seconds.
        synchronous: its ``PRAGMA synchronous`` (the store's: a checkpoint syncs the database file with FULL).
        interval_s: the pause after a pass, seconds: the next pass follows the first commit after it (commits
            during it share one pass); ``pass_rows`` rows committed during it end it early.
        max_wal_pages: WAL size (pages) from which the writer catches up itself (:attr:`behind`).
        pass_rows: rows committed since the last pass that start the next one before ``interval_s``.

    Attributes:
        passes: checkpoint passes run so far (background and catch-up).
        behind: the last pass found at least ``max_wal_pages`` pages in the WAL.
        wal_pages: how many pages the WAL held at the last pass.
    """

    def __init__(
        self,
        path: str,
        busy_timeout_s: float = 5.0,
        synchronous: str = "FULL",
        interval_s: float = 0.1,
        max_wal_pages: int = 4000,
        pass_rows: int = 512,
    ) -> None:
        if interval_s < 0 or pass_rows < 1:
            raise ValueError(
                f"interval_s must be >= 0 and pass_rows >= 1, not {interval_s!r} and {pass_rows!r}"
            )
        self.path, self.busy_timeout_s, self.synchronous = path, busy_timeout_s, synchronous
        self.interval_s, self.max_wal_pages, self.pass_rows = interval_s, max_wal_pages, pass_rows
        self.passes, self.behind, self.wal_pages = 0, False, 0
        self._rows = 0  # committed since the last pass began (approximate: several writers may add at once)
        self._wake = threading.Event()  # a commit since the last pass
        self._soon = threading.Event()  # pass_rows reached: end the pause between passes early
        self._lock = threading.Lock()  # one pass at a time: the thread's or the writer's catch-up
        self._start = threading.Lock()  # one thread started
        self._conn: sqlite3.Connection | None = None
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False

    def committed(self, rows: int = 1) -> None:
        """A write transaction committed ``rows`` rows: wake the thread (started on first use, again in a
        forked child); end its pause once ``pass_rows`` rows were committed since its last pass."""
        if self._closed:
            return
        if self._pid != os.getpid():  # first: the parent's events and locks may be held forever here
            self._forked()
        self._rows += rows
        if self._rows >= self.pass_rows:
            self._soon.set()
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    thread = threading.Thread(target=self._run, name="agentforge-checkpointer", daemon=True)
                    thread.start()
                    self._thread = thread
        self._wake.set()

    def _forked(self) -> None:
        """In a forked child none of the parent's thread, locks (a pass may hold one) or connection is ours."""
        self._pid, self._thread, self._conn = os.getpid(), None, None
        self._lock, self._start, self._wake = threading.Lock(), threading.Lock(), threading.Event()
        self._soon, self._rows = threading.Event(), 0

    def catch_up(self) -> None:
        """Checkpoint now, in the calling thread (the span writer, between two transactions), after any
        running pass: so the writer's next transaction finds every frame copied and starts the WAL over."""
        if self._pid != os.getpid():
            self._forked()
        with self._lock:
            self._checkpoint()
            self.behind = False  # done what can be done; the next background pass looks again

    def _checkpoint(self) -> None:
        """One PASSIVE pass (the caller holds the lock); a busy or failing pass is logged and left to the next."""
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, check_same_thread=False)
                self._conn.isolation_level = None
                self._conn.execute(f"PRAGMA synchronous = {self.synchronous}")
            busy, pages, _copied = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            logger.debug("WAL checkpoint of %s failed: %s", self.path, exc)
            return
        self.passes += 1
        if not busy:  # busy: another process's checkpoint runs; it will tell nothing new
            self.wal_pages = pages
            self.behind = pages >= self.max_wal_pages

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            if self._closed:
                break
            self._wake.clear()
            self._soon.clear()
            self._rows = 0
            with self._lock:
                self._checkpoint()
            # the pause: commits meanwhile wake the thread again (one pass for all of them); pass_rows ends it
            deadline = time.monotonic() + self.interval_s
            while (
                not self._closed and self._rows < self.pass_rows and (left := deadline - time.monotonic()) > 0
            ):
                self._soon.wait(left)
                self._soon.clear()

    def close(self) -> None:
        """Stop the thread and close its connection (SQLite checkpoints the WAL when a file's last
        connection closes). Safe to call twice."""
        if self._closed:
            return
        if self._pid != os.getpid():  # a forked child: the thread and connection left are the parent's
            self._forked()
        self._closed = True
        self._wake.set()
        self._soon.set()
        if self._thread is not None:
            self._thread.join(10)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
            self._conn = None
