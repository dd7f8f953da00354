"""``Runner``: run queued rollouts with N workers (threads or processes).

.. code-block:: python

    rollouts = enqueue_tasks(store, tasks, group_size=4, resources={"policy": "policy@v3"})
    with Runner(store, my_agent, gateway.url, workers=4, mode="process") as runner:
        done = runner.run_until_done([r.rollout_id for r in rollouts], timeout_s=600)

**Supervisor.** Besides its workers the runner keeps one supervisor thread (in the calling process)
that, every ``heartbeat_s`` seconds, calls ``store.requeue_stale(heartbeat_timeout_s)``: an attempt
whose worker stopped heartbeating (a ``kill -9``, a lost machine) is abandoned and its rollout goes back
to ``queued`` for another worker; ``list_spans(valid_only=True)`` then excludes the dead attempt's
spans. Any number of runners may share a store; each one's watchdog also rescues the others' rollouts.
In process mode the supervisor also replaces a worker process that exited while the runner runs,
except one that keeps exiting right after it starts (e.g. an agent factory that raises): it gives up on
it, and once all are given up :meth:`Runner.run_until_done` raises ``RunError`` instead of hanging.

**Modes.** ``"thread"``: workers are threads of this process sharing ``store``; simple, but a timed-out
sync agent can only be abandoned, not killed (see :mod:`agentforge.runtime.worker`). ``"process"``:
workers are processes (``multiprocessing`` *spawn*) that open the store from its URL and build the
agent from a ``"module:function"`` factory or a picklable callable; a sync agent stuck past its
timeout dies with its process (the worker exits after the attempt and is replaced), and SIGTERM/SIGINT
stop a worker gracefully.

**Shutdown.** :meth:`Runner.stop` (and leaving the ``with`` block) lets each running attempt finish
within ``shutdown_grace_s`` seconds, then gives it back (:func:`~agentforge.runtime.worker.give_back`:
attempt ``abandoned``, rollout ``queued``); no rollout is left ``running``.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Self

from agentforge.errors import ConfigError, RunError, UserError
from agentforge.open import is_process_local, open_store
from agentforge.runtime.agents import build_agent, load_object
from agentforge.runtime.context import EngineEndpoint
from agentforge.runtime.process import RECYCLE_EXIT_CODE, WorkerSpec, worker_main
from agentforge.runtime.tasks import wait_for_rollouts
from agentforge.runtime.worker import Worker, give_back
from agentforge.types import Rollout

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from agentforge.ports import TraceStore

__all__ = ["Runner"]

logger = logging.getLogger("agentforge.runtime")

_SLOT_BYTES = 160  # "rollout_id attempt_id" of a worker process's running attempt
_QUICK_EXIT_S = 10.0  # a worker process that exits this soon after starting counts as a failed start
_MAX_QUICK_EXITS = 3


class Runner:
    """Runs queued rollouts of the store with ``workers`` workers (see the module docstring).

    Args:
        store: a ``TraceStore``, or its URL (SQLite file, PostgreSQL, ``http(s)://`` store server).
            Process mode needs a URL its workers can open: a URL, an ``SQLStore`` on a file or server
            (its ``url``), or an ``HTTPStore`` (its ``base_url``; pass ``store_api_key`` if needed).
        agent: the agent (``agent(task, ctx)``), or a ``"module:function"`` factory returning it. In
            process mode a callable must be picklable (module-level).
        gateway_url: the gateway root, e.g. ``http://127.0.0.1:8000``.
        workers: number of workers.
        mode: ``"thread"`` or ``"process"``.
        heartbeat_s: seconds between a worker's heartbeats.
        heartbeat_timeout_s: an attempt without a heartbeat for this long is abandoned and re-queued,
            seconds; must exceed ``2 * heartbeat_s``.
        poll_s: seconds an idle worker waits before claiming again.
        scorer: ``(task, output) -> reward | None``, recorded as ``Reward(source="scorer", final=True)``;
            a ``"module:function"`` string in process mode if the callable is not picklable.
        agent_name: claim only rollouts whose ``Rollout.agent`` equals it.
        shutdown_grace_s: at :meth:`stop`, seconds a running attempt may take before it is given back.
        gateway_api_key: the gateway's API key, handed to agents (``ctx.api_key``).
        store_api_key: the store server's API key for process workers using an ``http(s)`` store URL.
        watchdog: run the ``requeue_stale`` supervisor (leave on unless another process does it).
        engine: the inference engine's own address, handed to agents as ``ctx.engine`` for calls that must not
            be recorded (a simulated customer); ``None``: not known to this runner.

    Raises:
        ConfigError: a number out of range (the message has it), or process mode without a store URL.
        UserError: ``mode`` is unknown or ``agent`` is not callable.
    """

    def __init__(
        self,
        store: TraceStore | str,
        agent: Callable[..., Any] | str,
        gateway_url: str,
        *,
        workers: int = 1,
        mode: Literal["thread", "process"] = "thread",
        heartbeat_s: float = 2.0,
        heartbeat_timeout_s: float = 10.0,
        poll_s: float = 0.2,
        scorer: Callable[..., Any] | str | None = None,
        agent_name: str | None = None,
        shutdown_grace_s: float = 5.0,
        gateway_api_key: str | None = None,
        store_api_key: str | None = None,
        watchdog: bool = True,
        engine: EngineEndpoint | None = None,
    ) -> None:
        if mode not in ("thread", "process"):
            raise UserError(f"Runner(mode={mode!r}): use 'thread' or 'process'")
        if workers < 1:
            raise ConfigError(f"Runner(workers={workers}): need at least 1 worker")
        if heartbeat_s <= 0 or poll_s <= 0 or shutdown_grace_s < 0:
            raise ConfigError(
                f"Runner(heartbeat_s={heartbeat_s}, poll_s={poll_s}, shutdown_grace_s={shutdown_grace_s}): "
                "heartbeat_s and poll_s must be > 0 s, shutdown_grace_s >= 0 s"
            )
        if heartbeat_timeout_s <= 2 * heartbeat_s:
            raise ConfigError(
                f"Runner(heartbeat_timeout_s={heartbeat_timeout_s}) must exceed 2 * heartbeat_s = "
                f"{2 * heartbeat_s} s, or healthy attempts get re-queued"
            )
        self._owns_store = isinstance(store, str)
        self.store: TraceStore = open_store(store, api_key=store_api_key) if isinstance(store, str) else store
        self.store_url = store if isinstance(store, str) else _store_url(store) if mode == "process" else None
        self.mode, self.workers, self.gateway_url = mode, workers, gateway_url
        self.heartbeat_s, self.heartbeat_timeout_s, self.poll_s = heartbeat_s, heartbeat_timeout_s, poll_s
        self.agent_name, self.shutdown_grace_s, self.watchdog = agent_name, shutdown_grace_s, watchdog
        self.gateway_api_key, self.store_api_key = gateway_api_key, store_api_key
        self.engine = engine
        self._agent_spec, self._scorer_spec = agent, scorer
        if mode == "thread":  # fail fast, in the caller's process
            self._agent = build_agent(agent)
            self._scorer = load_object(scorer) if isinstance(scorer, str) else scorer
        elif not isinstance(agent, str) and not callable(agent):
            raise UserError(f"an agent must be callable as agent(task, ctx); got {type(agent).__name__}")
        self._stop_thread = threading.Event()
        self._stop_process: Any = None
        self._threads: list[tuple[threading.Thread, Worker]] = []
        self._procs: list[tuple[BaseProcess, Any]] = []
        self._supervisor: threading.Thread | None = None
        self._stopping = False
        self._ctx = mp.get_context("spawn")
        self.respawned = 0
        self._started_at: dict[int, float] = {}
        self._quick_exits: dict[int, int] = {}
        self._given_up: set[int] = set()

    # --- life cycle ---------------------------------------------------------------------------------
    def start(self) -> Self:
        """Start the workers and the supervisor (no-op if running). Returns ``self``."""
        if self._supervisor is not None:
            return self
        self._stopping = False
        self._stop_thread.clear()
        if self.mode == "thread":
            for i in range(self.workers):
                worker = Worker(
                    self.store,
                    self._agent,
                    self.gateway_url,
                    self._stop_thread,
                    name=f"t{i}",
                    heartbeat_s=self.heartbeat_s,
                    poll_s=self.poll_s,
                    shutdown_grace_s=self.shutdown_grace_s,
                    scorer=self._scorer,
                    agent_name=self.agent_name,
                    gateway_api_key=self.gateway_api_key,
                    engine=self.engine,
                )
                thread = threading.Thread(target=worker.run, name=f"agentforge-worker-t{i}", daemon=True)
                thread.start()
                self._threads.append((thread, worker))
        else:
            # Plain shared memory, polled by the workers: a lock or condition (multiprocessing.Event) would
            # deadlock the supervisor once a worker is SIGKILLed while holding or waiting on it.
            self._stop_process = self._ctx.RawValue("b", 0)
            self._quick_exits = {i: 0 for i in range(self.workers)}
            self._given_up = set()
            self._procs = [self._spawn(i) for i in range(self.workers)]
        self._supervisor = threading.Thread(target=self._supervise, name="agentforge-supervisor", daemon=True)
        self._supervisor.start()
        return self

    def _spawn(self, index: int) -> tuple[BaseProcess, Any]:
        spec = WorkerSpec(
            store_url=self.store_url or "",
            agent=self._agent_spec,
            gateway_url=self.gateway_url,
            name=f"p{index}",
            store_api_key=self.store_api_key,
            gateway_api_key=self.gateway_api_key,
            heartbeat_s=self.heartbeat_s,
            poll_s=self.poll_s,
            shutdown_grace_s=self.shutdown_grace_s,
            scorer=self._scorer_spec,
            agent_name=self.agent_name,
            log_level=logging.getLogger().level,
            engine=self.engine,
        )
        slot = self._ctx.RawArray("c", _SLOT_BYTES)
        proc = self._ctx.Process(
            target=worker_main, args=(spec, self._stop_process, slot), name=f"agentforge-worker-p{index}"
        )
        proc.start()
        self._started_at[index] = time.monotonic()
        return proc, slot

    def _supervise(self) -> None:
        interval = min(self.heartbeat_s, self.heartbeat_timeout_s / 4)
        while not self._stop_thread.wait(interval):
            if self.watchdog:
                try:
                    requeued = self.store.requeue_stale(self.heartbeat_timeout_s)
                    if requeued:
                        logger.warning(
                            "re-queued %d rollouts whose worker stopped heartbeating: %s",
                            len(requeued),
                            requeued,
                        )
                except Exception as exc:  # noqa: BLE001 - try again next interval
                    logger.warning("requeue_stale failed: %s", exc)
            self._replace_dead_workers()

    def _replace_dead_workers(self) -> None:
        """Respawn worker processes that exited while the runner runs; give up on a slot after
        ``_MAX_QUICK_EXITS`` exits in a row each within ``_QUICK_EXIT_S`` seconds of its start (a
        worker that cannot even start, e.g. an agent factory that raises)."""
        for i, (proc, _slot) in enumerate(self._procs):
            if proc.is_alive() or self._stopping or i in self._given_up:
                continue
            recycled = proc.exitcode == RECYCLE_EXIT_CODE  # it ended itself to drop a stuck agent thread
            quick = not recycled and time.monotonic() - self._started_at[i] < _QUICK_EXIT_S
            self._quick_exits[i] = self._quick_exits[i] + 1 if quick else 0
            if self._quick_exits[i] >= _MAX_QUICK_EXITS:
                self._given_up.add(i)
                logger.error(
                    "worker process %s exited %d times in a row within %g s of starting (last "
                    "exit code %s); not restarting it",
                    proc.name,
                    self._quick_exits[i],
                    _QUICK_EXIT_S,
                    proc.exitcode,
                )
                continue
            log = logger.info if recycled else logger.warning
            log(
                "worker process %s (pid %s) exited with %s; starting a new one",
                proc.name,
                proc.pid,
                proc.exitcode,
            )
            self._procs[i] = self._spawn(i)
            self.respawned += 1

    def check_workers(self) -> None:
        """Raise if every worker process has been given up on (nothing will run the queue).

        Raises:
            RunError: naming the workers' last exit codes.
        """
        if self._procs and len(self._given_up) == len(self._procs):
            codes = [p.exitcode for p, _ in self._procs]
            raise RunError(
                f"all {len(self._procs)} worker processes keep exiting right after they start (exit codes "
                f"{codes}); run the agent factory {self._agent_spec!r} in this process to see the error"
            )

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the workers: running attempts get ``shutdown_grace_s`` seconds, then are given back.

        Args:
            timeout_s: seconds to wait for the workers to exit (default ``shutdown_grace_s + 15``);
                process workers still alive then are terminated, then killed, and their running
                attempts given back here.

        Safe to call twice; leaves no rollout of this runner in ``running``.
        """
        if self._supervisor is None:
            return
        self._stopping = True
        wait_s = self.shutdown_grace_s + 15.0 if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait_s
        self._stop_thread.set()
        if self._stop_process is not None:
            self._stop_process.value = 1
        self._supervisor.join(10)
        for thread, worker in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive() and worker.current is not None:  # stuck in a store call
                self._give_back(*worker.current)
        for proc, slot in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()  # SIGTERM: the worker gives back its attempt
                proc.join(self.shutdown_grace_s + 5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            current = slot.value.decode()
            if current:
                rollout_id, _, attempt_id = current.partition(" ")
                self._give_back(rollout_id, attempt_id)
        self._threads, self._procs, self._supervisor = [], [], None

    def _give_back(self, rollout_id: str, attempt_id: str) -> None:
        try:
            give_back(self.store, rollout_id, attempt_id)
        except Exception as exc:  # noqa: BLE001 - the watchdog of any runner re-queues it later
            logger.error("could not give back rollout %s (attempt %s): %s", rollout_id, attempt_id, exc)

    def close(self) -> None:
        """:meth:`stop`, then close the store if the runner opened it from a URL."""
        self.stop()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- helpers ------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether :meth:`start` was called and :meth:`stop` not yet."""
        return self._supervisor is not None

    def worker_pids(self) -> list[int]:
        """Process ids of the worker processes (empty in thread mode)."""
        return [p.pid for p, _ in self._procs if p.pid is not None]

    def run_until_done(self, rollout_ids: Sequence[str], timeout_s: float | None = None) -> list[Rollout]:
        """Start the runner if needed and wait until the rollouts are finished (see
        :func:`wait_for_rollouts`). The runner keeps running afterwards.

        Raises:
            RolloutTimeout: not all finished within ``timeout_s`` seconds.
            RunError: every worker process failed to start (see :meth:`check_workers`).
        """
        self.start()
        return wait_for_rollouts(self.store, rollout_ids, timeout_s, self.poll_s, self.check_workers)

    def run_forever(self) -> None:
        """Run until SIGTERM/SIGINT (or :meth:`stop` from another thread), then shut down cleanly.

        Call from the main thread (signal handlers can only be installed there).
        """
        import signal

        stop = threading.Event()
        previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            self.start()
            while not stop.wait(0.5) and self.running:
                pass
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.close()


def _store_url(store: TraceStore) -> str:
    """The URL process workers open for ``store``."""
    url = getattr(store, "url", None) or getattr(store, "base_url", None)
    if not isinstance(url, str):
        raise ConfigError(
            f"Runner(mode='process') cannot tell worker processes how to open {store!r}; pass its URL "
            "(a SQLite file, PostgreSQL or http(s) store server URL) as `store`"
        )
    if is_process_local(url):
        raise ConfigError(
            "Runner(mode='process') needs a store other processes can open; an in-memory SQLite store "
            "('sqlite://') lives in this process only. Use a file ('sqlite:///path/traces.db'), PostgreSQL, "
            "or an HTTP store server"
        )
    return url
