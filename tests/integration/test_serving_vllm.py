"""Serving against the real vLLM server of the test session: hot swap, refusals, swaps under load."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES, foreign_adapter, rank_adapter
from gateway_helpers import calls_idle_apart
from serving_helpers import ask_letter, llm_spans, new_rollout

from agentforge.errors import AdapterIncompatibleError, NotFoundError, ServingError, UserError
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.hotswap import ChatCanary, HotSwapper
from agentforge.serving.vllm import VLLMServer

pytestmark = pytest.mark.vllm


def expect_letter(letter: str) -> ChatCanary:
    return ChatCanary(LETTER_MESSAGES, expect=lambda text: text == letter)


@pytest.fixture
def swapper(vllm_server: VLLMServer, serving_router: ModelRouter, unique_alias: str) -> Iterator[HotSwapper]:
    swapper = HotSwapper(vllm_server, serving_router, unique_alias, drain_timeout_s=60)
    swapper.register_base()
    yield swapper
    swapper.wait_drained(60)
    for version in swapper.live_versions():  # leave the shared server as we found it
        vllm_server.unload_adapter(version)


def test_server_protocol(
    vllm_server: VLLMServer, letter_adapters: dict[str, Path], unique_alias: str
) -> None:
    name = f"{unique_alias}@v1"
    vllm_server.load_adapter(name, str(letter_adapters["A"]))
    assert name in vllm_server.adapters()
    assert ask_letter(vllm_server.base_url, name, api_key=vllm_server.api_key) == "A"
    with pytest.raises(UserError, match="new name"):
        vllm_server.load_adapter(name, str(letter_adapters["B"]))
    vllm_server.unload_adapter(name)
    assert name not in vllm_server.adapters()
    with pytest.raises(NotFoundError):
        vllm_server.unload_adapter(name)


def test_handed_case_6_swap_v1_to_v2(
    swapper: HotSwapper, letter_adapters: dict[str, Path], serving_gateway: GatewayServer
) -> None:
    """Adapter v1 answers "A"; after the swap to v2 the canary and the gateway see "B", spans record v2."""
    alias = swapper.alias
    v1 = swapper.swap(letter_adapters["A"], canary=expect_letter("A"))
    assert v1 == f"{alias}@v1" and swapper.last_canary is not None and swapper.last_canary.text == "A"
    rollout = new_rollout(serving_gateway)
    url = f"{serving_gateway.url}/rollouts/{rollout}/v1"
    assert ask_letter(url, alias) == "A"

    v2 = swapper.swap(letter_adapters["B"], canary=expect_letter("B"))
    assert v2 == f"{alias}@v2" and swapper.last_canary.text == "B"
    assert swapper.router.alias(alias) == v2
    assert ask_letter(url, alias) == "B"
    assert [s.llm.version for s in llm_spans(serving_gateway, rollout)] == [v1, v2]
    assert swapper.wait_drained(30) and not swapper.errors
    assert v1 not in swapper.server.adapters()  # old version drained, then unloaded


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: rank_adapter(32), "--max-lora-rank 32"),
        (lambda: rank_adapter(8, rank_pattern={"q_proj": 64}), "--max-lora-rank 64"),
        (foreign_adapter, "trained on 'meta-llama"),
    ],
    ids=["rank32", "rank_pattern64", "foreign_base"],
)
def test_handed_case_7_refused_before_loading(
    swapper: HotSwapper, letter_adapters: dict[str, Path], make, needle: str
) -> None:
    """Rank 32 / rank_pattern 64 / another base vs a server maximum of 16: refused before loading, with
    the fix in the message; the old adapter keeps serving."""
    v1 = swapper.swap(letter_adapters["A"])
    loaded = swapper.server.adapters()
    with pytest.raises(AdapterIncompatibleError) as info:
        swapper.swap(make())
    assert needle in str(info.value)
    if "rank" in needle:
        assert "retrain with r<=16" in str(info.value)
    assert swapper.server.adapters() == loaded
    assert swapper.router.alias(swapper.alias) == v1
    upstream = swapper.router.resolve(swapper.alias)[1]
    assert ask_letter(upstream.base_url, upstream.model, api_key=upstream.api_key) == "A"


def test_failed_canary_keeps_old_version(swapper: HotSwapper, letter_adapters: dict[str, Path]) -> None:
    v1 = swapper.swap(letter_adapters["A"])
    with pytest.raises(ServingError, match="rejected by expect"):
        swapper.swap(letter_adapters["B"], canary=expect_letter("Z"))
    assert swapper.router.alias(swapper.alias) == v1
    assert f"{swapper.alias}@v2" not in swapper.server.adapters()
    assert swapper.live_versions() == [v1]
    v3 = swapper.swap(letter_adapters["C"], canary=expect_letter("C"))
    assert v3 == f"{swapper.alias}@v3"  # a failed version's name is never reused


def test_canary_refuses_a_version_the_engine_does_not_serve(
    swapper: HotSwapper, letter_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load that reports success but leaves nothing served: the one-token canary gets vLLM's 404, the
    new version never takes traffic and the old one keeps answering."""
    v1 = swapper.swap(letter_adapters["A"])
    assert swapper.last_canary is not None and swapper.last_canary.token_ids
    monkeypatch.setattr(swapper.server, "load_adapter", lambda name, path: None)
    with pytest.raises(ServingError, match="answered 404"):
        swapper.swap(letter_adapters["B"])
    assert swapper.router.alias(swapper.alias) == v1 and swapper.live_versions() == [v1]
    upstream = swapper.router.resolve(swapper.alias)[1]
    assert ask_letter(upstream.base_url, upstream.model, api_key=upstream.api_key) == "A"


def test_canary_refuses_a_version_that_answers_like_the_old_one(
    swapper: HotSwapper, letter_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The engine serves the old weights under the new name (what an in-place reload with a stale cache
    does): the weights differ, the canary's log-probs do not, so it is refused. The same weights under a
    new name answer identically and pass; really different weights pass with a measured change."""
    v1 = swapper.swap(letter_adapters["A"])
    assert swapper.last_canary.change is not None and swapper.last_canary.change > 0  # vs the base
    load = swapper.server.load_adapter
    monkeypatch.setattr(swapper.server, "load_adapter", lambda name, path: load(name, letter_adapters["A"]))
    with pytest.raises(ServingError, match=f"answers like {v1}"):
        swapper.swap(letter_adapters["B"])
    monkeypatch.undo()
    assert swapper.router.alias(swapper.alias) == v1 and swapper.live_versions() == [v1]
    copy = tmp_path / "A-copy"
    shutil.copytree(letter_adapters["A"], copy)
    v3 = swapper.swap(copy)
    assert swapper.last_canary.change == 0.0  # identical weights answer identically: nothing to refuse
    v4 = swapper.swap(letter_adapters["B"])
    assert swapper.last_canary.change is not None and swapper.last_canary.change > 0
    assert swapper.router.alias(swapper.alias) == v4 != v3


@pytest.mark.slow
def test_hot_swap_under_load(
    swapper: HotSwapper, letter_adapters: dict[str, Path], serving_gateway: GatewayServer
) -> None:
    """8 clients keep sending through the gateway while v1 → v2 → v3 swap in: zero failures, outputs
    follow the swaps, every span names the version that served it."""
    alias = swapper.alias
    versions = {swapper.swap(letter_adapters["A"]): "A"}
    stop = threading.Event()
    results: list[tuple[float, float, str, str]] = []  # (sent, received, rollout, answer)
    failures: list[str] = []

    def client() -> None:
        rollout = new_rollout(serving_gateway)
        with httpx.Client() as http:
            while not stop.is_set():
                sent = time.monotonic()
                try:
                    answer = ask_letter(f"{serving_gateway.url}/rollouts/{rollout}/v1", alias, client=http)
                except Exception as exc:  # noqa: BLE001 - every failure counts
                    failures.append(repr(exc))
                    continue
                results.append((sent, time.monotonic(), rollout, answer))

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    flips = []
    try:
        for letter in "BC":
            time.sleep(3)
            started = time.monotonic()  # the alias flips inside swap(): between started and the return
            versions[swapper.swap(letter_adapters[letter], canary=expect_letter(letter))] = letter
            flips.append((started, time.monotonic(), letter))
        time.sleep(3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not failures, failures[:3]
    for _, flip_time, letter in flips:
        after = [answer for sent, _, _, answer in results if sent > flip_time]
        next_start = min([start for start, _, _ in flips if start > flip_time] or [1e18])
        before_next = [a for s, _, _, a in results if flip_time < s < next_start]
        assert after and set(before_next) == {letter}, (letter, set(before_next))
    spans = [s for rollout in {r[2] for r in results} for s in llm_spans(serving_gateway, rollout)]
    assert len(spans) == len(results)
    for span in spans:
        assert span.status == "ok"
        assert span.llm.response_text == versions[span.llm.version], span.llm.version
    assert {s.llm.version for s in spans} == set(versions)
    assert swapper.wait_drained(60) and not swapper.errors
    assert swapper.live_versions() == [max(versions)]


def test_the_started_vllm_keeps_an_idle_connection_past_the_clients_expiry(vllm_server: VLLMServer) -> None:
    """vLLM's uvicorn closed idle connections after 5 s, the OpenAI SDK's own expiry: a call sent on one at
    that moment (a simulated customer's, straight to the engine, ``max_retries=0``) failed with a connection
    error. The server agentforge starts keeps them for ``HTTP_KEEP_ALIVE_S``."""
    if vllm_server.log_path is None:
        pytest.skip(
            "the session's vLLM was started elsewhere (AGENTFORGE_TEST_VLLM_URL): its settings are its own"
        )
    answers = calls_idle_apart(  # RemoteDisconnected when vLLM had closed it at 5 s
        vllm_server.base_url, "GET", "/v1/models", 6.0, headers=vllm_server.auth_headers()
    )
    assert [status for status, _ in answers] == [200, 200]
