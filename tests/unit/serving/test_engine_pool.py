"""An engine pool behind one policy (issue 39 item 2), on two real embedded engines behind the real gateway.

A hot-swap loads the version into both engines before the flip (or into neither); the router sends every call
of a rollout to one engine and spreads rollouts over both; an engine taken out leaves its rollouts to the
other and rejoins only with every live version loaded; with no engine serving, calls get a clean 503.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES

from agentforge.errors import ServingError
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.scale.pool import EnginePool, core_share
from agentforge.serving.canary import ChatCanary
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.testing import memory_store

pytestmark = pytest.mark.slow  # two embedded engines load the default model


@pytest.fixture(scope="module")
def pool() -> Iterator[EnginePool]:
    with EnginePool([EmbeddedServer(), EmbeddedServer()]) as started:
        yield started


@pytest.fixture
def swapper(pool: EnginePool) -> Iterator[HotSwapper]:
    """A hot-swapper on the shared pool with its own router, back on the base model (drained) afterwards."""
    swapper = HotSwapper(pool, ModelRouter(), alias="policy")
    swapper.register_base()
    yield swapper
    swapper.reset_to_base()
    assert swapper.wait_drained(30)


def _ask(gateway: GatewayServer, rollout: str) -> httpx.Response:
    body = {"model": "policy", "messages": LETTER_MESSAGES, "max_tokens": 1, "temperature": 0.0}
    return httpx.post(f"{gateway.url}/rollouts/{rollout}/v1/chat/completions", json=body, timeout=60)


def test_a_swap_loads_into_every_engine_and_each_rollout_keeps_one_engine(
    pool: EnginePool, swapper: HotSwapper, letter_adapters: dict[str, Path]
) -> None:
    router = swapper.router
    store = memory_store()
    with GatewayServer(store, router) as gateway:
        a = swapper.swap(letter_adapters["A"])
        assert all(a in engine.adapters() for engine in pool.engines)  # loaded into both before the flip
        _, upstream = router.resolve("policy")
        rollouts = [f"ro-pool{i:02d}" for i in range(16)]
        engine_of = {r: pool.route(upstream, r).base_url for r in rollouts}
        assert set(engine_of.values()) == set(pool.endpoints())  # both engines take rollouts
        assert all(pool.route(upstream, r).base_url == engine_of[r] for r in rollouts)  # sticky
        for rollout in rollouts[:6]:
            answer = _ask(gateway, rollout)
            assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "A"

        # an engine refusing the next version: the swap fails, the other engine unloads it, the alias stays
        second = pool.engines[1]

        def refuse(name: str, path: str) -> None:
            raise ServingError("no slot")

        second.load_adapter = refuse  # type: ignore[method-assign]
        with pytest.raises(ServingError):
            swapper.swap(letter_adapters["B"])
        del second.load_adapter
        assert router.alias("policy") == a and pool.adapters() == [a]
        assert all(engine.adapters() == [a] for engine in pool.engines)

        # an engine that loads other weights under the new name: the canary runs on every engine and refuses
        real_load = second.load_adapter

        def load_other(name: str, path: str) -> None:
            real_load(name, letter_adapters["A"])

        second.load_adapter = load_other  # type: ignore[method-assign]
        expect_b = ChatCanary(LETTER_MESSAGES, expect=lambda text: text == "B")
        with pytest.raises(ServingError, match="on pool engine 1"):
            swapper.swap(letter_adapters["B"], canary=expect_b)
        del second.load_adapter
        assert router.alias("policy") == a and pool.adapters() == [a]
        assert all(engine.adapters() == [a] for engine in pool.engines)

        # engine 1 out: its rollouts move to engine 0, the others stay; a swap now loads into engine 0 only
        pool.mark(1, "test: down")
        assert {pool.route(upstream, r).base_url for r in rollouts} == {pool.endpoints()[0]}
        health = httpx.get(f"{gateway.url}/health")  # the replica still serves: a load balancer keeps it
        assert health.status_code == 200 and health.json()["pool_engines_out"][a] == {"1": "test: down"}
        b = swapper.swap(letter_adapters["B"])
        assert b in pool.engines[0].adapters() and b not in pool.engines[1].adapters()
        moved = [r for r in rollouts if engine_of[r] == pool.endpoints()[1]]
        assert _ask(gateway, moved[0]).json()["choices"][0]["message"]["content"] == "B"
        # it rejoins with every version the pool serves loaded, then takes its rollouts back
        assert pool.rejoin(1) == pool.adapters() and set(pool.engines[1].adapters()) == set(pool.adapters())
        pool.mark(1, None)
        assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
        assert pool.route(router.resolve("policy")[1], moved[0]).base_url == pool.endpoints()[1]
        assert _ask(gateway, moved[0]).json()["choices"][0]["message"]["content"] == "B"

        # no engine serving: a clean 503 that names why, nothing half-sent
        pool.mark(0, "test: down")
        pool.mark(1, "test: down")
        refused = _ask(gateway, rollouts[0])
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
        health = httpx.get(f"{gateway.url}/health")  # no engine serves: a load balancer takes the replica out
        assert (
            health.status_code == 503 and "no engine of its pool serves" in health.json()["engines_down"][b]
        )
        pool.mark(0, None)
        pool.mark(1, None)
        assert _ask(gateway, rollouts[0]).status_code == 200
    store.close()


def test_a_call_whose_engine_refuses_the_connection_goes_to_another_engine_of_the_pool(
    pool: EnginePool, swapper: HotSwapper, letter_adapters: dict[str, Path]
) -> None:
    """Engine 1 is still listed as serving but its port refuses connections (its process just died, before
    its supervisor marked it): its rollouts' calls are sent to engine 0 (nothing had been sent) and answered;
    with every engine refusing, a clean 503."""
    import socket
    from types import SimpleNamespace

    router, store, engines = swapper.router, memory_store(), list(pool.engines)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"  # nothing listens once it is closed
    try:
        with GatewayServer(store, router) as gateway:
            swapper.swap(letter_adapters["A"])
            upstream = router.resolve("policy")[1]
            rollouts = [f"ro-refused{i:02d}" for i in range(12)]
            on_second = [r for r in rollouts if pool.route(upstream, r).base_url == pool.endpoints()[1]]
            assert on_second
            pool.engines[1] = SimpleNamespace(base_url=dead, api_key=None, running=True)
            for rollout in on_second[:3]:
                answer = _ask(gateway, rollout)
                assert answer.status_code == 200, answer.text
                assert answer.json()["choices"][0]["message"]["content"] == "A"
            spans = [s for s in store.list_spans() if s.llm is not None]
            assert len(spans) == 3 and all(s.status == "ok" for s in spans)  # the refused tries sent nothing
            pool.engines[0] = SimpleNamespace(base_url=dead.replace("/v1", "/v2"), api_key=None, running=True)
            refused = _ask(gateway, on_second[0])
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
    finally:
        pool.engines[:] = engines
        store.close()


def test_a_rejoining_engine_takes_calls_only_once_the_served_versions_canary_passed_on_it(
    pool: EnginePool, swapper: HotSwapper, letter_adapters: dict[str, Path]
) -> None:
    from adapters import rank_adapter

    member = pool.member(1, check=swapper.canary_on_engine)
    pool.mark(1, "test: restarting")
    assert member.reload() == [] and swapper.canary_on_engine(1) is None  # the base model: nothing to check
    pool.mark(1, None)
    b = swapper.swap(letter_adapters["B"])
    second = pool.engines[1]
    real_load = second.load_adapter
    try:
        pool.mark(1, "test: restarting")  # as restarted: it holds no adapter
        second.unload_adapter(b)
        # an engine that takes the load but applies nothing (untrained LoRA): it answers like the base model
        untrained = rank_adapter(8)
        second.load_adapter = lambda name, path: real_load(name, untrained)  # type: ignore[method-assign]
        with pytest.raises(ServingError, match=f"pool engine 1 failed {b}'s canary.*answers like policy@v0"):
            member.reload()
        assert second.adapters() == []  # the suspect load is gone: the next rejoin loads it anew
        second.load_adapter = lambda name, path: None  # type: ignore[method-assign]  # takes nothing
        with pytest.raises(ServingError, match=f"pool engine 1 failed {b}'s canary"):
            member.reload()
        del second.load_adapter
        assert member.reload() == [b] and swapper.canary_on_engine(1) == b  # the real load passes
        pool.mark(1, None)
        assert pool.engines_out() == {}
    finally:
        if "load_adapter" in vars(second):
            del second.load_adapter
        pool.mark(1, None)


class _ProcessEngine:
    """Records what the pool asks of it, as a process-started engine (``launch`` then ``wait_started``)."""

    def __init__(self, name: str, calls: list[str], fail: str = "") -> None:
        self.name, self.calls, self.fail = name, calls, fail
        self.base_model, self.max_lora_rank = "m", 8

    def launch(self) -> None:
        self.calls.append(f"launch {self.name}")

    def wait_started(self) -> None:
        self.calls.append(f"wait {self.name}")
        if self.fail:
            raise ServingError(self.fail)

    def start(self) -> None:  # pragma: no cover - the pool must not start a process engine this way
        raise AssertionError("started one at a time")

    def stop(self) -> None:
        self.calls.append(f"stop {self.name}")


def test_process_engines_are_launched_side_by_side_and_all_stopped_if_one_fails() -> None:
    calls: list[str] = []
    EnginePool([_ProcessEngine("a", calls), _ProcessEngine("b", calls)]).start()
    assert calls == ["launch a", "launch b", "wait a", "wait b"]  # both launched before either is waited for
    calls.clear()
    pool = EnginePool([_ProcessEngine("a", calls), _ProcessEngine("b", calls, fail="no port")])
    with pytest.raises(ServingError, match="no port"):
        pool.start()
    assert calls == ["launch a", "launch b", "wait a", "wait b", "stop a", "stop b"]


def test_engines_split_the_cores() -> None:
    assert [core_share([0, 1], i, 2) for i in range(2)] == ["0", "1"]
    assert [core_share(range(16), i, 4) for i in range(4)][1] == "4,5,6,7"
    assert [core_share([0, 1], i, 3) for i in range(3)] == ["0", "1", "0"]
    with pytest.raises(Exception, match="engine 2 of 2"):
        core_share([0, 1], 2, 2)


def test_serve_splits_its_cores_over_its_engines_and_refuses_tenants_on_a_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from typer.testing import CliRunner

    from agentforge.cli import _engine_cores, app

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "4,5,6,7")  # a replica's share (serve --workers sets it)
    assert [_engine_cores(i, 2) for i in range(2)] == [
        {"VLLM_CPU_OMP_THREADS_BIND": "4,5"},
        {"VLLM_CPU_OMP_THREADS_BIND": "6,7"},
    ]
    assert _engine_cores(0, 1) == {}  # one engine: vLLM's own binding
    refused = CliRunner().invoke(app, ["serve", "--engines", "2", "--tenants", "--store-url", "sqlite://"])
    assert refused.exit_code == 2 and "--engines N with --tenants" in refused.output
