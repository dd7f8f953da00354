"""Probation on a real engine (the embedded one) behind the real gateway: a new version's first calls reach it
together with its canary, their answers are held until the verdict, and a failed canary's held calls are
served by the old version (plain, streamed and token-in continued calls alike)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from probation_helpers import KINDS, swap_with_held_calls

from agentforge.gateway.prefix import CONTINUED
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper

pytestmark = pytest.mark.slow


@pytest.fixture
def swapper(letter_adapters: dict[str, Path], serving_router: ModelRouter) -> Iterator[HotSwapper]:
    server = EmbeddedServer()
    server.start()
    swapper = HotSwapper(server, serving_router, "held", drain_timeout_s=60)
    swapper.register_base()
    swapper.swap(letter_adapters["A"])
    yield swapper
    server.stop()


def test_held_answers_wait_for_the_canary_and_then_come_from_the_new_version(
    swapper: HotSwapper, serving_gateway: GatewayServer, letter_adapters: dict[str, Path]
) -> None:
    seen = swap_with_held_calls(swapper, serving_gateway, letter_adapters["B"], "B", passes=True)
    assert seen.error is None and not seen.failures, (seen.error, seen.failures)
    assert seen.held == len(KINDS) and seen.seen_at_verdict == 0  # no client had an answer before it
    assert seen.answers["plain"] == seen.answers["stream"] == "B"
    assert {kind: span.llm.version for kind, span in seen.spans.items()} == dict.fromkeys(KINDS, seen.new)
    assert CONTINUED in seen.spans["continued"].llm.flags
    assert swapper.router.alias("held") == seen.new and swapper.router.probation(seen.new) is None


def test_a_failed_canary_serves_its_held_calls_by_the_old_version(
    swapper: HotSwapper, serving_gateway: GatewayServer, letter_adapters: dict[str, Path]
) -> None:
    seen = swap_with_held_calls(swapper, serving_gateway, letter_adapters["B"], "B", passes=False)
    assert seen.error is not None and "on purpose" in str(seen.error)
    assert not seen.failures, seen.failures  # the clients never saw the failure
    assert seen.held == len(KINDS) and seen.seen_at_verdict == 0
    assert seen.answers["plain"] == seen.answers["stream"] == "A"  # the old version's answer, not "B"
    assert {kind: span.llm.version for kind, span in seen.spans.items()} == dict.fromkeys(KINDS, seen.old)
    assert all(span.status == "ok" for span in seen.spans.values())
    assert CONTINUED in seen.spans["continued"].llm.flags
    router = swapper.router
    assert router.alias("held") == seen.old and swapper.live_versions() == [seen.old]
    assert router.probation(seen.new) is None and seen.new not in router.models()  # drained, unloaded
