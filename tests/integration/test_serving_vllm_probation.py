"""Probation on the real vLLM server: a new version takes the alias's calls while its canary runs, its answers
held by the gateway until the verdict; a failed canary's held calls are served by the old version."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES
from probation_helpers import KINDS, swap_with_held_calls
from serving_helpers import ask_letter, llm_spans, new_rollout

from agentforge.errors import ServingError
from agentforge.gateway.prefix import CONTINUED
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import CanaryResult, ChatCanary, HotSwapper
from agentforge.serving.vllm import VLLMServer

pytestmark = pytest.mark.vllm


@pytest.fixture
def swapper(
    vllm_server: VLLMServer, serving_router: ModelRouter, unique_alias: str, letter_adapters: dict[str, Path]
) -> Iterator[HotSwapper]:
    swapper = HotSwapper(vllm_server, serving_router, unique_alias, drain_timeout_s=60)
    swapper.register_base()
    swapper.swap(letter_adapters["A"])
    yield swapper
    swapper.wait_drained(60)
    for version in swapper.live_versions():  # leave the shared server as we found it
        vllm_server.unload_adapter(version)


def test_held_answers_are_released_only_when_the_canary_passed(
    swapper: HotSwapper, serving_gateway: GatewayServer, letter_adapters: dict[str, Path]
) -> None:
    seen = swap_with_held_calls(swapper, serving_gateway, letter_adapters["B"], "B", passes=True)
    assert seen.error is None and not seen.failures, (seen.error, seen.failures)
    assert seen.held == len(KINDS) and seen.seen_at_verdict == 0  # no client had an answer before it
    assert seen.answers["plain"] == seen.answers["stream"] == "B"
    assert {kind: span.llm.version for kind, span in seen.spans.items()} == dict.fromkeys(KINDS, seen.new)
    assert CONTINUED in seen.spans["continued"].llm.flags


def test_a_failed_canary_hands_its_held_calls_to_the_old_version(
    swapper: HotSwapper, serving_gateway: GatewayServer, letter_adapters: dict[str, Path]
) -> None:
    seen = swap_with_held_calls(swapper, serving_gateway, letter_adapters["B"], "B", passes=False)
    assert seen.error is not None and "on purpose" in str(seen.error)
    assert not seen.failures, seen.failures
    assert seen.held == len(KINDS) and seen.seen_at_verdict == 0
    assert seen.answers["plain"] == seen.answers["stream"] == "A"  # the old version answered them
    assert {kind: span.llm.version for kind, span in seen.spans.items()} == dict.fromkeys(KINDS, seen.old)
    assert all(span.status == "ok" for span in seen.spans.values())
    assert swapper.router.alias(swapper.alias) == seen.old and swapper.live_versions() == [seen.old]
    assert seen.new not in swapper.server.adapters()


@pytest.mark.slow
def test_eight_clients_across_three_swaps_one_refused_see_no_failure_and_only_verified_versions(
    swapper: HotSwapper, serving_gateway: GatewayServer, letter_adapters: dict[str, Path]
) -> None:
    """8 clients keep calling the alias while B (passes), C with a canary expecting "Z" (refused after its
    first calls were sent to it) and C again (passes) swap in: 0 failed calls, no answer of the refused version
    reached a client or the store, and every answer is the letter of the version its span names."""
    alias = swapper.alias
    letters = {swapper.router.alias(alias): "A"}
    stop, lock = threading.Event(), threading.Lock()
    answers: list[tuple[str, str]] = []  # (rollout, answer)
    failures: list[str] = []

    def client() -> None:
        rollout = new_rollout(serving_gateway)
        with httpx.Client() as http:
            while not stop.is_set():
                try:
                    answer = ask_letter(f"{serving_gateway.url}/rollouts/{rollout}/v1", alias, client=http)
                except Exception as exc:  # noqa: BLE001 - every failure counts
                    with lock:
                        failures.append(repr(exc))
                    continue
                with lock:
                    answers.append((rollout, answer))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    refused, held = [], []

    def canary_expecting(expect: str) -> Callable[[Upstream], CanaryResult]:
        check = ChatCanary(LETTER_MESSAGES, expect=lambda text: text == expect)

        def canary(upstream: Upstream) -> CanaryResult:  # verdict once a client's answer waits for it
            probation = swapper.router.probation(upstream.model)
            assert probation is not None and probation.wait_held(1, timeout_s=120)
            held.append(probation)
            return check(upstream)

        return canary

    try:
        for letter, expect in (("B", "B"), ("C", "Z"), ("C", "C")):
            time.sleep(2.0)  # the clients run on the current version for a while
            try:
                letters[swapper.swap(letter_adapters[letter], canary=canary_expecting(expect))] = letter
            except ServingError as exc:
                refused.append(str(exc))
        time.sleep(2.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    assert not failures, failures[:3]
    assert len(refused) == 1 and "rejected by expect" in refused[0], refused
    assert len(held) == 3 and held[1].passed is False  # the refused version had calls waiting for it
    spans = [s for rollout in {r for r, _ in answers} for s in llm_spans(serving_gateway, rollout)]
    assert len(spans) == len(answers) and all(span.status == "ok" for span in spans)
    for span in spans:  # the refused version is not among them: every span names a version that passed
        assert span.llm.version in letters and span.llm.response_text == letters[span.llm.version]
    assert set(letters) == {s.llm.version for s in spans}
    assert swapper.wait_drained(60) and not swapper.errors
