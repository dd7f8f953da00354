"""One lock for the test caches under ``$AGENTFORGE_HOME`` (tiny models, test adapters) across the threads of
one process and the processes of one run (``make test`` runs two pytest-xdist workers that may build the same
cached artefact at once)."""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from agentforge.config import home_dir

_thread_lock = threading.Lock()


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold ``name``'s lock (``$AGENTFORGE_HOME/test-locks/<name>.lock``, an exclusive ``flock``) and this
    process's thread lock; blocks until both are free. Build and check a cached artefact under it."""
    path = home_dir() / "test-locks" / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _thread_lock, open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
