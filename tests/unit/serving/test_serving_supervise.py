"""EngineSupervisor with a real process group standing in for vLLM, the real HotSwapper, router and gateway.

The stand-in engine (``serving_helpers.ProcessEngine``) is ``sh`` with two ``sleep`` children in their own
process group (like vLLM's API server and its engine core); killing the leader with SIGKILL leaves the children
running until the supervisor clears the group. The real-vLLM versions of these tests are
``tests/integration/test_serving_restart_vllm.py`` and ``test_serving_swap_kill_vllm.py``.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import httpx
import pytest
from adapters import rank_adapter
from serving_helpers import ProcessEngine, alive, process_group, wait_for

from agentforge.errors import ConfigError, ServingError
from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter
from agentforge.serving.canary import CanaryResult
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.supervise import EngineSupervisor
from agentforge.testing import memory_store


def ok_canary(upstream):  # type: ignore[no-untyped-def]
    return CanaryResult("ok", [1])


@pytest.fixture
def stack():  # type: ignore[no-untyped-def]
    engine = ProcessEngine()
    engine.start()
    router = ModelRouter()
    swapper = HotSwapper(engine, router, canary=ok_canary)
    swapper.register_base()
    version = swapper.swap(rank_adapter(8))
    store = memory_store()
    yield engine, router, swapper, version, create_gateway(store, router)
    engine.stop()
    store.close()


async def health(app) -> httpx.Response:  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        return await client.get("/health")


async def test_a_killed_engine_is_reported_cleared_restarted_and_reloaded(stack, caplog) -> None:  # type: ignore[no-untyped-def]
    engine, router, swapper, version, app = stack
    assert (await health(app)).json() == {"status": "ok"}
    old = process_group(engine.pid)
    assert len(old) == 3 and engine.loaded == [version]
    with caplog.at_level(logging.WARNING, logger="agentforge.serving.supervise"):
        restarted: list[object] = []
        with EngineSupervisor(engine, swapper, poll_s=0.05, on_restart=restarted.append) as supervisor:
            os.kill(engine.pid, signal.SIGKILL)
            killed = time.monotonic()
            wait_for(lambda: supervisor.state == "restarting", 5, "the supervisor to notice")
            down = await health(app)
            assert down.status_code == 503 and down.json() == {
                "status": "degraded",
                "engines_down": {v: "engine exited with code -9; restarting" for v in ("policy@v0", version)},
            }
            wait_for(lambda: supervisor.restarts == 1 and supervisor.state == "up", 30, "the restart")
            # restarted at once (a busy host is slow to spawn), not after a long back-off
            assert time.monotonic() - killed < 20
            assert restarted == [engine]  # serve prints the engine's new key from this hook
        assert not any(alive(pid) for pid in old)  # the orphaned children went with the group
        assert engine.starts == 2 and engine.loaded == [version]  # the live version is loaded again
        assert router.alias("policy") == version
        assert router.resolve(version)[1].api_key == engine.api_key
        assert (await health(app)).json() == {"status": "ok"}
    messages = [r.getMessage() for r in caplog.records]
    assert any("exited with code -9" in m for m in messages)
    assert any(f"versions loaded again: {version}" in m for m in messages)


async def test_gives_up_after_max_restarts_and_stays_reported_down(stack, caplog) -> None:  # type: ignore[no-untyped-def]
    engine, router, swapper, version, app = stack
    engine.start_s, engine.fail_starts = 0.0, True
    with EngineSupervisor(engine, swapper, poll_s=0.05, max_restarts=2, backoff_s=0.05) as supervisor:
        os.kill(engine.pid, signal.SIGKILL)
        wait_for(lambda: supervisor.state == "failed", 10, "the supervisor to give up")
    down = await health(app)
    assert down.status_code == 503
    assert set(down.json()["engines_down"].values()) == {
        "engine exited with code -9; gave up after 2 restarts"
    }


def test_needs_a_started_engine_and_sane_timing() -> None:
    engine = ProcessEngine()
    swapper = HotSwapper(engine, ModelRouter(), canary=ok_canary)
    with pytest.raises(ConfigError, match="started by this process"):
        EngineSupervisor(engine, swapper).start()
    with pytest.raises(ConfigError, match="poll_s"):
        EngineSupervisor(engine, swapper, poll_s=0)


async def test_engine_killed_during_a_hot_swap(stack) -> None:  # type: ignore[no-untyped-def]
    """The engine dies while loading a new version: the swap fails, the old version keeps the alias, the store
    never lists the new version as active, and the restart serves the old version again."""
    from agentforge.serving.publisher import HotSwapPublisher

    engine, router, swapper, version, app = stack
    from agentforge.types import ResourceVersion

    store = memory_store()  # the store says what serves now: v1, active
    store.publish_resource(
        ResourceVersion(name="policy", kind="adapter", payload={"path": str(rank_adapter(8))})
    )
    publisher = HotSwapPublisher(swapper, store)
    load = engine.load_adapter

    def dying_load(name: str, path: str) -> None:
        os.killpg(engine.pid, signal.SIGKILL)
        engine._proc.wait(5)
        raise ServingError(f"vLLM failed on /load_lora_adapter for {name}: connection refused")

    with EngineSupervisor(engine, swapper, poll_s=0.05) as supervisor:
        engine.load_adapter = dying_load  # type: ignore[method-assign]
        with pytest.raises(ServingError, match="connection refused"):
            publisher.publish(rank_adapter(8), step=1)
        engine.load_adapter = load  # type: ignore[method-assign]
        assert router.alias("policy") == version
        assert [(r.ref, r.active) for r in store.list_resources("policy")] == [
            (version, True),
            ("policy@v2", False),  # published for the swap, never activated
        ]
        wait_for(lambda: supervisor.restarts == 1 and supervisor.state == "up", 10, "the restart")
    assert engine.loaded == [version] and swapper.live_versions() == [version]
    assert (await health(app)).json() == {"status": "ok"}
    store.close()
