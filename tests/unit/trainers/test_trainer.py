"""The lightning trainer on the default 135M model with the embedded backend (no vLLM needed).

Behaviour, not numbers (STYLE 13): after a few GRPO steps on rollouts the runner really executed through
the gateway, the LoRA weights changed, the base weights did not, a loss was logged, and the served
version advanced with each hot-swap; every rollout was trained on by exactly one step.
"""

from __future__ import annotations

import json

import pytest
from adapters import assert_only_lora_moved
from trainer_process import letter_agent, letter_train_config

from agentforge.config import default_model_dir
from agentforge.gate import EvalGate, list_decisions
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.model import prepare_default_model
from agentforge.runtime import Runner, enqueue_tasks, task_scores, wait_for_rollouts
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.promoter import GatedPublisher
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.stores.sql import SQLStore
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.grpo_trainer import LightningTrainer
from agentforge.types import Task, Version

pytestmark = pytest.mark.slow

WORDS = ["apple", "river", "stone", "cloud"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    prepare_default_model()
    tmp = tmp_path_factory.mktemp("trainer")
    store = SQLStore(f"sqlite:///{tmp / 'traces.db'}")
    server = EmbeddedServer(default_model_dir(), max_lora_rank=16)
    server.start()
    router = ModelRouter()
    swapper = HotSwapper(server, router, alias="policy")
    swapper.register_base()
    gateway = GatewayServer(store, router).start()
    runner = Runner(store, letter_agent, gateway.url, workers=2, mode="thread").start()
    yield tmp, store, swapper
    runner.stop()
    gateway.stop()
    server.stop()
    store.close()


def _config(tmp, name: str, **changes) -> TrainConfig:
    """The module's GRPO config (:func:`trainer_process.letter_train_config`) in ``tmp / name``, with ``changes``."""
    return letter_train_config(tmp / name, **changes)


def test_grpo_steps_change_lora_not_base_and_advance_served_version(stack) -> None:
    tmp, store, swapper = stack
    tasks = [Task(task_id=f"letter-{w}", input={"letter": w[0]}) for w in WORDS]
    # beta: DeepSeekMath's KL coefficient (TRL logs ``kl`` only when beta > 0)
    config = _config(tmp, "run", max_steps=3, swap_every=1, seed=0, beta=0.04)
    publisher = HotSwapPublisher(swapper, store)
    trainer = LightningTrainer(default_model_dir(), store, tasks, config, publisher)
    before = {k: v.detach().clone() for k, v in trainer.trainer.model.named_parameters()}
    result = trainer.train()

    assert result["steps"] == 3
    # Log-prob passes per step: the reference (no grad) shares each group's prompt; the gradient pass falls
    # back to TRL's per-row pass under gradient checkpointing (TRL's default, kept here); TRL's old-policy
    # pass is skipped (num_iterations 1: the ratio comes from the gradient pass, TrainingForwardRatio).
    assert (trainer.trainer.shared_prefix_calls, trainer.trainer.fallback_calls) == (3, 3)
    assert trainer.trainer.old_pass_skips == 3
    assert result["versions"] == ["policy@v1", "policy@v2", "policy@v3"]
    assert swapper.router.alias("policy") == "policy@v3"
    assert [r.version for r in store.list_resources("policy")] == [1, 2, 3]
    assert any("loss" in row for row in trainer.history) and all(
        "batch/zero_variance_share" in row for row in trainer.history
    )
    # LoRA weights moved (B starts at zero); the base weights in memory, which the optimizer saw, did not.
    assert_only_lora_moved(before, trainer.trainer.model)
    # Every rollout the trainer enqueued was consumed by exactly one step, pinned to the serving version.
    rollouts = [r for r in store.list_rollouts() if r.metadata.get("trainer_run") == trainer.run_id]
    assert len(rollouts) == 3 * 2 * 4
    assert {r.metadata["trained_step"] for r in rollouts} == {0, 1, 2}
    assert {r.resources["policy"] for r in rollouts} == {"policy@v0", "policy@v1", "policy@v2"}
    # Every logged step carries the metrics; they came through TRL's logs (so the progress bar and
    # report_to integrations show them) and went to the store and metrics.jsonl as well.
    required = {
        "reward",
        "reward_std",
        "batch/reward_mean",
        "batch/reward_std",
        "batch/zero_variance_share",
        "frac_reward_zero_std",
        "completions/clipped_ratio",
        "clip_ratio/region_mean",
        "kl",
        "train/tokens_per_s",
        "train/step_s",
        "policy/version",
        "version",
        "loss",
    }
    assert len(trainer.history) == 3
    for row in trainer.history:
        assert required <= set(row), required - set(row)
        assert row["train/tokens_per_s"] > 0 and row["train/step_s"] > 0
        assert row["batch/sampled_tokens"] / row["train/step_s"] == pytest.approx(row["train/tokens_per_s"])
    assert [row["policy/version"] for row in trainer.history] == [0.0, 1.0, 2.0]
    metric_spans = [s for s in store.list_spans(orphans=True) if s.name == "trainer.metrics"]
    metric_spans = [s for s in metric_spans if s.attributes["run_id"] == trainer.run_id]
    assert len(metric_spans) == 3 and required <= set(metric_spans[-1].attributes)
    lines = (tmp / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]

    # Only the main process publishes and writes metrics: on another rank all three are no-ops.
    spans_before = len(store.list_spans(orphans=True))
    original = type(trainer.trainer.accelerator)
    try:
        trainer.trainer.accelerator.__class__ = type("OtherRank", (original,), {"is_main_process": False})
        assert not trainer.is_main_process
        trainer._published_step = -1
        assert trainer.maybe_publish(force=True) is None
        assert trainer.step_metrics(1.0, []) == {}
        trainer.record_metrics(3, {"loss": 0.0})
    finally:
        trainer.trainer.accelerator.__class__ = original
    assert swapper.router.alias("policy") == "policy@v3" and len(trainer.versions) == 3
    assert len(store.list_spans(orphans=True)) == spans_before and len(trainer.history) == 3


def test_lightning_trainer_publishes_through_the_promotion_gate(stack) -> None:
    """The trainer's publish path goes through the gate: each adapter is scored against the live version on
    held-out tasks (rollouts the runner executes, pinned to each version); a refused one is never served, so
    the next step samples from the live version again."""
    tmp, store, swapper = stack
    tasks = [Task(task_id=f"letter-{w}", input={"letter": w[0]}) for w in WORDS]
    held_out = [Task(task_id=f"held-{c}", input={"letter": c}) for c in "bdmp"]
    config = _config(tmp, "gated", max_steps=2, swap_every=1, seed=1)
    # a gain above 1.0 is impossible for 0/1 rewards: the gate refuses every adapter, deterministically
    gate = EvalGate(max_p=None, min_gain=1.0)
    evaluate = lambda v: task_scores(store, held_out, {"policy": v}, label="gate", timeout_s=300)  # noqa: E731
    publisher = GatedPublisher(swapper, store, evaluate=evaluate, gate=gate)
    live = publisher.current()
    trainer = LightningTrainer(default_model_dir(), store, tasks, config, publisher)
    result = trainer.train()

    assert result["steps"] == 2 and trainer.versions == [live, live]
    assert swapper.router.alias("policy") == live and set(swapper.live_versions()) <= {live}  # none left
    rollouts = [r for r in store.list_rollouts() if r.metadata.get("trainer_run") == trainer.run_id]
    assert {r.resources["policy"] for r in rollouts} == {live}  # both steps sampled from the live version
    decisions = [d for d in list_decisions(store, "policy") if d.live == live]
    assert [(d.stage, d.outcome) for d in decisions] == [("eval", "refused"), ("eval", "refused")]
    for d in decisions:
        assert len(d.evidence["live_scores"]) == len(d.evidence["candidate_scores"]) == 4
        assert d.evidence["min_gain"] == 1.0 and "needs gain > 1" in d.reason
        assert d.candidate not in swapper.router.models()  # unloaded again
    candidates = {Version.parse(d.candidate).number for d in decisions}
    assert not any(r.active for r in store.list_resources("policy") if r.version in candidates)
    gate_rollouts = [r for r in store.list_rollouts() if r.metadata.get("eval") == "gate"]
    assert {r.resources["policy"] for r in gate_rollouts} == {live} | {d.candidate for d in decisions}


def test_trained_rollouts_sample_the_staged_adapter_while_the_gate_keeps_the_live_version(stack) -> None:
    """``rollout_version="trained"``: after step 1 the trainer stages its adapter (loaded, never served by
    default) and step 2's rollouts pin it, although the gate refuses every candidate; with dynamic sampling
    (``extra_tasks_per_step=1``) each step samples 3 groups and trains 2. The staged version is unloaded at
    the end and the alias never moved."""
    tmp, store, swapper = stack
    tasks = [Task(task_id=f"letter-{w}", input={"letter": w[0]}) for w in WORDS]
    held_out = [Task(task_id=f"held-{c}", input={"letter": c}) for c in "bd"]
    config = _config(
        tmp, "staged", extra_tasks_per_step=1, max_steps=2, swap_every=2, rollout_version="trained", seed=1
    )
    evaluate = lambda v: task_scores(store, held_out, {"policy": v}, label="gate", timeout_s=300)  # noqa: E731
    publisher = GatedPublisher(swapper, store, evaluate=evaluate, gate=EvalGate(max_p=None, min_gain=1.0))
    live = publisher.current()
    trainer = LightningTrainer(default_model_dir(), store, tasks, config, publisher)
    result = trainer.train()

    assert result["steps"] == 2 and swapper.router.alias("policy") == live
    rollouts = [r for r in store.list_rollouts() if r.metadata.get("trainer_run") == trainer.run_id]
    by_step = {s: [r for r in rollouts if r.metadata["step"] == s] for s in (0, 1)}
    assert len(by_step[0]) == len(by_step[1]) == 12  # 3 groups of 4 sampled per step
    assert {r.resources["policy"] for r in by_step[0]} == {live}
    (staged,) = {r.resources["policy"] for r in by_step[1]}
    record = store.get_resource("policy", Version.parse(staged).number)
    assert record.payload["staged"] and record.payload["step"] == 1 and not record.active
    assert staged != live and staged not in swapper.router.models() and publisher.staged is None
    assert [len(report.rewards) for report in trainer.source.reports] == [12, 12]
    assert all(report.groups == 2 and report.dropped_groups == 1 for report in trainer.source.reports)


def test_rollouts_in_other_dialects_train_a_step_and_the_new_version_serves_them(stack) -> None:
    """Issue 38: rollouts whose agent speaks the Responses API or the Anthropic Messages API (their official SDKs,
    through the gateway) are trained on like chat rollouts; after the hot-swap the next ones are served by the new
    version, in their own dialect."""
    tmp, store, swapper = stack
    before = swapper.router.alias("policy")
    tasks = [
        Task(task_id=f"dialect-{d}-{w}", input={"letter": w[0], "dialect": d})
        for d in ("responses", "anthropic")
        for w in WORDS[:1]
    ]
    # the subject is the dialects' path through the trainer, not the reward: with 2 groups of 4 short answers every
    # group's rewards can be equal (no signal: nothing would be published), so the step publishes either way
    config = _config(tmp, "dialects", max_steps=1, swap_every=1, seed=0, publish_without_signal=True)
    trainer = LightningTrainer(default_model_dir(), store, tasks, config, HotSwapPublisher(swapper, store))
    result = trainer.train()
    assert result["steps"] == 1 and swapper.router.alias("policy") != before
    trained = [r for r in store.list_rollouts() if r.metadata.get("trainer_run") == trainer.run_id]
    assert len(trained) == 8 and {r.metadata["trained_step"] for r in trained} == {0}
    for rollout in trained:  # every call recorded token-exactly, marked with the dialect its agent spoke
        (span,) = store.list_spans(rollout_id=rollout.rollout_id)
        assert span.attributes["dialect"] == rollout.task.input["dialect"] and span.llm.trainable
        assert len(span.llm.logprobs) == len(span.llm.completion_token_ids) > 0
    queued = enqueue_tasks(store, tasks, 1)  # the module's runner answers them
    done = wait_for_rollouts(store, [r.rollout_id for r in queued], timeout_s=120)
    new = swapper.router.alias("policy")
    for rollout in done:
        (span,) = store.list_spans(rollout_id=rollout.rollout_id)
        assert span.llm.version == new and span.attributes["dialect"] == rollout.task.input["dialect"]
