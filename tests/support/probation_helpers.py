"""Hot swaps whose first client calls reach the new version while its canary runs (serving's probation).

:func:`swap_with_held_calls` flips a real :class:`~agentforge.serving.hotswap.HotSwapper` to a new adapter while
clients, started the moment the alias moves, send a plain, a streamed and a token-in continued call through
the real gateway. Its canary waits until all of their answers are held by the gateway, notes what the clients
have received by then, and only then gives its verdict, so the held path is taken every time (no timing).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from adapters import LETTER_MESSAGES, LETTER_PROMPT
from serving_helpers import ask_letter, llm_spans, new_rollout

from agentforge.errors import ServingError
from agentforge.gateway.router import Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.serving.canary import CanaryResult, ChatCanary
from agentforge.serving.hotswap import HotSwapper
from agentforge.types import Span

KINDS = ("plain", "stream", "continued")


@dataclass
class HeldSwap:
    """What one :func:`swap_with_held_calls` saw.

    Attributes:
        old: the version the alias served before.
        new: the new version's name.
        error: the swap's exception (``None``: it passed).
        answers: call kind → the answer text the client got.
        failures: what went wrong in the clients (empty: every call succeeded).
        seen_at_verdict: answers the clients had received when the canary gave its verdict.
        held: answers the gateway held for the new version.
        spans: call kind → the span recorded for that call.
    """

    old: str
    new: str
    error: BaseException | None = None
    answers: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seen_at_verdict: int = -1
    held: int = 0
    spans: dict[str, Span] = field(default_factory=dict)


def ask_letter_stream(base_url: str, model: str, client: httpx.Client) -> str:
    """The streamed greedy answer of ``model`` to the letter prompt (the chunks' text joined)."""
    body = {"model": model, "messages": LETTER_MESSAGES, "temperature": 0, "max_tokens": 4, "stream": True}
    text = []
    with client.stream("POST", f"{base_url}/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:]).get("choices") or []:
                    text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)


def swap_with_held_calls(
    swapper: HotSwapper, gateway: GatewayServer, adapter: Path, letter: str, *, passes: bool
) -> HeldSwap:
    """Swap ``adapter`` in while three clients (plain, streamed, continued) call the alias during its canary.

    Args:
        swapper: the swapper (its alias serves an earlier version).
        gateway: the gateway in front of ``swapper.router``.
        adapter: the new version's adapter directory.
        letter: the letter the new adapter answers (its canary checks it).
        passes: give the canary a passing verdict (else it fails after the calls were held).

    Returns:
        The :class:`HeldSwap` record.
    """
    router, alias = swapper.router, swapper.alias
    old = router.alias(alias)
    assert old is not None
    rollouts = {kind: new_rollout(gateway) for kind in KINDS}
    urls = {kind: f"{gateway.url}/rollouts/{rollout}/v1" for kind, rollout in rollouts.items()}
    first = ask_letter(urls["continued"], alias)  # on the old version: the call the follow-up continues
    out = HeldSwap(old=old, new="")
    lock = threading.Lock()

    def client(kind: str) -> None:
        if router.wait_alias(alias, old, timeout_s=120) is None:
            out.failures.append(f"{kind}: the alias never moved")
            return
        try:
            with httpx.Client(timeout=120) as http:
                if kind == "stream":
                    answer = ask_letter_stream(urls[kind], alias, http)
                elif kind == "continued":
                    messages = [*LETTER_MESSAGES, {"role": "assistant", "content": first}]
                    body = {
                        "model": alias,
                        "messages": [*messages, {"role": "user", "content": LETTER_PROMPT}],
                        "temperature": 0,
                        "max_tokens": 4,
                    }
                    response = http.post(f"{urls[kind]}/chat/completions", json=body)
                    assert response.status_code == 200, response.text
                    answer = response.json()["choices"][0]["message"]["content"]
                else:
                    answer = ask_letter(urls[kind], alias, client=http)
        except Exception as exc:  # noqa: BLE001 - every failure counts
            with lock:
                out.failures.append(f"{kind}: {exc!r}")
            return
        with lock:
            out.answers[kind] = answer

    check = ChatCanary(LETTER_MESSAGES, expect=lambda text: text == letter)

    def canary(upstream: Upstream) -> CanaryResult:
        out.new = upstream.model
        probation = router.probation(upstream.model)
        assert probation is not None, "the new version is not on probation"
        assert probation.wait_held(len(KINDS), timeout_s=120), "the clients' answers were not held"
        with lock:
            out.seen_at_verdict = len(out.answers)
        out.held = probation.held
        result = check(upstream)
        if not passes:
            raise ServingError(f"canary refused {upstream.model} on purpose (it answered {result.text!r})")
        return result

    threads = [threading.Thread(target=client, args=(kind,)) for kind in KINDS]
    for thread in threads:
        thread.start()
    try:
        swapper.swap(adapter, canary=canary)
    except ServingError as exc:
        out.error = exc
    finally:
        for thread in threads:
            thread.join(180)
    for kind, rollout in rollouts.items():
        spans = llm_spans(gateway, rollout)
        out.spans[kind] = spans[-1]
        assert len(spans) == (2 if kind == "continued" else 1), [s.llm.version for s in spans]
    return out
