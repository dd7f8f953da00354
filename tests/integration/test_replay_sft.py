"""Rejection-sampling SFT from stored traces (issue 5 part 3).

Fast tests train a tiny random-init Llama (the default model's tokenizer, 2 layers of width 32) on traces
written straight into an in-memory store, and assert behaviour (STYLE 13): the loss is logged, the LoRA
weights change, the base weights do not, labels are -100 exactly on tokens the policy did not sample, an
empty selection writes nothing, and traces without engine token ids are counted skips. The slow test runs
a small version of ``examples/replay_job.py`` against real vLLM.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from prerequisites import REQUIRE_VLLM, missing

from agentforge.errors import ConfigError, UserError
from agentforge.testing import memory_store
from agentforge.trainers.replay.select import EmptySelectionError, TraceFilter, select_traces
from agentforge.trainers.replay.sft_config import ReplaySFTConfig
from agentforge.trainers.replay.sft_trainer import ReplaySFTTrainer, build_examples, run_replay_sft
from agentforge.types import AttemptState, LLMCall, ResourceVersion, Reward, Rollout, Span, SpanKind, Task

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-init 2-layer Llama with the default model's tokenizer (ids match the stored traces)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from agentforge.model import prepare_default_model

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(prepare_default_model())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


class FakePublisher:
    """Records each publish as a new store version, like HotSwapPublisher without a serving engine."""

    def __init__(self, store) -> None:  # type: ignore[no-untyped-def]
        self.store, self.published = store, []

    def current(self) -> str:
        return self.published[-1] if self.published else "policy@v0"

    def publish(self, adapter_dir: Path, step: int) -> str:
        record = self.store.publish_resource(
            ResourceVersion(name="policy", kind="adapter", payload={"path": str(adapter_dir), "step": step})
        )
        self.published.append(record.ref)
        return record.ref


def add_trace(
    store,
    task_id: str,
    calls: list[tuple[list[int], list[int]]],
    reward: float | None,
    token_ids: bool = True,
) -> str:
    """Store one succeeded rollout whose LLM calls had these (prompt ids, completion ids), scored ``reward``."""
    rollout = store.enqueue_rollout(Rollout(task=Task(task_id=task_id), resources={"policy": "policy@v0"}))
    claimed, attempt = store.claim_rollout("w-test")
    assert claimed.rollout_id == rollout.rollout_id
    for prompt, completion in calls:
        if token_ids:
            call = LLMCall(
                prompt_token_ids=prompt,
                completion_token_ids=completion,
                logprobs=[-0.5] * len(completion),
                version="policy@v0",
            )
        else:
            call = LLMCall(trainable=False, flags=["no_token_ids"], version="policy@v0")
        store.add_span(
            Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, kind=SpanKind.llm, llm=call)
        )
    if reward is not None:
        store.add_reward(Reward(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, value=reward))
    store.finish_attempt(attempt.attempt_id, AttemptState.succeeded)
    return rollout.rollout_id


@pytest.fixture
def store():  # type: ignore[no-untyped-def]
    """An in-memory store with 3 good traces (one two-turn with tool tokens), 1 failure, 1 without ids."""
    s = memory_store()
    add_trace(s, "t1", [([10, 11, 12], [20, 21])], 1.0)
    add_trace(s, "t2", [([10, 11, 13], [22, 23, 24]), ([10, 11, 13, 22, 23, 24, 30, 31], [25, 26])], 1.0)
    add_trace(s, "t3", [([10, 11, 14], [27])], 1.0)
    add_trace(s, "t4", [([10, 11, 15], [28, 29])], 0.0)
    add_trace(s, "t5", [([10, 11, 16], [20])], 1.0, token_ids=False)
    yield s
    s.close()


def config(tmp_path: Path, **kw) -> ReplaySFTConfig:  # type: ignore[no-untyped-def]
    args = dict(
        output_dir=str(tmp_path / "replay"),
        max_steps=4,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        lora_r=4,
        lora_alpha=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        dataset_num_proc=None,
        disable_tqdm=True,
    )
    args.update(kw)
    return ReplaySFTConfig(**args)


def test_config_is_validated_with_numbers(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lora_r=0 .*lora_dropout=1.5"):
        config(tmp_path, lora_r=0, lora_dropout=1.5)
    with pytest.raises(ConfigError, match="min_reward=nan"):
        config(tmp_path, min_reward=float("nan"))
    with pytest.raises(ConfigError, match="completion_only_loss=False"):
        config(tmp_path, completion_only_loss=False)
    assert config(tmp_path).completion_only_loss is True


def test_examples_come_from_stored_ids_with_sampled_tokens_in_the_mask(store) -> None:  # type: ignore[no-untyped-def]
    selection = select_traces(store, TraceFilter(min_reward=1.0))
    assert selection.skipped == {"reward below threshold": 1, "no token ids": 1}
    examples, skipped = build_examples(selection)
    assert not skipped
    by_prompt = {tuple(e["input_ids"][:3]): e for e in examples}
    two_turn = by_prompt[(10, 11, 13)]
    assert two_turn["input_ids"] == [10, 11, 13, 22, 23, 24, 30, 31, 25, 26]
    assert two_turn["completion_mask"] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]  # tool tokens 30, 31: no loss
    assert by_prompt[(10, 11, 12)]["completion_mask"] == [0, 0, 0, 1, 1]
    # the same answer sampled twice for one task trains once
    add_trace(store, "t1", [([10, 11, 12], [20, 21])], 1.0)
    examples, skipped = build_examples(select_traces(store, TraceFilter(min_reward=1.0)))
    assert len(examples) == 3 and skipped == {"duplicate": 1}


def test_labels_are_masked_exactly_on_tokens_the_policy_did_not_sample(store, tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    job = ReplaySFTTrainer(tiny_model, store, TraceFilter(), config(tmp_path))
    dataset = job.trainer.train_dataset
    assert set(dataset.column_names) == {"input_ids", "labels"}
    expected = {tuple(e["input_ids"]): e["completion_mask"] for e in job.examples}
    for row in dataset:
        mask = expected[tuple(row["input_ids"])]
        assert row["labels"] == [t if m else -100 for t, m in zip(row["input_ids"], mask, strict=True)]
    batch = job.trainer.data_collator([dataset[i] for i in range(len(dataset))])
    for ids, labels, attn in zip(batch["input_ids"], batch["labels"], batch["attention_mask"], strict=True):
        n = int(attn.sum())
        mask = torch.tensor(expected[tuple(ids[:n].tolist())])
        assert torch.equal(labels[:n] != -100, mask.bool())  # loss exactly on sampled tokens
        assert bool((labels[n:] == -100).all())  # and never on padding
    assert job.sampled_tokens == 2 + 5 + 1


def test_training_logs_loss_changes_lora_only_publishes_and_records(store, tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    publisher = FakePublisher(store)
    job = ReplaySFTTrainer(tiny_model, store, TraceFilter(), config(tmp_path), publisher)
    params = dict(job.trainer.model.named_parameters())
    before = {k: v.detach().clone() for k, v in params.items()}
    result = job.train()
    lora = [k for k in params if "lora_" in k]
    assert lora and all(params[k].requires_grad for k in lora)
    assert any(not torch.equal(before[k], params[k]) for k in lora if "lora_B" in k)  # B starts at zero
    assert all(torch.equal(before[k], params[k]) for k in params if "lora_" not in k)
    assert result.steps == 4 and result.final_loss is not None and result.train_loss > 0
    assert [row["loss"] for row in result.history if "loss" in row]
    assert (
        result.selected == 3
        and result.considered == 5
        and result.examples == 3
        and result.sampled_tokens == 8
    )
    assert result.skipped == {"reward below threshold": 1, "no token ids": 1}
    assert result.version == "policy@v1" and publisher.published == ["policy@v1"]
    assert (result.adapter_dir / "adapter_config.json").is_file()
    (span,) = [s for s in store.list_spans(orphans=True) if s.name == "replay.sft"]
    assert span.attributes["version"] == "policy@v1" and span.attributes["examples"] == 3
    assert span.attributes["filter"]["min_reward"] == 1.0
    assert json.loads((result.adapter_dir / "replay.json").read_text())["run_id"] == result.run_id


def test_a_filter_selecting_nothing_raises_and_writes_no_adapter_or_version(
    store, tiny_model, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    publisher = FakePublisher(store)
    with pytest.raises(EmptySelectionError, match="reward below threshold"):
        run_replay_sft(tiny_model, store, TraceFilter(task_ids=("t4",)), config(tmp_path), publisher)
    with pytest.raises(EmptySelectionError, match="no token ids"):
        run_replay_sft(tiny_model, store, TraceFilter(task_ids=("t5",)), config(tmp_path), publisher)
    assert not (tmp_path / "replay").exists() and publisher.published == []
    assert list(store.list_resources("policy")) == []
    assert not [s for s in store.list_spans(orphans=True) if s.name == "replay.sft"]


def test_token_ids_outside_the_vocabulary_are_refused(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = memory_store()
    add_trace(s, "big", [([1, 2], [10**6])], 1.0)
    with pytest.raises(UserError, match="outside"):
        ReplaySFTTrainer(tiny_model, s, TraceFilter(), config(tmp_path))


@pytest.mark.slow
@pytest.mark.vllm
def test_replay_job_end_to_end_publishes_a_version(tmp_path: Path) -> None:
    """A small run of examples/replay_job.py completes and publishes a version (improvement not asserted).

    ``--min-reward 0`` trains on every trace: 8 samples may hold no correct one, and this tests the plumbing.

    The job starts its own vLLM (``LocalStack``), so this test does not use the session's ``vllm_server``.
    """
    from agentforge.config import vllm_python

    if vllm_python() is None:
        missing(
            "there is no vLLM virtual environment (.venv-vllm or AGENTFORGE_VLLM_PYTHON); run `make setup`",
            REQUIRE_VLLM,
        )
    out = tmp_path / "replay-job"
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "replay_job.py"),
        "--rollouts",
        "8",
        "--eval-size",
        "4",
        "--epochs",
        "1",
        "--min-reward",
        "0",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # 1 = no improvement, allowed
    results = json.loads((out / "results.json").read_text())
    assert results["version"].startswith("policy@v") and results["version"] != "policy@v0"
    assert results["replay"]["examples"] >= 1 and results["replay"]["version"] == results["version"]
    shutil.rmtree(out / "sft", ignore_errors=True)
