"""An engine pool: several engines behind one policy, every version loaded into each, calls spread by rollout.

:class:`EnginePool` stands where one engine stood (it is a :class:`~agentforge.ports.PolicyServer`), so the
hot-swapper, the store follower and the gateway work with a pool unchanged:

* **a hot-swap loads into every engine before the flip**: :meth:`EnginePool.load_adapter` loads the adapter
  into each serving engine in turn and, if one refuses it, unloads it from the others and raises, so the swap
  fails as it would on one engine and the alias never moves;
* **the router spreads the calls**: the versions the swapper registers carry the pool
  (:attr:`~agentforge.gateway.router.Upstream.pool`); for each call the router asks :meth:`EnginePool.route`
  for one engine, chosen by rendezvous hashing of the rollout id over the engines serving now, so every call
  of a rollout reaches the same engine (its prefix cache) while that engine serves, and losing one engine
  moves only its rollouts;
* **an engine that dies leaves the pool** at once (its process is gone) and calls go to the others; calls in
  flight on it fail with the gateway's clean 502. Its :class:`~agentforge.serving.supervise.EngineSupervisor`
  (one per engine, :meth:`EnginePool.member`) restarts it; it **rejoins** only after every version the pool
  serves is loaded into it again (:meth:`EnginePool.rejoin`) and, where its member was given a check
  (``agentforge serve`` passes :meth:`~agentforge.serving.hotswap.HotSwapper.canary_on_engine`), the served
  version's canary passed on it, so it never answers for a version it lacks or did not apply.

Rendezvous (highest-random-weight) hashing: Thaler & Ravishankar, "Using name-based mappings to increase hit
rates", IEEE/ACM Trans. Networking 6(1), 1998.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentforge.errors import ConfigError, ServingError

if TYPE_CHECKING:
    from agentforge.gateway.router import Upstream

__all__ = ["EnginePool", "PoolMember", "core_share"]

log = logging.getLogger(__name__)


@runtime_checkable
class _Launching(Protocol):
    """An engine that starts as a process: launched, then waited for (:class:`~agentforge.serving.vllm.
    VLLMServer`)."""

    def launch(self) -> None: ...

    def wait_started(self) -> None: ...


class EnginePool:
    """Engines of one base model serving one policy (see the module docstring).

    Args:
        engines: at least one engine (:class:`~agentforge.serving.vllm.VLLMServer` or
            :class:`~agentforge.serving.embedded.EmbeddedServer`), not started, all of the same base model.

    Attributes mirrored from the first engine (the hot-swapper reads them): ``base_model``,
    ``base_model_name``, ``max_lora_rank``, ``max_loras``, ``max_cpu_loras``, ``logprobs_mode``.

    Raises:
        ConfigError: no engine, or engines of different base models.
    """

    def __init__(self, engines: Sequence[Any]) -> None:
        if not engines:
            raise ConfigError("an engine pool needs at least one engine")
        models = {str(e.base_model) for e in engines}
        if len(models) > 1:
            raise ConfigError(f"an engine pool serves one base model, not {sorted(models)}")
        self.engines = list(engines)
        first = self.engines[0]
        self.base_model, self.max_lora_rank = first.base_model, first.max_lora_rank
        self.max_loras: int | None = getattr(first, "max_loras", None)
        self.max_cpu_loras: int | None = getattr(first, "max_cpu_loras", None)
        self.logprobs_mode: str | None = getattr(first, "logprobs_mode", None)
        self._lock = threading.RLock()  # loads, unloads and rejoins, one at a time
        self._adapters: dict[str, str] = {}  # name → adapter directory, in load order
        self._out: dict[int, str] = {}  # engines marked down → why (their supervisor restarts them)

    # -- the PolicyServer port -------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """The URL of the first engine that serves now (the first engine's when none does): where a version's
        canary goes, and the engine ``agentforge serve`` prints for a simulated customer."""
        return str(self._first().base_url)

    @property
    def base_model_name(self) -> str:
        return str(self.engines[0].base_model_name)

    @property
    def api_key(self) -> str | None:
        """The inference key of the engine :attr:`base_url` names."""
        return getattr(self._first(), "api_key", None)

    def auth_headers(self) -> dict[str, str]:
        """The inference headers of the engine :attr:`base_url` names."""
        return dict(self._first().auth_headers())

    def start(self) -> None:
        """Start every engine, from this thread (a vLLM dies with the thread that started it). Engines that
        start as a process (:class:`~agentforge.serving.vllm.VLLMServer`: ``launch`` and ``wait_started``)
        are all launched first and then waited for, so they start side by side (each on its share of the
        cores, :func:`core_share`) instead of one after the other; the others start in turn. Raises what an
        engine's start raises, after stopping every engine started or launched."""
        started = []
        try:
            for engine in self.engines:
                started.append(engine)
                if isinstance(engine, _Launching):
                    engine.launch()
                else:
                    engine.start()
            for engine in self.engines:
                if isinstance(engine, _Launching):
                    engine.wait_started()
        except BaseException:
            for engine in started:
                engine.stop()
            raise

    def stop(self) -> None:
        """Stop every engine (safe to call twice)."""
        for engine in self.engines:
            engine.stop()

    def load_adapter(self, name: str, path: str) -> None:
        """Load adapter ``name`` into every engine that serves now (one that is down gets it when it rejoins).

        Raises:
            ServingError: an engine refused it (it is unloaded again from the engines that took it).
        """
        with self._lock:
            loaded: list[int] = []
            for i in self._serving():
                try:
                    self.engines[i].load_adapter(name, path)
                except Exception as exc:
                    for j in loaded:
                        self._unload(j, name)
                    raise ServingError(f"pool engine {i} refused {name!r}: {exc}") from exc
                loaded.append(i)
            self._adapters[name] = str(path)

    def unload_adapter(self, name: str) -> None:
        """Unload adapter ``name`` from every running engine, in the pool or out of it (an engine that fails
        is logged, not raised: a rejoin unloads what the pool no longer serves)."""
        with self._lock:
            self._adapters.pop(name, None)
            for i, engine in enumerate(self.engines):
                if getattr(engine, "running", True):
                    self._unload(i, name)

    def adapters(self) -> list[str]:
        """Names of the adapters the pool serves (loaded into every engine that serves now)."""
        with self._lock:
            return sorted(self._adapters)

    # -- routing ------------------------------------------------------------------------------------------

    def route(self, upstream: Upstream, key: str | None, avoid: Collection[str] = ()) -> Upstream:
        """The engine that serves this call: ``upstream`` with one serving engine's URL and key.

        Args:
            upstream: the version's upstream as registered (its ``pool`` is this pool).
            key: the rollout id (every call of one rollout goes to one engine); ``None``: the first serving
                one.
            avoid: engine URLs (``base_url``) not to choose: ones that just refused this call's connection
                (the gateway sends it again to another engine, :meth:`agentforge.gateway.router.ModelRouter.
                acquire`).

        Raises:
            ServingError: no engine serves now, or only avoided ones (the gateway answers 503).
        """
        serving = [i for i in self._serving() if str(self.engines[i].base_url) not in avoid]
        if not serving:
            raise ServingError("no engine of the pool is serving (every one is down or restarting)")
        if key is None or len(serving) == 1:
            index = serving[0]
        else:
            index = max(serving, key=lambda i: hashlib.blake2b(f"{i}:{key}".encode(), digest_size=8).digest())
        return self.at(upstream, index)

    def each(self, upstream: Upstream) -> list[tuple[int, Upstream]]:
        """``(pool index, upstream on that engine)`` for every engine serving now, in pool order: a swap's
        canary checks every one (:meth:`agentforge.serving.canary.CanaryJudge.judge`), so no engine serves a
        version whose load it did not apply. Empty when none serves."""
        return [(i, self.at(upstream, i)) for i in self._serving()]

    def at(self, upstream: Upstream, index: int) -> Upstream:
        """``upstream`` on engine ``index`` (its URL and key), whether that engine serves now or not: where a
        rejoining engine's canary goes before it takes calls again."""
        engine = self.engines[index]
        return dataclasses.replace(
            upstream, base_url=engine.base_url, api_key=getattr(engine, "api_key", None), pool=None
        )

    def endpoints(self) -> list[str]:
        """Every engine's URL, in order (``/v1`` included)."""
        return [str(e.base_url) for e in self.engines]

    # -- an engine leaves and rejoins -----------------------------------------------------------------------

    def member(self, index: int, check: Callable[[int], object] | None = None) -> PoolMember:
        """What engine ``index``'s :class:`~agentforge.serving.supervise.EngineSupervisor` reloads and
        marks; ``check`` (called with ``index`` after the rejoin's loads, before the engine is marked back
        in; raising fails the rejoin) is typically :meth:`~agentforge.serving.hotswap.HotSwapper.
        canary_on_engine`."""
        return PoolMember(self, index, check)

    def mark(self, index: int, down: str | None) -> None:
        """Take engine ``index`` out of routing (``down``: why) or put it back (``None``)."""
        with self._lock:
            if down is None:
                self._out.pop(index, None)
            else:
                self._out[index] = down
        log.warning("pool engine %d %s", index, f"out: {down}" if down else "back in")

    def rejoin(self, index: int) -> list[str]:
        """Bring engine ``index`` (restarted, or kept out a while; still out of routing) to the pool's
        adapters: unload what the pool no longer serves, load what it lacks.

        Returns:
            The adapter names it serves, in load order.

        Raises:
            ServingError: a load failed (its supervisor retries the restart).
        """
        with self._lock:
            engine = self.engines[index]
            held = set(engine.adapters())
            for name in held - set(self._adapters):
                self._unload(index, name)
            for name, path in self._adapters.items():
                if name in held:
                    continue
                try:
                    engine.load_adapter(name, path)
                except Exception as exc:
                    raise ServingError(f"pool engine {index} could not load {name!r} again: {exc}") from exc
            return list(self._adapters)

    def engines_out(self) -> dict[int, str]:
        """The engines that take no calls now: pool index → why (what their supervisor marked, or that the
        process is not running). The gateway's ``/health`` reports them (:func:`agentforge.gateway.call.
        health_response`): 200 while another engine serves, 503 when none does."""
        out = dict(self._out)  # no lock: a rejoin holds it for seconds, and /health runs on the event loop
        for i, engine in enumerate(self.engines):
            if i not in out and not getattr(engine, "running", True):
                out[i] = "its process is not running"
        return dict(sorted(out.items()))

    def _serving(self) -> list[int]:
        """Indexes of the engines that take calls: not marked down, and their process (if any) alive."""
        return [
            i
            for i, engine in enumerate(self.engines)
            if i not in self._out and getattr(engine, "running", True)
        ]

    def _first(self) -> Any:
        serving = self._serving()
        return self.engines[serving[0] if serving else 0]

    def _unload(self, index: int, name: str) -> None:
        try:
            self.engines[index].unload_adapter(name)
        except Exception as exc:  # noqa: BLE001 - one engine's failed unload must not stop the others'
            log.warning("pool engine %d could not unload %s: %s", index, name, exc)

    def __enter__(self) -> EnginePool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class PoolMember:
    """One engine of a pool as its supervisor sees it: ``router.mark_engine`` marks it in the pool, ``reload``
    rejoins it (:meth:`EnginePool.rejoin`) and then runs ``check`` on it, if given."""

    def __init__(self, pool: EnginePool, index: int, check: Callable[[int], object] | None = None) -> None:
        self.pool, self.index, self.check = pool, index, check
        self.router = self  # the supervisor marks the engine down and up through ``router.mark_engine``

    def mark_engine(self, base_url: str, down: str | None) -> None:
        self.pool.mark(self.index, down)

    def reload(self) -> list[str]:
        """Load the pool's adapters into the engine, then check it (still out of routing).

        Raises:
            ServingError: a load or the check failed (the supervisor restarts the engine again; a failed check
                first unloads the adapters from the engine, so a later rejoin loads them anew).
        """
        names = self.pool.rejoin(self.index)
        if self.check is not None:
            try:
                self.check(self.index)
            except BaseException:  # what it holds is suspect: the next attempt loads every adapter anew
                for name in names:
                    self.pool._unload(self.index, name)
                raise
        return names


def core_share(cores: Sequence[int], index: int, count: int) -> str:
    """The CPU cores the ``index``-th of ``count`` vLLM-CPU engines binds its threads to
    (``VLLM_CPU_OMP_THREADS_BIND``): its slice of ``cores`` (``"0"`` and ``"1"`` for two engines on two cores,
    ``"0,1,2,3"``, … for four on sixteen; one core each, round robin, when there are more engines than cores).
    vLLM's automatic binding would put every engine's threads on the same first core.

    Raises:
        ConfigError: no cores, or an index outside ``range(count)``.
    """
    if not cores or not 0 <= index < count:
        raise ConfigError(f"core_share: engine {index} of {count} on cores {list(cores)}")
    ordered = sorted(cores)
    if count >= len(ordered):
        return str(ordered[index % len(ordered)])
    return ",".join(map(str, ordered[index * len(ordered) // count : (index + 1) * len(ordered) // count]))
