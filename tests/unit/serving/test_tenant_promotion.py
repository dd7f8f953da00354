"""Gated promotion of a tenant's own lineage on real pieces: the embedded engine (SmolLM2-135M + LoRA), the real
gateway with tenant keys, serving's TenantAdapters and a SQLite store, through the one promotion gate
(``GatedPublisher`` over a ``TenantLineage``).

Two tenants share the engine: ``acme`` is served ``letter_adapter("A")`` as ``{alias}@acme/v1`` and its customers
reward "A"; ``bolt`` is served ``letter_adapter("C")`` as ``{alias}@bolt/v1`` and rewards "C". Live traffic is client
threads, each running unpinned rollouts of one tenant through the gateway with that tenant's key. acme's candidate is
``letter_adapter("B")``: its canary must take a share of acme's rollouts only, never one of bolt's (spans checked).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from adapters import LETTER_MESSAGES
from live_traffic import LiveTraffic
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.gate import CanaryRule, RollbackRule, list_decisions
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.lineage import TenantLineage
from agentforge.serving.promoter import GatedPublisher
from agentforge.serving.tenants import TenantAdapters
from agentforge.stores.sql import SQLStore
from agentforge.stores.tenants import TenantKeyCache
from agentforge.types import ResourceVersion, SpanKind

pytest.importorskip("peft")
pytestmark = pytest.mark.slow

GATEWAY_KEY = "tenant-promotion-gateway-key"
GOLD = {"acme": "A", "bolt": "C"}


class TenantStack:
    """One store (SQLite file), router, gateway with tenant keys and TenantAdapters; acme and bolt each with a
    live adapter version of their own."""

    def __init__(self, engine: EmbeddedServer, alias: str, adapters: dict[str, Path], tmp_path: Path) -> None:
        self.url = f"sqlite:///{tmp_path / 'traces.db'}"
        self.store, self.router, self.alias = SQLStore(self.url), ModelRouter(), alias
        HotSwapper(engine, self.router, alias).register_base()  # the shared policy: the base model
        for tenant, letter in GOLD.items():
            payload = {"path": str(adapters[letter])}
            self.store.publish_resource(
                ResourceVersion(name=self.lineage(tenant), kind="adapter", payload=payload)
            )
        self.adapters = TenantAdapters(engine, self.router, self.store, alias, max_loaded=4)
        self.keys = {tenant: self.store.tenant_keys.issue(tenant) for tenant in GOLD}
        self.gateway = GatewayServer(
            self.store,
            self.router,
            api_key=GATEWAY_KEY,
            tenants=TenantKeyCache(self.store.tenant_keys),
            tenant_models=self.adapters,
        )

    def lineage(self, tenant: str) -> str:
        return f"{self.alias}@{tenant}"

    def gate(self, tenant: str, rollback: RollbackRule | None = None) -> GatedPublisher:
        """``tenant``'s promotion gate: no eval slice (recorded as skipped), a canary on half its live rollouts
        (3 each arm, margin 0.1), and ``rollback``."""
        canary = CanaryRule(share=0.5, rollouts=3, margin=0.1, timeout_s=300)
        lineage = TenantLineage(self.adapters, self.store, tenant)
        return GatedPublisher(lineage, self.store, canary=canary, rollback=rollback, poll_s=0.2)

    def ask(self, tenant: str, rollout_id: str) -> httpx.Response:
        body = {"model": self.alias, "messages": LETTER_MESSAGES, "temperature": 0, "max_tokens": 1}
        return httpx.post(
            f"{self.gateway.rollout_base_url(rollout_id)}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            timeout=120,
        )

    def spans(self, tenant: str) -> list[str]:
        """Versions that served the recorded calls of ``tenant``, in order."""
        return [
            s.llm.version
            for s in self.store.list_spans(kind=SpanKind.llm, tenant=tenant)
            if s.llm is not None and s.tenant == tenant
        ]


@pytest.fixture
def stack(
    embedded_engine: EmbeddedServer, unique_alias: str, letter_adapters: dict[str, Path], tmp_path: Path
) -> Iterator[TenantStack]:
    s = TenantStack(embedded_engine, unique_alias, letter_adapters, tmp_path)
    with s.gateway:
        yield s
    s.adapters.close()  # leave the shared engine as it was
    s.store.close()


def traffic(stack: TenantStack, clients: int, score: Callable[[str, str], float]) -> LiveTraffic:
    """``clients`` threads alternating over the tenants (acme, bolt, acme, ...), each running one-call rollouts of
    its tenant with that tenant's key; a rollout's reward is ``score(tenant, answer)``."""
    tenants = list(GOLD)

    def tenant(i: int) -> str:
        return tenants[i % len(tenants)]

    return LiveTraffic(
        stack.store,
        clients,
        ask=lambda i, rollout_id: stack.ask(tenant(i), rollout_id),
        score=lambda i, answer: score(tenant(i), answer),
        tenant=tenant,
    )


def check_bolt_untouched(stack: TenantStack) -> None:
    """bolt was served only its own live version, its lineage never moved and has no decision."""
    bolt = stack.spans("bolt")
    assert bolt and set(bolt) == {f"{stack.lineage('bolt')}/v1"}
    assert stack.store.get_resource(stack.lineage("bolt")).version == 1
    assert list_decisions(stack.store, stack.lineage("bolt")) == []


def versions_cli(stack: TenantStack, tenant: str) -> dict[str, list[dict[str, object]]]:
    """``agentforge versions ALIAS --tenant T``: version ref → its decisions, as the command prints them."""
    out = CliRunner().invoke(app, ["versions", stack.alias, "--tenant", tenant, "--store-url", stack.url])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output.strip().splitlines()[-1])
    return {f"{r['name']}/v{r['version']}": r["decisions"] for r in rows}


def test_a_tenant_candidate_regressing_on_its_canary_traffic_is_refused(
    stack: TenantStack, letter_adapters: dict[str, Path]
) -> None:
    acme = stack.lineage("acme")
    live, candidate = f"{acme}/v1", f"{acme}/v2"
    publisher = stack.gate("acme")
    assert publisher.current() == live
    with traffic(stack, 4, lambda tenant, answer: float(answer == GOLD[tenant])) as clients:
        served = publisher.publish(letter_adapters["B"], step=20)
        clients.wait(3, "acme")  # acme keeps being served after the refusal
    assert clients.failed == [], clients.failed[:3]
    assert served == live == publisher.current() and stack.store.get_resource(acme).ref == live
    acme_spans = stack.spans("acme")
    assert (
        candidate in acme_spans and live in acme_spans
    )  # the canary really served a share of acme's rollouts
    assert acme_spans[-1] == live and candidate not in stack.adapters.loaded()  # refused: unloaded
    check_bolt_untouched(stack)  # bolt's rollouts never met acme's canary
    decisions = list_decisions(stack.store, acme)
    assert [(d.stage, d.outcome, d.candidate, d.live) for d in decisions] == [
        ("eval", "skipped", candidate, live),
        ("canary", "refused", candidate, live),
    ]
    evidence = decisions[1].evidence
    assert evidence["version_n"] == 3 and evidence["version_mean"] == 0.0 and evidence["share"] == 0.5
    assert evidence["reference_n"] >= 3 and evidence["reference_mean"] == 1.0 and evidence["margin"] == 0.1
    shown = versions_cli(stack, "acme")
    assert [(d["stage"], d["outcome"]) for d in shown[candidate]] == [
        ("eval", "skipped"),
        ("canary", "refused"),
    ]
    assert shown[candidate][1]["evidence"]["version_mean"] == 0.0


def test_a_promoted_tenant_version_whose_live_reward_drops_is_rolled_back(
    stack: TenantStack, letter_adapters: dict[str, Path]
) -> None:
    acme = stack.lineage("acme")
    live, candidate = f"{acme}/v1", f"{acme}/v2"
    publisher = stack.gate("acme", RollbackRule(window=4, margin=0.2, timeout_s=300))

    def score(tenant: str, answer: str) -> float:
        """acme's customers accept A or B until the promotion is decided, afterwards only A (B's reward drops);
        the promote decision is stored before the watch starts, so every watched rollout sees the drop."""
        if tenant != "acme":
            return float(answer == GOLD[tenant])
        promoted = any(d.stage == "promote" and d.candidate == candidate for d in publisher.decisions)
        return float(answer == "A" or (answer == "B" and not promoted))

    with traffic(stack, 8, score) as clients:
        assert publisher.publish(letter_adapters["B"], step=20) == candidate
        assert publisher.wait_watch(300)
        clients.wait(6, "acme")  # acme's traffic keeps flowing on the restored version
    assert clients.failed == [], clients.failed[:3]
    assert publisher.current() == live and stack.store.get_resource(acme).ref == live
    assert candidate not in stack.adapters.loaded()  # rolled back from: unloaded
    acme_spans = stack.spans("acme")
    promoted_at = acme_spans.index(candidate)
    assert acme_spans[-3:] == [live] * 3 and promoted_at > 0 and acme_spans[0] == live
    check_bolt_untouched(stack)
    decisions = list_decisions(stack.store, acme)
    assert [(d.stage, d.outcome, d.candidate, d.live) for d in decisions] == [
        ("eval", "skipped", candidate, live),
        ("canary", "passed", candidate, live),
        ("promote", "promoted", candidate, live),
        ("watch", "rolled_back", candidate, live),
    ]
    watch = decisions[-1].evidence
    assert watch["version_n"] == 4 and watch["version_mean"] < watch["reference_mean"] - 0.2
    assert watch["window"] == 4
    shown = versions_cli(stack, "acme")
    assert [d["outcome"] for d in shown[candidate]] == ["skipped", "passed", "promoted", "rolled_back"]
