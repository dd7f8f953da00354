"""Process-mode workers: the entry point of a spawned worker process and how it opens the store.

The supervisor (:class:`~agentforge.runtime.runner.Runner`) spawns one process per worker with a
:class:`WorkerSpec`; the process opens the store from its URL (:func:`agentforge.open.open_store`), builds
the agent (:func:`~agentforge.runtime.agents.build_agent`) and runs a :class:`~agentforge.runtime.worker.Worker`
until told to stop. Supervisor and workers share only lock-free memory (a stop flag and a slot where the
worker publishes its running attempt), so a worker killed with SIGKILL can never leave a lock held.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentforge.open import open_store
from agentforge.runtime.agents import build_agent, load_object
from agentforge.runtime.context import EngineEndpoint
from agentforge.runtime.worker import Worker

__all__ = ["WorkerSpec", "worker_main", "RECYCLE_EXIT_CODE"]

#: Exit code of a worker process that ended itself to get rid of a stuck agent thread (the supervisor
#: replaces it at once; it does not count as a failed start). 75 is ``EX_TEMPFAIL``.
RECYCLE_EXIT_CODE = 75

logger = logging.getLogger("agentforge.runtime")


@dataclass
class WorkerSpec:
    """Everything a spawned worker process needs (picklable).

    Attributes:
        store_url: SQLite file / PostgreSQL URL, or an ``http(s)://`` store server URL.
        agent: a ``"module:function"`` factory or a picklable agent callable.
        scorer: ``None``, a picklable scorer, or ``"module:function"`` naming the scorer itself.
        engine: the engine's own address for ``ctx.engine`` (``None``: unknown).
    """

    store_url: str
    agent: str | Callable[..., Any]
    gateway_url: str
    name: str = "w0"
    store_api_key: str | None = None
    gateway_api_key: str | None = None
    heartbeat_s: float = 2.0
    poll_s: float = 0.2
    shutdown_grace_s: float = 5.0
    scorer: str | Callable[..., Any] | None = None
    agent_name: str | None = None
    log_level: int = logging.WARNING
    engine: EngineEndpoint | None = None


def worker_main(spec: WorkerSpec, stop: Any, slot: Any) -> None:
    """Entry point of a worker process: build store and agent, handle SIGTERM/SIGINT, run.

    SIGTERM and SIGINT stop the worker gracefully (the current attempt finishes or is given back
    after ``shutdown_grace_s``). After abandoning a stuck sync agent (timeout) the process exits with
    :data:`RECYCLE_EXIT_CODE` so the stuck thread dies with it, and the supervisor starts a new one; the process also stops when the shared ``stop`` flag is set or its
    parent process dies.

    Args:
        spec: the worker's configuration.
        stop: a shared ``multiprocessing.RawValue`` flag, non-zero means stop.
            (Lock-free on purpose: a worker killed with SIGKILL must not leave a lock held.)
        slot: a ``multiprocessing.RawArray('c', n)`` where the worker publishes ``"rollout_id
            attempt_id"`` of its running attempt (empty when idle).
    """
    logging.basicConfig(level=spec.log_level)
    stop_flag = _ProcessStop(stop, os.getppid())

    def on_signal(signum: int, frame: Any) -> None:
        logger.info("worker %s got signal %d: stopping", spec.name, signum)
        stop_flag.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def publish(rollout_id: str | None, attempt_id: str | None) -> None:
        slot.value = f"{rollout_id} {attempt_id}".encode() if rollout_id else b""

    store = open_store(spec.store_url, api_key=spec.store_api_key)
    scorer = load_object(spec.scorer) if isinstance(spec.scorer, str) else spec.scorer
    worker = Worker(
        store,
        build_agent(spec.agent),
        spec.gateway_url,
        stop_flag,
        name=spec.name,
        heartbeat_s=spec.heartbeat_s,
        poll_s=spec.poll_s,
        shutdown_grace_s=spec.shutdown_grace_s,
        scorer=scorer,
        agent_name=spec.agent_name,
        gateway_api_key=spec.gateway_api_key,
        on_attempt=publish,
        recycle_on_abandon=True,
        engine=spec.engine,
    )
    try:
        worker.run()
    finally:
        store.close()
    if worker.recycle:  # a stuck agent thread cannot be stopped: end the process, thread and all
        logging.shutdown()
        os._exit(RECYCLE_EXIT_CODE)


class _ProcessStop:
    """A worker process's stop event: set by a signal, by the supervisor's shared flag, or by the
    parent process dying. Checked directly (no polling thread), so a freshly spawned worker never
    claims after the supervisor asked it to stop."""

    def __init__(self, shared: Any, parent_pid: int) -> None:
        self._local, self._shared, self._parent = threading.Event(), shared, parent_pid

    def set(self) -> None:
        self._local.set()

    def is_set(self) -> bool:
        if not self._local.is_set() and (self._shared.value or os.getppid() != self._parent):
            self._local.set()
        return self._local.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = 0.05 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                return False
            self._local.wait(min(0.05, left))
        return True
