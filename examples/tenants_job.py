"""Three tenants, one server: each tenant's own adapter, learned from that tenant's traffic only.

Three businesses share one app. Their customers ask about different things, so each tenant has its own
intent set and data: ``bank`` (Banking77), ``assistant`` (CLINC150) and ``shop`` (Bitext categories), each
restricted to a handful of intents so the default model (SmolLM2-135M-Instruct) learns it in a few GRPO steps
on 2 CPU cores. On the embedded default:

1. start ONE vLLM (runtime LoRA) and ONE gateway with serving's :class:`~agentforge.serving.tenants.
   TenantAdapters` (a tenant's versions ``policy@<tenant>/vN`` are loaded on demand, least recently used ones
   unloaded) and one runner pool; every rollout belongs to a tenant (``Rollout.tenant``) and its calls carry that
   tenant's own key (``store.tenant_keys``, stored hashed), so the gateway serves and records each call as that
   tenant's (``Span.tenant``) and refuses another tenant's versions;
2. evaluate the shared policy (``policy@v0``, the base model) on each tenant's held-out split (greedy,
   reward = exact intent match);
3. for each tenant in turn: GRPO + LoRA (TRL + PEFT) on that tenant's rollouts only (``RolloutSource(tenant=)``),
   publishing each adapter into the tenant's lineage (``StorePublisher(alias="policy@<tenant>")``; with
   ``--gate-size N`` through the tenant's own promotion gate, ``GatedStorePublisher``: a new version becomes the
   tenant's only when it beats the tenant's live one on a fixed gate slice of N training-split messages, paired
   sign test, every decision stored), then evaluate the tenant's served version on its held-out split; each span
   is checked to name that version;
   with ``--canary-share S`` (and/or ``--rollback-window W``) the tenant also has live customers while it trains
   (``--live-clients`` unpinned rollouts at a time, messages of its test split that the held-out evaluation never
   uses) and the whole promotion gate runs on them (``GatedPublisher(TenantLineage(...))``): a candidate that
   passed the eval gate serves a sticky share S of *that tenant's* live rollouts until it and the live version
   served ``--canary-rollouts`` each, and is promoted only if its live reward is not worse by more than the
   margin; after a promotion a live reward drop over W rollouts rolls the tenant back. Other tenants never see
   the candidate;
4. print a table per tenant (shared vs own adapter, Δ, minutes) and write ``OUT/results.json``.

    python examples/tenants_job.py                     # about 17 minutes on 2 cores
    python examples/tenants_job.py --gate-size 24      # each tenant's adapters through its own eval gate
    python examples/tenants_job.py --gate-size 24 --canary-share 0.3 --rollback-window 16   # + canary, rollback
    python examples/tenants_job.py --steps 2 --eval-size 8   # a quick look at the wiring
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from agentforge import (
    LightningTrainer,
    SpanKind,
    Task,
    TraceStore,
    TrainConfig,
    open_store,
    prepare_default_model,
)
from agentforge.agents.customer_service.datasets import load_banking77, load_bitext, load_clinc150
from agentforge.agents.customer_service.rewards.triage import normalize_intent
from agentforge.agents.customer_service.triage import build_triage_graph, parse_label, triage_prompt
from agentforge.errors import NotFoundError
from agentforge.gate import CanaryRule, Decision, EvalGate, RollbackRule
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.runtime import Runner
from agentforge.runtime.tasks import enqueue_tasks, wait_for_rollouts
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.lineage import TenantLineage
from agentforge.serving.promoter import GatedPublisher
from agentforge.serving.tenants import TenantAdapters
from agentforge.serving.vllm import VLLMServer
from agentforge.stack import engine_endpoint
from agentforge.stores.tenants import TenantKeyCache
from agentforge.trainers.publish import GatedStorePublisher, StorePublisher
from agentforge.trainers.rollouts import RolloutSource
from agentforge.types import RolloutState, Version

console = Console()

#: tenant → (data set, the few intents it uses); labels of at most 3 words (``parse_label`` reads up to 3).
TENANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bank": ("banking77", ("card_arrival", "exchange_rate", "change_pin", "top_up_failed")),
    "assistant": ("clinc150", ("weather", "alarm", "translate", "recipe")),
    "shop": ("bitext", ("delivery", "invoice", "newsletter", "payment")),
}
# Not "refund": asked to choose among refund, delivery, invoice and newsletter, the default model picks refund for
# every shop message (greedy and at T=1 alike), so GRPO groups never differ and the tenant cannot learn from them.


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=8, help="GRPO optimizer steps per tenant")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per task (GRPO group G)")
    p.add_argument("--tasks-per-step", type=int, default=4, help="tasks per optimizer step")
    p.add_argument("--swap-every", type=int, default=4, help="publish the tenant's adapter every k steps")
    p.add_argument("--learning-rate", type=float, default=3e-4, help="LoRA learning rate (constant)")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient to the base policy")
    p.add_argument("--train-size", type=int, default=160, help="training messages per tenant (balanced)")
    p.add_argument("--eval-size", type=int, default=60, help="held-out messages per tenant (balanced)")
    p.add_argument(
        "--gate-size",
        type=int,
        default=0,
        help="gate-slice messages per tenant (training split, never trained on), e.g. 24: publish each tenant's "
        "adapters through its own eval gate; 0: every adapter becomes the tenant's version at once",
    )
    p.add_argument("--gate-max-p", type=float, default=0.1, help="the eval gate's one-sided p-value bound")
    p.add_argument(
        "--canary-share",
        type=float,
        default=0.0,
        help="share of the tenant's live rollouts its candidate serves before promotion; 0: no canary",
    )
    p.add_argument("--canary-rollouts", type=int, default=8, help="live rollouts each canary arm must serve")
    p.add_argument(
        "--rollback-window",
        type=int,
        default=0,
        help="live rollouts of a promoted version judged for an automatic rollback; 0: no watch",
    )
    p.add_argument(
        "--live-margin", type=float, default=0.1, help="allowed live-reward shortfall (canary, watch)"
    )
    p.add_argument(
        "--live-clients", type=int, default=4, help="live customers of the training tenant at a time"
    )
    p.add_argument("--live-size", type=int, default=40, help="live-customer messages per tenant (test split)")
    p.add_argument(
        "--live-pause-s",
        type=float,
        default=1.0,
        help="seconds between a tenant's batches of live customers (unthrottled they slow training)",
    )
    p.add_argument("--workers", type=int, default=16, help="runner threads (vLLM batches their calls)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/tenants-job"), help="output folder")
    return p.parse_args(argv)


def _rows(dataset: str, split: str) -> list[Task]:
    """The data set's rows of one split, each with ``metadata["label"]`` (Bitext: its category)."""
    if dataset == "banking77":
        rows = load_banking77("train" if split == "train" else "test")
    elif dataset == "clinc150":
        rows = load_clinc150("train" if split == "train" else "test", include_oos=False)
    else:
        rows = load_bitext("train" if split == "train" else "test")
    key = "category" if dataset == "bitext" else "intent"
    return [
        t for t in rows if t.metadata.get(key) is not None and t.metadata.setdefault("label", t.metadata[key])
    ]


def tenant_tasks(tenant: str, n_train: int, n_eval: int, seed: int) -> tuple[list[Task], list[Task]]:
    """One tenant's training tasks (its data set's train split) and held-out tasks (its test split).

    Both are drawn round-robin over the tenant's intents (equal counts ±1, so "always answer the same intent"
    pays least); training rollouts sample at temperature 1, held-out ones are greedy.

    Args:
        tenant: a key of :data:`TENANTS`.
        n_train: training messages; n_eval: held-out messages.
        seed: shuffling seed (the same seed gives the same tasks).

    Returns:
        ``(train, held_out)``; each task has ``input = {"text", "temperature"}`` and ``metadata = {"label",
        "labels", "tenant"}``, task ids ``<tenant>-<split>-<k>``.

    Raises:
        UserError: the data set's folder is missing from ``../shared/data``.
    """
    dataset, labels = TENANTS[tenant]
    rng = random.Random(seed)

    def draw(split: str, n: int, temperature: float) -> list[Task]:
        by_label: dict[str, list[Task]] = {label: [] for label in labels}
        for t in _rows(dataset, split):
            label = normalize_intent(str(t.metadata["label"]))
            if label in by_label:
                by_label[label].append(t)
        for rows in by_label.values():
            rng.shuffle(rows)
        picked = [
            rows[i]
            for i in range(max(map(len, by_label.values())))
            for rows in by_label.values()
            if i < len(rows)
        ]
        return [
            Task(
                task_id=f"{tenant}-{split}-{k}",
                input={"text": t.input["text"], "temperature": temperature},
                metadata={
                    "label": normalize_intent(str(t.metadata["label"])),
                    "labels": list(labels),
                    "tenant": tenant,
                },
            )
            for k, t in enumerate(picked[:n])
        ]

    return draw("train", n_train, 1.0), draw("test", n_eval, 0.0)


def gate_slice(train: list[Task], n: int) -> list[Task]:
    """The last ``n`` of a tenant's training draw as its gate slice: greedy (temperature 0), never trained on."""
    if n <= 0:
        return []
    return [t.model_copy(update={"input": {**t.input, "temperature": 0.0}}) for t in train[-n:]]


def intent_agent(keys: dict[str, str]) -> Callable[[Task, Any], float]:
    """Runner agent: the triage graph over the task's own intents (``metadata["labels"]``); 1.0 on an exact match.

    The engine samples the answer among the tenant's intents (``choose=True``: vLLM structured outputs), so each
    GRPO group compares intents; the gateway stores the policy's unconstrained log-probs for training.

    Each call goes through the gateway with the key of the rollout's tenant (``keys``: tenant → its tenant key,
    :mod:`agentforge.stores.tenants`; the keys never enter the store in clear), so the gateway serves it as that
    tenant's call: ``policy`` (or the rollout's pin) resolves in the tenant's lineage, and a key of another tenant
    than the rollout's would be a 404.

    Args:
        keys: tenant → its tenant key.

    Returns:
        ``agent(task, ctx) -> reward`` for :class:`~agentforge.runtime.Runner`.
    """

    def agent(task: Task, ctx: Any) -> float:
        labels: Sequence[str] = task.metadata["labels"]
        graph = build_triage_graph(
            ctx.openai_client(max_retries=0, api_key=keys[task.metadata["tenant"]]),
            labels=labels,
            system_prompt=triage_prompt(labels, kind="intent"),
            prefill="Intent:",
            max_tokens=8,
            temperature=float(task.input.get("temperature", 1.0)),
            choose=True,  # the answer is one of the tenant's intents: every group compares intents
        )
        state = graph.invoke({"message": task.input["text"]})
        return 1.0 if state.get("label") == task.metadata["label"] else 0.0

    return agent


class Lineage:
    """A tenant's publisher (``policy@<tenant>/vN``) whose current version is the shared one until it has its own.

    Args:
        store: the trace store holding the lineage.
        tenant: the tenant.
        shared: the shared policy's version (``policy@v0``), what serves the tenant before its first adapter.
        gate: the tenant's promotion gate to publish through (:func:`tenant_gate`, :func:`live_gate`), or ``None``
            (every adapter becomes the tenant's version at once).
    """

    def __init__(
        self,
        store: TraceStore,
        tenant: str,
        shared: str,
        gate: GatedStorePublisher | GatedPublisher | None = None,
    ) -> None:
        self.store, self.tenant, self.shared, self.gate = store, tenant, shared, gate
        self.inner = gate or StorePublisher(store, alias=Version.lineage("policy", tenant))

    def current(self) -> str:
        """The tenant's active version, else the shared policy's (what serves the tenant now)."""
        if self.gate is not None:
            return self.gate.current()
        try:
            return self.store.get_resource(self.inner.alias).ref
        except NotFoundError:
            return self.shared

    def publish(self, adapter_dir: Path, step: int) -> str:
        """Record the adapter as the tenant's new active version ``policy@<tenant>/vN``."""
        return self.inner.publish(adapter_dir, step)


def evaluate(store: TraceStore, tenant: str, tasks: list[Task], version: str, label: str) -> dict[str, Any]:
    """Held-out accuracy of ``version`` on a tenant's tasks, run as that tenant's rollouts through the gateway.

    Returns:
        ``{"acc": mean reward in [0, 1], "spans": LLM spans, "foreign": spans not of this tenant or not naming
        ``version``, "top": the most frequent answer and its share}``.
    """
    rollouts = enqueue_tasks(
        store, tasks, resources={"policy": version}, metadata={"eval": label}, tenant=tenant
    )
    done = wait_for_rollouts(store, [r.rollout_id for r in rollouts], timeout_s=900)  # in the tasks' order
    scores, answers, spans, foreign = [], [], 0, 0
    for rollout in done:
        final = store.final_reward(rollout.rollout_id)
        scores.append(float(final.value) if final is not None and final.value is not None else 0.0)
        for span in store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm):
            spans += 1
            foreign += int(span.tenant != tenant or span.llm is None or span.llm.version != version)
            if span.llm is not None:
                answers.append(
                    parse_label(span.llm.response_text, rollout.task.metadata["labels"]) or "(none)"
                )
    top = max(set(answers), key=answers.count) if answers else "-"
    share = answers.count(top) / len(answers) if answers else 0.0
    return {
        "acc": sum(scores) / len(scores),
        "spans": spans,
        "foreign": foreign,
        "top": f"{top} {share:.0%}",
        "scores": scores,
    }


def tenant_gate(
    args: argparse.Namespace, store: TraceStore, tenant: str, shared: str, gate_slice: list[Task]
) -> GatedStorePublisher | None:
    """The tenant's promotion gate: each new adapter is scored against the tenant's live version on ``gate_slice``
    (greedy rollouts of the tenant, pinned to the version); ``None`` without a slice."""
    if not gate_slice:
        return None

    def scores(version: str) -> list[float]:
        return evaluate(store, tenant, gate_slice, version, f"gate-{version}")["scores"]

    gate = EvalGate(max_p=args.gate_max_p, min_gain=0.0)
    return GatedStorePublisher(store, Version.lineage("policy", tenant), scores, gate, fallback=shared)


def live_gate(
    args: argparse.Namespace, store: TraceStore, adapters: TenantAdapters, tenant: str, gate_slice: list[Task]
) -> GatedPublisher:
    """The tenant's whole promotion gate, run in the gateway's process: eval gate on ``gate_slice`` (if any), then a
    canary on a sticky share of the tenant's own live rollouts, then a watch that rolls the tenant back
    (:class:`~agentforge.serving.lineage.TenantLineage`; decisions stored under ``promotion:policy@<tenant>``)."""

    def scores(version: str) -> list[float]:
        return evaluate(store, tenant, gate_slice, version, f"gate-{version}")["scores"]

    margin = args.live_margin
    return GatedPublisher(
        TenantLineage(adapters, store, tenant),
        store,
        evaluate=scores if gate_slice else None,
        gate=EvalGate(max_p=args.gate_max_p, min_gain=0.0),
        canary=CanaryRule(args.canary_share, args.canary_rollouts, margin) if args.canary_share > 0 else None,
        rollback=RollbackRule(args.rollback_window, margin) if args.rollback_window > 0 else None,
    )


class LiveCustomers:
    """A tenant's live customers while it trains: ``clients`` unpinned rollouts at a time (its key, greedy, reward =
    exact intent), ``pause_s`` seconds between batches, so the gateway serves them the tenant's live version or its
    canary (sticky by rollout id).

    Attributes:
        rollouts: live rollouts finished; failed: those that did not succeed (a failed request among them).
    """

    def __init__(
        self, store: TraceStore, tenant: str, tasks: list[Task], clients: int, pause_s: float
    ) -> None:
        self.store, self.tenant, self.tasks, self.clients, self.pause_s = (
            store,
            tenant,
            tasks,
            clients,
            pause_s,
        )
        self.rollouts = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"live-{tenant}", daemon=True)

    def __enter__(self) -> LiveCustomers:
        if self.tasks and self.clients > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(300)

    def _run(self) -> None:
        k = 0
        while not self._stop.is_set():
            batch = [self.tasks[(k + i) % len(self.tasks)] for i in range(self.clients)]
            k += self.clients
            rollouts = enqueue_tasks(self.store, batch, metadata={"live": True}, tenant=self.tenant)
            done = wait_for_rollouts(self.store, [r.rollout_id for r in rollouts], timeout_s=600)
            self.rollouts += len(done)
            self.failed += sum(r.state != RolloutState.succeeded for r in done)
            self._stop.wait(self.pause_s)


def train_tenant(
    args: argparse.Namespace,
    store: TraceStore,
    model: Path,
    tenant: str,
    shared: str,
    train: list[Task],
    gate_slice: list[Task],
    adapters: TenantAdapters,
    live: list[Task],
) -> tuple[str, int, float, list[Decision]]:
    """GRPO + LoRA on ``tenant``'s rollouts only, with its live customers (``live``) while the promotion gate needs
    them; returns (its served version, steps, seconds, gate decisions)."""
    config = TrainConfig(
        output_dir=str(args.out / tenant),
        seed=args.seed,
        data_seed=args.seed,
        num_generations=args.group_size,
        tasks_per_step=args.tasks_per_step,
        max_steps=args.steps,
        swap_every=args.swap_every,
        learning_rate=args.learning_rate,
        beta=args.beta,
        lr_scheduler_type="constant",
        lora_r=16,
        lora_alpha=32,
        max_completion_length=8,
        logging_steps=1,
        save_strategy="steps",
        save_steps=args.swap_every,
        save_total_limit=1,
        report_to=["none"],
        use_cpu=True,
        bf16=True,
        gradient_checkpointing=False,
        rollout_timeout_s=120,
        wait_timeout_s=900,
    )
    live_gated = args.canary_share > 0 or args.rollback_window > 0
    gate = (
        live_gate(args, store, adapters, tenant, gate_slice)
        if live_gated
        else tenant_gate(args, store, tenant, shared, gate_slice)
    )
    lineage = Lineage(store, tenant, shared, gate)
    source = RolloutSource(
        store,
        {t.task_id: t for t in train},
        config.num_generations,
        lineage.current,
        alias=config.alias,
        timeout_s=config.rollout_timeout_s,
        max_attempts=config.rollout_max_attempts,
        wait_timeout_s=config.wait_timeout_s,
        max_staleness=config.max_staleness,
        tenant=tenant,
    )
    trainer = LightningTrainer(model, store, train, config, lineage, source=source)
    source.placeholder = trainer.placeholder_token_id
    t0 = time.monotonic()
    customers = LiveCustomers(store, tenant, live if live_gated else [], args.live_clients, args.live_pause_s)
    with customers:
        trainer.train()
        if isinstance(gate, GatedPublisher):
            gate.wait_watch()  # the last promotion's watch decides on live traffic before the evaluation
    if live_gated:
        console.print(f"{tenant}: {customers.rollouts} live rollouts, {customers.failed} not succeeded")
    decisions = gate.decisions if gate is not None else []
    return lineage.current(), int(trainer.trainer.state.global_step), time.monotonic() - t0, decisions


def tenant_table(tenant: str, r: dict[str, Any]) -> Table:
    """One tenant's table: the shared policy and the tenant's own adapter on its held-out split."""
    dataset, labels = TENANTS[tenant]
    table = Table(
        title=f"tenant {tenant} ({dataset}: {', '.join(labels)}; {r['n_eval']} held-out, greedy)",
        box=box.SIMPLE_HEAD,
        show_edge=False,
    )
    for col in ("policy", "version", "acc", "Δ", "minutes", "top answer", "foreign spans"):
        table.add_column(col, justify="left" if col in ("policy", "version", "top answer") else "right")
    b, a = r["before"], r["after"]
    table.add_row(
        "shared",
        r["shared"],
        f"{b['acc']:.3f}",
        "",
        f"{r['eval_before_s'] / 60:.1f}",
        b["top"],
        f"{b['foreign']}/{b['spans']}",
    )
    table.add_row(
        "own adapter",
        r["version"],
        f"{a['acc']:.3f}",
        f"{a['acc'] - b['acc']:+.3f}",
        f"{r['train_s'] / 60:.1f} train",
        a["top"],
        f"{a['foreign']}/{a['spans']}",
    )
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # a fresh trace store per run: a rerun into the same folder would otherwise meet the last run's rollouts under
    # the trainers' kept run ids (``{out}/<tenant>/agentforge-run.json``) and train on them
    for name in ("traces.db", "traces.db-wal", "traces.db-shm"):
        (args.out / name).unlink(missing_ok=True)
    model = prepare_default_model()
    n_live = args.live_size if args.canary_share > 0 or args.rollback_window > 0 else 0
    data = {
        t: tenant_tasks(t, args.train_size + args.gate_size, args.eval_size + n_live, args.seed)
        for t in TENANTS
    }
    gates = {t: gate_slice(train, args.gate_size) for t, (train, _) in data.items()}
    lives = {
        t: held_out[args.eval_size :] for t, (_, held_out) in data.items()
    }  # never in the held-out evaluation
    data = {
        t: (train[: args.train_size], held_out[: args.eval_size]) for t, (train, held_out) in data.items()
    }
    store = open_store(f"sqlite:///{(args.out / 'traces.db').resolve()}")
    t_job = time.monotonic()
    results: dict[str, dict[str, Any]] = {}
    router = ModelRouter()
    with VLLMServer(model, max_lora_rank=16, max_loras=4) as server:
        shared = HotSwapper(server, router).register_base()
        adapters = TenantAdapters(server, router, store, max_loaded=3)
        console.print(
            f"vLLM up in {server.startup_s:.0f}s; tenants {', '.join(TENANTS)}; shared policy {shared}"
        )
        try:
            gateway_key = secrets.token_urlsafe(24)  # the app's own key; tenants call with their tenant keys
            keys = {tenant: store.tenant_keys.issue(tenant) for tenant in TENANTS}
            directory = TenantKeyCache(store.tenant_keys)
            with (
                GatewayServer(
                    store, router, api_key=gateway_key, tenants=directory, tenant_models=adapters
                ) as gateway,
                Runner(
                    store,
                    intent_agent(keys),
                    gateway.url,
                    workers=args.workers,
                    engine=engine_endpoint(server),
                    gateway_api_key=gateway_key,
                ),
            ):
                for tenant, (_, held_out) in data.items():
                    t0 = time.monotonic()
                    before = evaluate(store, tenant, held_out, shared, "before")
                    results[tenant] = {
                        "shared": shared,
                        "before": before,
                        "eval_before_s": time.monotonic() - t0,
                        "n_eval": len(held_out),
                    }
                    console.print(f"{tenant}: shared {shared} held-out {before['acc']:.3f}")
                for tenant, (train, held_out) in data.items():
                    version, steps, train_s, decisions = train_tenant(
                        args, store, model, tenant, shared, train, gates[tenant], adapters, lives[tenant]
                    )
                    after = evaluate(store, tenant, held_out, version, "after")
                    results[tenant].update(
                        version=version,
                        steps=steps,
                        train_s=train_s,
                        after=after,
                        decisions=[f"{d.stage} {d.outcome} {d.candidate}: {d.reason}" for d in decisions],
                    )
                    for d in decisions:
                        console.print(f"{tenant} gate: {d.stage} {d.outcome} {d.candidate} — {d.reason}")
                    console.print(
                        f"{tenant}: {steps} steps in {train_s / 60:.1f} min, {version} held-out "
                        f"{after['acc']:.3f}"
                    )
        finally:
            metrics = adapters.metrics()
            adapters.close()
    minutes = (time.monotonic() - t_job) / 60
    for tenant, r in results.items():
        if "after" in r:
            console.print(tenant_table(tenant, r))
    console.print(
        f"one vLLM, one gateway, {len(TENANTS)} tenants: {minutes:.1f} min in all; tenant adapters "
        f"{ {k: round(v, 3) for k, v in metrics.items()} }"
    )
    (args.out / "results.json").write_text(
        json.dumps({"results": results, "minutes": minutes, "adapters": metrics}, indent=1)
    )
    store.close()
    ok = all(
        "after" in r and r["after"]["acc"] > r["before"]["acc"] and r["after"]["foreign"] == 0
        for r in results.values()
    )
    return 0 if ok and len(results) == len(TENANTS) else 1


if __name__ == "__main__":
    sys.exit(main())
