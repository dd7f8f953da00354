"""One worker: claim a queued rollout, run one attempt of the agent, record the outcome; repeat.

A worker is a thread (thread mode) or the main thread of a spawned process (process mode, entry
:func:`agentforge.runtime.process.worker_main`). Each attempt runs in its own daemon thread so the
worker can enforce the rollout's ``timeout_s`` and react to shutdown while the agent runs; a background :class:`Heartbeat`
thread refreshes the attempt's ``heartbeat_at`` every ``heartbeat_s`` seconds.

Outcomes (the store's ``finish_attempt`` applies the retry rule: a failed or timed-out attempt sends
the rollout back to ``queued`` while attempts are left):

* the agent returned → the reward (return value or scorer) is recorded, attempt ``succeeded``;
* the agent (or the scorer) raised → attempt ``failed`` with ``"<ExceptionType>: <message>"``; no
  reward is invented;
* ``timeout_s`` passed → attempt ``timed_out``. An ``async`` agent is cancelled; a **sync agent's thread
  cannot be killed** and is abandoned (it keeps running until it returns, its store writes refused,
  its gateway calls attributed to the dead attempt). Process mode is the robust choice for agents
  that may hang: there the worker process exits after such an attempt, taking the stuck thread with
  it, and the supervisor starts a fresh one;
* shutdown (``stop`` or SIGTERM/SIGINT) → the agent gets ``shutdown_grace_s`` seconds to finish, then
  the rollout is **given back** (:func:`give_back`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentforge.errors import NotFoundError, UserError
from agentforge.runtime.agents import reward_from_output, reward_parts
from agentforge.runtime.context import AttemptStore, EngineEndpoint, RolloutContext, SharedHttpClient
from agentforge.tracing import rollout_context
from agentforge.types import (
    ATTEMPT_ID_HEADER,
    Attempt,
    AttemptState,
    Reward,
    Rollout,
    RolloutState,
    rollout_base_url,
)

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = ["Worker", "Heartbeat", "give_back", "describe_error", "worker_id_for"]

logger = logging.getLogger("agentforge.runtime")

SHUTDOWN = "shutdown"


def worker_id_for(name: str) -> str:
    """``"<host>:<pid>:<name>"``: the id a worker claims with (``Attempt.worker_id``)."""
    return f"{socket.gethostname()}:{os.getpid()}:{name}"


def describe_error(exc: BaseException) -> str:
    """The message stored with a failed attempt: ``"<Type>: <message>"`` (HTTP status when known)."""
    status = getattr(exc, "status_code", None)
    prefix = f"{type(exc).__name__} (HTTP {status})" if isinstance(status, int) else type(exc).__name__
    text = str(exc) or repr(exc)
    return (
        f"{prefix}: {text}".replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")[:4000]
    )


def give_back(store: TraceStore, rollout_id: str, attempt_id: str, reason: str = SHUTDOWN) -> Rollout | None:
    """Return a running attempt's rollout to ``queued`` (used at shutdown).

    The attempt is finished as ``abandoned`` (atomically, so a rollout another worker has meanwhile
    re-claimed is never touched; its spans are then excluded by ``list_spans(valid_only=True)``). The
    store counts the abandoned attempt in ``Rollout.attempts`` (it has no way to un-count one), so a
    shutdown uses up one retry; when it was the rollout's **last** attempt, the store would mark the
    rollout failed, and this function puts it back to ``queued`` instead, so a shutdown never costs a
    rollout its final try.

    Returns:
        The rollout after the change, or ``None`` when the attempt was no longer running.
    """
    message = f"{reason}: attempt {attempt_id} given back by its worker"
    before = {a.attempt_id: a for a in store.list_attempts(rollout_id)}.get(attempt_id)
    if before is None or before.state is not AttemptState.running:
        return None
    rollout = store.finish_attempt(attempt_id, AttemptState.abandoned, message)
    if rollout.state is RolloutState.failed and rollout.error == message:
        rollout = store.update_rollout(rollout_id, state=RolloutState.queued)
    return rollout


class Heartbeat:
    """A daemon thread that heartbeats the tracked attempt every ``interval_s`` seconds.

    Args:
        store: the store.
        interval_s: seconds between heartbeats.
        name: thread name.
    """

    def __init__(self, store: TraceStore, interval_s: float, name: str = "agentforge-heartbeat") -> None:
        self.store, self.interval_s = store, interval_s
        self._attempt: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def track(self, attempt_id: str | None) -> None:
        """Heartbeat this attempt from now on (``None``: none). The claim itself set its first beat."""
        self._attempt = attempt_id

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            attempt_id = self._attempt
            if attempt_id is None:
                continue
            try:
                self.store.heartbeat(attempt_id)
            except Exception as exc:  # noqa: BLE001 - a missed beat is retried next interval
                logger.warning("heartbeat for attempt %s failed: %s", attempt_id, exc)


@dataclass
class _Outcome:
    kind: str  # "ok" | "error" | "timeout" | "shutdown"
    value: Any = None
    error: BaseException | None = None


class _AttemptThread(threading.Thread):
    """Runs ``agent(task, ctx)`` (awaiting it under ``asyncio.wait_for`` if it is a coroutine)."""

    def __init__(self, agent: Callable[..., Any], rollout: Rollout, ctx: RolloutContext) -> None:
        super().__init__(name=f"agentforge-attempt-{ctx.attempt_id}", daemon=True)
        self.agent, self.rollout, self.ctx = agent, rollout, ctx
        self.outcome: _Outcome | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            with rollout_context(self.ctx.store, self.ctx.rollout_id, self.ctx.attempt_id):
                result = self.agent(self.rollout.task, self.ctx)
                if inspect.isawaitable(result):
                    result = asyncio.run(_bounded(result, self.rollout.timeout_s))
            self.outcome = _Outcome("ok", result)
        except _Expired as exc:
            self.outcome = _Outcome("timeout", error=exc)
        except BaseException as exc:  # noqa: BLE001 - everything the agent raises fails the attempt
            self.outcome = _Outcome("error", error=exc)
        finally:
            self.done.set()


class _Expired(Exception):
    """The attempt's own time limit expired (told apart from a ``TimeoutError`` the agent raises)."""


async def _bounded(awaitable: Any, timeout_s: float) -> Any:
    """Await ``awaitable``, cancelling it after ``timeout_s`` seconds (then raise :class:`_Expired`)."""
    limit = asyncio.timeout(timeout_s)
    try:
        async with limit:
            return await awaitable
    except TimeoutError:
        if limit.expired():
            raise _Expired(f"cancelled after {timeout_s:g} s") from None
        raise


class Worker:
    """Claims rollouts and runs their attempts until ``stop_event`` is set.

    Args:
        store: the trace store (shared by the worker, its heartbeat and its attempts).
        agent: the agent callable (see :mod:`agentforge.runtime.agents`).
        gateway_url: the gateway root, e.g. ``http://127.0.0.1:8000``.
        stop_event: set it to stop (anything with ``is_set()`` and ``wait(timeout)``).
        name: the worker's name within its process (the worker id adds host and pid).
        heartbeat_s: seconds between heartbeats.
        poll_s: seconds to wait before claiming again when nothing is queued.
        shutdown_grace_s: at shutdown, seconds the running attempt may still take before it is given back.
        scorer: ``(task, output) -> reward`` or ``None``.
        agent_name: claim only rollouts with this ``Rollout.agent``.
        gateway_api_key: the gateway's API key, handed to the agent.
        on_attempt: called with ``(rollout_id, attempt_id)`` when an attempt starts and ``(None, None)``
            when it is over (process mode publishes it to the supervisor).
        recycle_on_abandon: stop the worker after an attempt whose agent thread had to be abandoned
            (a sync agent past its timeout) and set :attr:`recycle`; process mode then ends the process,
            taking the stuck thread with it, and the supervisor starts a fresh one.
        engine: the engine's own address, handed to the agent as ``ctx.engine`` (``None``: unknown).
    """

    def __init__(
        self,
        store: TraceStore,
        agent: Callable[..., Any],
        gateway_url: str,
        stop_event: Any,
        *,
        name: str = "w0",
        heartbeat_s: float = 2.0,
        poll_s: float = 0.2,
        shutdown_grace_s: float = 5.0,
        scorer: Callable[..., Any] | None = None,
        agent_name: str | None = None,
        gateway_api_key: str | None = None,
        on_attempt: Callable[[str | None, str | None], None] | None = None,
        recycle_on_abandon: bool = False,
        engine: EngineEndpoint | None = None,
    ) -> None:
        self.store, self.agent, self.gateway_url = store, agent, gateway_url.rstrip("/")
        self.stop_event, self.worker_id = stop_event, worker_id_for(name)
        self.heartbeat_s, self.poll_s, self.shutdown_grace_s = heartbeat_s, poll_s, shutdown_grace_s
        self.scorer, self.agent_name, self.gateway_api_key = scorer, agent_name, gateway_api_key
        self.on_attempt, self.recycle_on_abandon, self.engine = on_attempt, recycle_on_abandon, engine
        self.recycle = False
        self.http = SharedHttpClient()
        self.current: tuple[str, str] | None = None
        self.finished = 0

    def run(self) -> None:
        """Claim and run rollouts until stopped. Store errors are logged and retried after ``poll_s``."""
        self.http.get()  # import openai and build the client now, not while an attempt's heartbeat counts
        heartbeat = Heartbeat(
            self.store, self.heartbeat_s, name=f"agentforge-heartbeat-{self.worker_id}"
        ).start()
        try:
            while not self.stop_event.is_set():
                try:
                    claimed = self.store.claim_rollout(self.worker_id, agent=self.agent_name)
                except Exception as exc:  # noqa: BLE001 - store down: wait and retry
                    logger.warning("worker %s could not claim a rollout: %s", self.worker_id, exc)
                    claimed = None
                if claimed is None:
                    self.stop_event.wait(self.poll_s)
                    continue
                self.run_attempt(*claimed, heartbeat)
                if self.recycle:
                    break
        finally:
            heartbeat.stop()
            self.http.shutdown()

    def run_attempt(self, rollout: Rollout, attempt: Attempt, heartbeat: Heartbeat) -> AttemptState | None:
        """Run one claimed attempt to its end and record the outcome.

        Returns:
            The attempt's final state, or ``None`` when it was given back at shutdown.
        """
        rid, aid = rollout.rollout_id, attempt.attempt_id
        guard = AttemptStore(self.store, aid)
        ctx = RolloutContext(
            store=guard,  # type: ignore[arg-type]
            rollout_id=rid,
            attempt_id=aid,
            base_url=rollout_base_url(self.gateway_url, rid),
            resources=dict(rollout.resources),
            default_headers={ATTEMPT_ID_HEADER: aid},
            api_key=self.gateway_api_key or "agentforge-no-key",
            rollout=rollout,
            worker_id=self.worker_id,
            timeout_s=rollout.timeout_s,
            http_client=self.http.get(),
            engine=self.engine,
        )
        self.current = (rid, aid)
        heartbeat.track(aid)
        if self.on_attempt is not None:
            self.on_attempt(rid, aid)
        thread = _AttemptThread(self.agent, rollout, ctx)
        try:
            outcome = self._wait(thread, rollout.timeout_s)
            return self._record(rollout, attempt, guard, outcome)
        except Exception as exc:  # noqa: BLE001 - the store failed; the heartbeat watchdog re-queues it
            logger.error("worker %s could not record attempt %s of %s: %s", self.worker_id, aid, rid, exc)
            return None
        finally:
            guard.close("the attempt is over")
            if thread.is_alive() and self.recycle_on_abandon:
                logger.warning(
                    "worker %s abandoned a stuck agent thread; the worker will be recycled", self.worker_id
                )
                self.recycle = True
            heartbeat.track(None)
            self.current = None
            self.finished += 1
            if self.on_attempt is not None:
                self.on_attempt(None, None)

    def _wait(self, thread: _AttemptThread, timeout_s: float) -> _Outcome:
        """Start the attempt thread and wait for it, the timeout, or shutdown (+ grace)."""
        thread.start()
        deadline = time.monotonic() + timeout_s
        grace_end: float | None = None
        while True:
            if self.stop_event.is_set() and grace_end is None:
                grace_end = time.monotonic() + self.shutdown_grace_s
            ends = [deadline] if grace_end is None else [deadline, grace_end]
            if thread.done.wait(max(0.0, min(min(ends) - time.monotonic(), 0.05))):
                assert thread.outcome is not None
                return thread.outcome
            t = time.monotonic()
            if t >= deadline:
                return _Outcome("timeout")
            if grace_end is not None and t >= grace_end:
                return _Outcome(SHUTDOWN)

    def _record(
        self, rollout: Rollout, attempt: Attempt, guard: AttemptStore, outcome: _Outcome
    ) -> AttemptState | None:
        rid, aid = rollout.rollout_id, attempt.attempt_id
        if outcome.kind == "ok":
            try:
                self._reward(rollout, aid, outcome.value)
            except Exception as exc:  # noqa: BLE001 - a broken scorer fails the attempt
                outcome = _Outcome("error", error=exc)
        if outcome.kind == SHUTDOWN:
            guard.close(SHUTDOWN)
            give_back(self.store, rid, aid)
            return None
        if outcome.kind == "ok":
            guard.close("succeeded")
            self.store.finish_attempt(aid, AttemptState.succeeded)
            return AttemptState.succeeded
        if outcome.kind == "timeout":
            guard.close(f"timed out after {rollout.timeout_s:g} s")
            message = (
                f"RolloutTimeout: attempt {attempt.number} ran longer than timeout_s={rollout.timeout_s:g} s"
            )
            self.store.finish_attempt(aid, AttemptState.timed_out, message)
            return AttemptState.timed_out
        assert outcome.error is not None
        guard.close("failed")
        self.store.finish_attempt(aid, AttemptState.failed, describe_error(outcome.error))
        return AttemptState.failed

    def _reward(self, rollout: Rollout, attempt_id: str, output: Any) -> None:
        """Record the reward from the scorer or the return value (nothing if there is none), with the named
        parts of a ``{"reward": ..., **parts}`` result in its metadata (see :func:`reward_parts`)."""
        if self.scorer is not None:
            result, source = self.scorer(rollout.task, output), "scorer"
            if isinstance(result, Mapping) and "reward" in result:
                has, value = reward_from_output(result)
            elif result is None or isinstance(result, int | float):
                has, value = True, result
            else:
                raise UserError(
                    f"the scorer returned {result!r}; a reward must be a number, None or a dict with 'reward'"
                )
        else:
            result, source = output, "agent"
            has, value = reward_from_output(output)
        if not has or not _still_running(self.store, rollout.rollout_id, attempt_id):
            return
        metadata = reward_parts(result)
        if metadata.get("unscored_keys"):
            logger.warning(
                "rollout %s: the %s's reward came with non-number keys %s; they are not reward parts "
                "(only their names are stored)",
                rollout.rollout_id,
                source,
                ", ".join(metadata["unscored_keys"]),
            )
        self.store.add_reward(
            Reward(
                rollout_id=rollout.rollout_id,
                attempt_id=attempt_id,
                value=value,
                final=True,
                source=source,
                metadata=metadata,
            )
        )


def _still_running(store: TraceStore, rollout_id: str, attempt_id: str) -> bool:
    """Whether the attempt is still running (not abandoned by the heartbeat watchdog meanwhile)."""
    for att in store.list_attempts(rollout_id):
        if att.attempt_id == attempt_id:
            return att.state is AttemptState.running
    raise NotFoundError(f"attempt {attempt_id!r} is not an attempt of rollout {rollout_id!r}")
