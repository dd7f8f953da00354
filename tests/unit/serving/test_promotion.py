"""Gated promotion on real pieces: the embedded engine (SmolLM2-135M + LoRA), the real gateway and store.

The task: greedy answer to "answer with one letter" prompts, gold ``A``. ``letter_adapter("A")`` (trained
toward the gold) is the good version; ``letter_adapter("B")`` (a few AdamW steps toward a wrong label) is
the bad one. Live traffic is client threads running rollouts through the gateway and scoring them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from live_traffic import LiveTraffic

from agentforge.gate import CanaryRule, EvalGate, RollbackRule, list_decisions
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.promoter import GatedPublisher
from agentforge.testing import memory_store
from agentforge.types import SpanKind

pytest.importorskip("peft")
pytestmark = pytest.mark.slow

#: The fixed held-out slice: paraphrases of the letter prompt (gold answer "A").
SLICE = [
    "Answer with one letter.",
    "Please answer with one letter.",
    "Reply with one letter.",
    "Answer with one letter only.",
    "Now answer with one letter.",
    "Answer with one letter, please.",
]


class Stack:
    """A router + gateway (in-memory store) + hot swapper with one retained version, for one test."""

    def __init__(self, engine: EmbeddedServer, alias: str) -> None:
        self.store = memory_store()
        self.router = ModelRouter()
        self.gateway = GatewayServer(self.store, self.router)
        self.swapper = HotSwapper(engine, self.router, alias, retain=1)
        self.swapper.register_base()
        self.alias = alias

    def ask(self, model: str, prompt: str, rollout_id: str | None = None) -> httpx.Response:
        root = (
            self.gateway.openai_base_url if rollout_id is None else self.gateway.rollout_base_url(rollout_id)
        )
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": 1,
        }
        return httpx.post(f"{root}/chat/completions", json=body, timeout=120)

    def evaluate(self, version: str) -> list[float]:
        """The eval slice scored for ``version`` (requests name the version, no rollout)."""
        out = []
        for prompt in SLICE:
            response = self.ask(version, prompt)
            assert response.status_code == 200, response.text
            out.append(1.0 if response.json()["choices"][0]["message"]["content"].strip() == "A" else 0.0)
        return out


@pytest.fixture
def stack(embedded_engine: EmbeddedServer, unique_alias: str) -> Iterator[Stack]:
    s = Stack(embedded_engine, unique_alias)
    with s.gateway:
        yield s
        s.swapper.wait_drained(60)
    for version in s.swapper.live_versions():  # leave the shared engine as it was
        embedded_engine.unload_adapter(version)
    s.store.close()


def Traffic(stack: Stack, clients: int, score: Callable[[str], float]) -> LiveTraffic:
    """``clients`` threads, each running rollouts through the gateway (alias, one call) until stopped; a
    rollout's final reward is ``score(answer)``. Every non-200 answer is a failed request."""
    return LiveTraffic(
        stack.store,
        clients,
        ask=lambda i, rollout_id: stack.ask(stack.alias, SLICE[i % len(SLICE)], rollout_id),
        score=lambda i, answer: score(answer),
    )


def served_versions(stack: Stack) -> set[str]:
    """Versions that served any recorded call through the gateway."""
    return {s.llm.version for s in stack.store.list_spans(kind=SpanKind.llm) if s.llm is not None}


def promote_good(stack: Stack, good: Path) -> str:
    """Serve the good adapter by default through a gate with no checks (the starting point of a test)."""
    return GatedPublisher(stack.swapper, stack.store).publish(good, step=1)


def test_bad_adapter_is_refused_by_the_eval_gate(stack: Stack, letter_adapters: dict[str, Path]) -> None:
    evaluated: list[str] = []

    def evaluate(version: str) -> list[float]:
        evaluated.append(version)
        return stack.evaluate(version)

    publisher = GatedPublisher(stack.swapper, stack.store, evaluate=evaluate, gate=EvalGate(max_p=0.05))
    base = publisher.current()
    good = publisher.publish(letter_adapters["A"], step=10)  # 6 wins over the base: p = 1/64
    assert good == f"{stack.alias}@v1" and publisher.current() == good
    refused = publisher.publish(letter_adapters["B"], step=20)  # trained toward the wrong label
    bad = f"{stack.alias}@v2"
    assert refused == good and publisher.current() == good  # the good one keeps serving
    assert stack.store.get_resource(stack.alias).ref == good  # and stays the store's active version
    assert bad not in stack.swapper.live_versions() and bad not in stack.router.models()
    answer = stack.ask(stack.alias, SLICE[0]).json()["choices"][0]["message"]["content"]
    assert answer == "A"
    assert bad not in {
        s.llm.version
        for s in stack.store.list_spans(kind=SpanKind.llm)
        if s.llm and s.llm.model == stack.alias
    }  # never served by default: every alias request went elsewhere

    decisions = list_decisions(stack.store, stack.alias)
    assert [(d.stage, d.outcome, d.candidate, d.live) for d in decisions] == [
        ("eval", "passed", good, base),
        ("promote", "promoted", good, base),
        ("eval", "refused", bad, good),
    ]
    passed, refusal = decisions[0].evidence, decisions[2].evidence
    assert passed["candidate_scores"] == [1.0] * 6 and passed["live_scores"] == [0.0] * 6
    assert passed["test"]["p_value"] == pytest.approx(1 / 64) and passed["test"]["wins"] == 6
    assert refusal["live_scores"] == [1.0] * 6 and refusal["candidate_scores"] == [0.0] * 6
    assert refusal["test"]["losses"] == 6 and refusal["test"]["p_value"] == 1.0 and refusal["gain"] == -1.0
    assert refusal["max_p"] == 0.05 and "p = 1" in decisions[2].reason
    assert evaluated == [base, good, bad]  # the fixed slice is scored once per version


def test_candidate_regressing_on_canary_traffic_is_refused(
    stack: Stack, letter_adapters: dict[str, Path]
) -> None:
    good = promote_good(stack, letter_adapters["A"])
    rule = CanaryRule(share=0.5, rollouts=3, margin=0.1, timeout_s=300)
    publisher = GatedPublisher(stack.swapper, stack.store, canary=rule, poll_s=0.2)
    with Traffic(stack, clients=4, score=lambda answer: float(answer == "A")) as traffic:
        served = publisher.publish(letter_adapters["B"], step=20)
    bad = f"{stack.alias}@v2"
    assert (
        served == good and publisher.current() == good and stack.store.get_resource(stack.alias).ref == good
    )
    assert traffic.failed == [] and traffic.ok[None] >= 3
    assert bad in served_versions(stack)  # the canary really served live rollouts
    assert bad not in stack.swapper.live_versions()
    canary = [d for d in list_decisions(stack.store, stack.alias) if d.stage == "canary"]
    assert [(d.outcome, d.candidate, d.live) for d in canary] == [("refused", bad, good)]
    evidence = canary[0].evidence
    assert evidence["version_n"] == 3 and evidence["version_mean"] == 0.0 and evidence["share"] == 0.5
    assert evidence["reference_n"] >= 1 and evidence["reference_mean"] == 1.0 and evidence["margin"] == 0.1


def test_promoted_version_whose_live_reward_drops_is_rolled_back(
    stack: Stack, letter_adapters: dict[str, Path]
) -> None:
    good = promote_good(stack, letter_adapters["A"])
    publisher = GatedPublisher(
        stack.swapper,
        stack.store,
        canary=CanaryRule(share=0.5, rollouts=3, margin=0.1, timeout_s=300),
        rollback=RollbackRule(window=4, margin=0.2, timeout_s=300),
        poll_s=0.2,
    )

    def score(answer: str) -> float:
        """Customers accept A or B until the promotion is decided; afterwards only A (B's reward drops).
        The promote decision is stored before the watch starts, so every watched rollout sees the drop."""
        promoted = any(d.stage == "promote" and d.candidate == bad for d in publisher.decisions)
        return float(answer == "A" or (answer == "B" and not promoted))

    bad = f"{stack.alias}@v2"
    with Traffic(stack, clients=8, score=score) as traffic:
        served = publisher.publish(letter_adapters["B"], step=20)
        assert served == bad
        assert publisher.wait_watch(300)
        traffic.wait(8)  # traffic keeps flowing on the restored version
    assert traffic.failed == [], traffic.failed[:3]
    assert stack.router.alias(stack.alias) == good and publisher.current() == good
    assert stack.store.get_resource(stack.alias).ref == good
    assert stack.swapper.wait_drained(60) and bad not in stack.swapper.live_versions()
    decisions = [(d.stage, d.outcome, d.candidate, d.live) for d in list_decisions(stack.store, stack.alias)]
    assert decisions[-4:] == [
        ("eval", "skipped", bad, good),
        ("canary", "passed", bad, good),
        ("promote", "promoted", bad, good),
        ("watch", "rolled_back", bad, good),
    ]
    watch = list_decisions(stack.store, stack.alias)[-1].evidence
    assert watch["version_n"] == 4 and watch["version_mean"] < watch["reference_mean"] - 0.2
    assert watch["window"] == 4


def test_sized_gate_passes_a_good_adapter_and_refuses_a_damaged_copy(
    stack: Stack, letter_adapters: dict[str, Path], tmp_path: Path
) -> None:
    """The non-inferiority gate (``EvalGate.sized``) on real versions: the adapter trained toward the gold passes
    over the base; a copy of it damaged by noise on its LoRA weights (``benchmarks/learning.py``'s
    ``damaged_copy``, the gate benchmark's worse candidates) is refused, and the good one keeps serving."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "learning_bench", Path(__file__).resolve().parents[3] / "benchmarks" / "learning.py"
    )
    assert spec is not None and spec.loader is not None
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)
    damaged = learning.damaged_copy(letter_adapters["A"], tmp_path / "damaged", scale=8.0)
    publisher = GatedPublisher(stack.swapper, stack.store, evaluate=stack.evaluate, gate=EvalGate.sized(0.05))
    good = publisher.publish(letter_adapters["A"], step=10)
    assert good == f"{stack.alias}@v1" and publisher.current() == good
    assert publisher.publish(damaged, step=20) == good and publisher.current() == good
    passed, refused = (d for d in list_decisions(stack.store, stack.alias) if d.stage == "eval")
    assert passed.outcome == "passed" and passed.evidence["margin"] == 0.05
    assert passed.evidence["lower_bound"] > -0.05 and passed.evidence["gain"] == 1.0
    assert refused.outcome == "refused" and refused.evidence["gain"] < 0
    assert refused.evidence["lower_bound"] < -0.05 and "lower 95% bound" in refused.reason
