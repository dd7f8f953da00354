"""Offline GRPO on stored groups (default 135M model, embedded backend; no new rollouts while training).

Behaviour (STYLE 13): the LoRA weights changed, the base weights did not, a loss was logged, each stored
group was used exactly once per epoch, the engine's logprobs reached TRL's importance-sampling correction,
zero-variance groups and missing rewards were counted, and one adapter version was published at the end.
An empty selection fails with a clear error before anything is trained or published.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from adapters import assert_only_lora_moved
from safetensors.torch import load_file

from agentforge.config import default_model_dir
from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.model import prepare_default_model
from agentforge.runtime import Runner
from agentforge.runtime.tasks import enqueue_tasks, wait_for_rollouts
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.stores.sql import SQLStore
from agentforge.tracing import emit_reward
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.grpo_trainer import LightningTrainer
from agentforge.trainers.replay import EmptySelectionError, TraceFilter
from agentforge.trainers.replay.grpo import run_offline_grpo
from agentforge.types import Task

pytestmark = pytest.mark.slow

AGENT = "offline-letters"
#: Rewards written per group (``None``: no reward stored): varied, varied, all equal, one missing.
REWARDS = [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, None, 0.0, 0.0]]


def _unscored_letter_agent(task, ctx):
    """Says one word; returns no reward (the test stores the rewards itself)."""
    ctx.openai_client().chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": f"Say a word that starts with {task.input['letter']}."}],
        max_tokens=4,
        temperature=1.0,
    )


@pytest.fixture(scope="module")
def stored_groups(tmp_path_factory):
    """Four stored groups of 4 rollouts (real engine ids and logprobs), rewards from :data:`REWARDS`."""
    prepare_default_model()
    tmp = tmp_path_factory.mktemp("offline")
    store = SQLStore(f"sqlite:///{tmp / 'traces.db'}")
    server = EmbeddedServer(default_model_dir(), max_lora_rank=16)
    server.start()
    swapper = HotSwapper(server, ModelRouter(), alias="policy")
    swapper.register_base()
    gateway = GatewayServer(store, swapper.router).start()
    runner = Runner(store, _unscored_letter_agent, gateway.url, workers=2, mode="thread", agent_name=AGENT)
    runner.start()
    tasks = [Task(task_id=f"letter-{c}", input={"letter": c}) for c in "abst"]
    rollouts = enqueue_tasks(store, tasks, group_size=4, resources={"policy": "policy@v0"}, agent=AGENT)
    wait_for_rollouts(store, [r.rollout_id for r in rollouts], timeout_s=300)
    runner.stop()
    groups: dict[str, list[str]] = {}
    for r in rollouts:
        groups.setdefault(r.group_id, []).append(r.rollout_id)
    for ids, values in zip(groups.values(), REWARDS, strict=True):
        for rid, value in zip(ids, values, strict=True):
            if value is not None:
                emit_reward(value, name="test", final=True, rollout_id=rid, source="test", store=store)
    yield tmp, store, swapper, list(groups)
    gateway.stop()
    server.stop()
    store.close()


def _config(tmp, **kw) -> TrainConfig:
    return TrainConfig(
        output_dir=str(tmp / "offline-run"),
        num_generations=4,
        tasks_per_step=2,
        num_train_epochs=1,
        learning_rate=5e-4,
        lora_r=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        **kw,
    )


def test_empty_selection_is_a_clear_error_and_publishes_nothing(stored_groups) -> None:
    tmp, store, swapper, _ = stored_groups
    publisher = HotSwapPublisher(swapper, store)
    with pytest.raises(EmptySelectionError, match="no stored trace matches agent='nobody'"):
        run_offline_grpo(default_model_dir(), store, TraceFilter(agent="nobody"), _config(tmp), publisher)
    assert store.list_resources("policy") == []
    assert swapper.router.alias("policy") == "policy@v0"


def test_offline_grpo_trains_each_group_once_and_publishes_one_version(stored_groups, monkeypatch) -> None:
    tmp, store, swapper, group_ids = stored_groups
    before: dict[str, torch.Tensor] = {}
    trained: list[LightningTrainer] = []
    train = LightningTrainer.train

    def snapshot_then_train(self: LightningTrainer, *args, **kwargs):
        """Snapshot the in-memory parameters (LoRA and base) of the trainer run_offline_grpo built."""
        before.update({k: v.detach().clone() for k, v in self.trainer.model.named_parameters()})
        trained.append(self)
        return train(self, *args, **kwargs)

    monkeypatch.setattr(LightningTrainer, "train", snapshot_then_train)
    enqueued_before = len(store.list_rollouts())
    publisher = HotSwapPublisher(swapper, store)

    result = run_offline_grpo(default_model_dir(), store, TraceFilter(agent=AGENT), _config(tmp), publisher)

    # One epoch over 4 groups at 2 groups per step: 2 steps, every group exactly once, nothing generated.
    assert result["steps"] == 2
    assert Counter(result["used"]) == dict.fromkeys(group_ids, 1)
    assert len(store.list_rollouts()) == enqueued_before
    # One version at the end, served now.
    assert result["versions"] == ["policy@v1"]
    assert swapper.router.alias("policy") == "policy@v1"
    # Loss, the engine logprobs' importance-sampling correction and the counts were logged.
    history = result["history"]
    assert len(history) == 2 and all("loss" in row for row in history)
    assert all("sampling/importance_sampling_ratio/mean" in row for row in history)
    assert sum(row["batch/skipped_missing_reward"] for row in history) == 1
    assert sum(row["batch/zero_variance_share"] for row in history) == 0.5  # one of the two steps' 2 groups
    # LoRA B (zero at init) moved, in memory and in the published adapter; the base weights in memory did not.
    adapter = load_file(str(tmp / "offline-run" / "adapters" / "step-2" / "adapter_model.safetensors"))
    assert any(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)
    (trainer,) = trained
    assert_only_lora_moved(before, trainer.trainer.model)
