"""Keep the vLLM process alive under ``agentforge serve``: notice its death, report it, restart it, reload versions.

:class:`EngineSupervisor` watches a started :class:`~agentforge.serving.vllm.VLLMServer` from one long-lived
thread. When the process is gone (killed, crashed, OOM-killed), within ``poll_s`` seconds it

1. logs it (``ERROR``, with the exit code) and marks the engine down in the gateway's router, so the gateway's
   ``/health`` answers 503 naming the versions that engine serves (requests meanwhile get a clean 503
   ``engine_unavailable``: nothing reached the engine, so a load balancer may retry them elsewhere);
2. stops what is left of vLLM's process group (engine-core and worker processes outlive a killed API server
   and hold gigabytes), so nothing runs on orphaned;
3. starts vLLM again (same port, new keys) and has the :class:`~agentforge.serving.hotswap.HotSwapper` load
   every live adapter version again under its own name, canary on the alias target, aliases unchanged
   (``on_stopped``, if given, hears of the stop before the new start: ``agentforge serve --tenants`` passes
   :meth:`~agentforge.serving.tenants.TenantAdapters.engine_lost`, so each tenant's next call loads its version
   into the new engine);
4. marks the engine up; requests succeed again; ``on_restart`` (if given) hears of the new engine (its key is
   new at each start: ``agentforge serve`` prints the engine line again).

A restart that fails is retried after ``backoff_s`` (doubling, at most 60 s); after ``max_restarts`` failed
attempts in a row it gives up, logs ``CRITICAL`` and leaves the engine marked down.

Linux ties vLLM's parent-death signal to the thread that started it (see ``vllm._die_with_parent``): a restarted
vLLM is started from the supervisor's thread, which lives until :meth:`EngineSupervisor.stop`, so stop the
supervisor only when the engine is being stopped too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol, Self

from agentforge.errors import AgentForgeError, ConfigError
from agentforge.serving.polling import PollingThread

if TYPE_CHECKING:
    from agentforge.serving.vllm import VLLMServer

__all__ = ["EngineSupervisor", "Reloader"]

log = logging.getLogger(__name__)

State = Literal["up", "restarting", "failed", "stopped"]


class _EngineMarks(Protocol):
    def mark_engine(self, base_url: str, down: str | None) -> None: ...


class Reloader(Protocol):
    """What a supervisor reports to and reloads through: a :class:`~agentforge.serving.hotswap.HotSwapper`
    (its router marks the engine; ``reload`` loads every live version again), or one engine of a pool
    (:meth:`agentforge.scale.pool.EnginePool.member`: marks it in the pool, loads the pool's adapters into
    it)."""

    @property
    def router(self) -> _EngineMarks: ...

    def reload(self) -> list[str]: ...


class EngineSupervisor(PollingThread):
    """Restart a dead vLLM process and reload its adapter versions (see the module docstring).

    Args:
        server: the started engine (a :class:`~agentforge.serving.vllm.VLLMServer` this process owns).
        swapper: the engine's hot-swapper (its router is the gateway's), or one engine of a pool
            (:meth:`agentforge.scale.pool.EnginePool.member`).
        poll_s: seconds between liveness checks (the delay before a death is noticed).
        max_restarts: failed restart attempts in a row before giving up.
        backoff_s: seconds before the second attempt (doubling, at most 60 s).
        on_restart: called with the server after each successful restart (on the supervisor's thread; an
            exception it raises is logged and ignored).
        on_stopped: called without arguments in each restart attempt once the dead engine's process group is
            stopped, before the new engine starts (on the supervisor's thread; an exception it raises fails that
            attempt).

    Attributes:
        state: ``"up"``, ``"restarting"``, ``"failed"`` (gave up) or ``"stopped"``.
        restarts: successful restarts so far.
        last_exit_code: the exit code of the last death (negative: the signal that killed it).

    Raises:
        ConfigError: ``poll_s`` or ``backoff_s`` is not positive, or ``max_restarts`` is below 1.
    """

    def __init__(
        self,
        server: VLLMServer,
        swapper: Reloader,
        *,
        poll_s: float = 1.0,
        max_restarts: int = 5,
        backoff_s: float = 2.0,
        on_restart: Callable[[VLLMServer], object] | None = None,
        on_stopped: Callable[[], object] | None = None,
    ) -> None:
        if poll_s <= 0 or backoff_s <= 0 or max_restarts < 1:
            raise ConfigError(
                f"poll_s={poll_s} and backoff_s={backoff_s} must be > 0 seconds, max_restarts={max_restarts} >= 1"
            )
        super().__init__(poll_s, name="engine-supervisor")
        self.server, self.swapper, self.on_restart = server, swapper, on_restart
        self.on_stopped = on_stopped
        self.max_restarts, self.backoff_s = max_restarts, backoff_s
        self.state: State = "stopped"
        self.restarts = 0
        self.last_exit_code: int | None = None

    def start(self) -> Self:
        """Watch the engine from a daemon thread.

        Raises:
            ConfigError: the server was not started by this process (nothing to restart).
        """
        if self.server.pid is None:
            raise ConfigError(
                "EngineSupervisor needs a VLLMServer started by this process (call start() first)"
            )
        self.state = "up"
        return super().start()

    def stop(self) -> None:
        """Stop watching (safe to call twice); the engine itself is left as it is."""
        super().stop()
        self.state = "stopped"

    def poll(self) -> None:
        """One liveness check (on the supervisor's thread): recover a dead engine."""
        if self.state == "up" and not self.server.running:
            self._recover()

    def _recover(self) -> None:
        """The engine died: report it, clear its process group, restart it and reload the versions."""
        pid, code = self.server.pid, self.server.exit_code
        self.last_exit_code, self.state = code, "restarting"
        url, router = self.server.base_url, self.swapper.router
        log.error(
            "vLLM (pid %s) exited with code %s; stopping its process group and restarting it", pid, code
        )
        router.mark_engine(url, f"engine exited with code {code}; restarting")
        delay = self.backoff_s
        for attempt in range(1, self.max_restarts + 1):
            if self._stop.is_set():
                return
            t0 = time.monotonic()
            try:
                self.server.stop(grace_s=5)  # the dead API server's engine and workers go with its group
                if self.on_stopped is not None:
                    self.on_stopped()
                self.server.start()
                reloaded = self.swapper.reload()
            except (AgentForgeError, OSError) as exc:
                log.error("restart %d/%d of vLLM failed: %s", attempt, self.max_restarts, exc)
                router.mark_engine(url, f"engine exited with code {code}; restart {attempt} failed")
                if self._stop.wait(delay):
                    return
                delay = min(60.0, delay * 2)
                continue
            self.restarts += 1
            self.state = "up"
            router.mark_engine(url, None)
            log.warning(
                "vLLM restarted in %.0f s (pid %s); versions loaded again: %s",
                time.monotonic() - t0,
                self.server.pid,
                ", ".join(reloaded) or "none (base model only)",
            )
            if self.on_restart is not None:
                try:
                    self.on_restart(self.server)
                except Exception:  # noqa: BLE001 - a reporting hook must not undo the restart
                    log.exception("on_restart hook failed")
            return
        self.state = "failed"
        router.mark_engine(url, f"engine exited with code {code}; gave up after {self.max_restarts} restarts")
        log.critical(
            "vLLM could not be restarted after %d attempts; the gateway answers 502", self.max_restarts
        )
