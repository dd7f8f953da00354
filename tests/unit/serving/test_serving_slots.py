"""Adapter slots (issue 16, handed over): loaded versions stay within the engine's capacity, a version with
requests in flight is never unloaded, a swap without a free slot waits or fails loudly, and a capacity that
cannot hold ``max_staleness + 1`` versions plus the one being loaded is refused at start.

The engine is a bookkeeping ``FakeServer`` that checks both invariants on every load and unload; the router and
the hot-swapper are the real ones.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from adapters import rank_adapter
from serving_helpers import FakeServer

from agentforge.errors import ConfigError, ServingError
from agentforge.gateway.router import ModelRouter
from agentforge.serving.canary import CanaryResult
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.vllm import VLLMServer


class CheckedServer(FakeServer):
    """Fails the test if a load goes above ``max_cpu_loras`` or an unload hits a version with requests in flight."""

    def __init__(self, router: ModelRouter, max_loras: int, max_cpu_loras: int) -> None:
        super().__init__(max_loras, max_cpu_loras)
        self.router, self.violations, self.unloaded = router, [], []

    def load_adapter(self, name: str, path: str) -> None:
        super().load_adapter(name, path)
        if len(self.loaded) > self.max_cpu_loras:
            self.violations.append(f"{len(self.loaded)} loaded > {self.max_cpu_loras}: {self.loaded}")

    def unload_adapter(self, name: str) -> None:
        if self.router.inflight(name):
            self.violations.append(f"unloaded {name} with {self.router.inflight(name)} requests in flight")
        self.unloaded.append(name)
        super().unload_adapter(name)


def ok(upstream):  # type: ignore[no-untyped-def]
    return CanaryResult("ok", [1])


def test_capacity_that_cannot_hold_the_staleness_window_is_refused() -> None:
    router = ModelRouter()
    with pytest.raises(ConfigError, match=r"needs 3 served versions plus the one being loaded = 4"):
        HotSwapper(FakeServer(2, 3), router, retain=2, canary=ok)
    assert HotSwapper(FakeServer(2, 3), router, retain=1, canary=ok).capacity == 3
    assert HotSwapper(FakeServer(2), router, canary=ok).capacity == 2  # no --max-cpu-loras: --max-loras
    python = Path(sys.executable)
    with pytest.raises(ConfigError, match="max_cpu_loras=1 must be >= max_loras=2"):
        VLLMServer(python=python, max_loras=2, max_cpu_loras=1)
    command = VLLMServer(python=python, max_loras=2, max_cpu_loras=3).command()
    assert command[command.index("--max-cpu-loras") + 1] == "3"


def test_v1_to_v6_with_a_slow_request_on_v2() -> None:
    """max_loras=2, max_cpu_loras=3, max_staleness=1: the trainer publishes v1…v6 while a request on v2 runs."""
    router = ModelRouter()
    server = CheckedServer(router, max_loras=2, max_cpu_loras=3)
    swapper = HotSwapper(server, router, retain=1, slot_wait_s=0.3, canary=ok, drain_timeout_s=30)
    swapper.register_base()
    adapter = rank_adapter(8)
    assert [swapper.swap(adapter) for _ in range(2)] == ["policy@v1", "policy@v2"]
    version, _ = router.acquire("policy")  # the slow streamed request starts on v2
    assert version == "policy@v2"
    assert swapper.swap(adapter) == "policy@v3"  # v1 drains and unloads; v2 is kept (retain=1), then drains
    assert swapper.swap(adapter) == "policy@v4"
    assert "policy@v2" in server.loaded and router.resolve("policy@v2")[0] == "policy@v2"  # still routable
    with pytest.raises(ServingError, match=r"holds 3 adapters .*policy@v5 was not loaded"):
        swapper.swap(adapter)  # v2, v3 (retained), v4 fill the engine and v2 cannot drain: fail loudly
    assert router.alias("policy") == "policy@v4" and "policy@v5" not in server.loaded

    release = threading.Timer(0.5, router.release, args=("policy@v2",))  # the slow request finishes
    release.start()
    swapper.slot_wait_s = 10.0
    started = time.monotonic()
    assert swapper.swap(adapter) == "policy@v5"  # waits for v2's drain instead of failing (name not burnt)
    assert 0.3 < time.monotonic() - started < 10
    assert swapper.swap(adapter) == "policy@v6"
    assert swapper.wait_drained(10) and not swapper.errors
    assert server.violations == []
    assert server.unloaded == ["policy@v1", "policy@v2", "policy@v3", "policy@v4"]
    assert server.loaded == ["policy@v5", "policy@v6"] and router.alias("policy") == "policy@v6"


def test_a_version_whose_drain_timed_out_is_drained_again_when_its_slot_is_needed() -> None:
    router = ModelRouter()
    server = CheckedServer(router, max_loras=2, max_cpu_loras=2)
    swapper = HotSwapper(server, router, slot_wait_s=5.0, canary=ok, drain_timeout_s=0.2)
    swapper.register_base()
    adapter = rank_adapter(8)
    assert swapper.swap(adapter) == "policy@v1"
    router.acquire("policy")  # a request on v1 outlives the drain timeout
    assert swapper.swap(adapter) == "policy@v2"
    assert swapper.wait_drained(5) and "still in flight" in str(swapper.errors[0])
    assert server.loaded == ["policy@v1", "policy@v2"]  # kept: it still had a request
    router.release("policy@v1")
    assert swapper.swap(adapter) == "policy@v3"  # needs v1's slot: v1 is drained again and unloaded
    assert swapper.wait_drained(5)
    assert server.violations == [] and server.loaded == ["policy@v3"]
