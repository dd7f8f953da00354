"""Replay SFT runs each batch's shared prompt head once (``trainers/replay/prefix_sft.py``).

On a batch whose prompts share a head (tails of different lengths, two rows with the same prompt, completions
with masked tool tokens inside), :class:`SharedPrefixSFTTrainer`'s loss, logged metrics and LoRA gradients
equal TRL's own ``SFTTrainer.compute_loss`` (per-row) to float32 rounding, with and without
``num_items_in_batch``, through three model calls (head, tails, completions). Batches with nothing to share
fall back to TRL's pass. A real :class:`ReplaySFTTrainer` run with gradient accumulation logs the same losses
and gradient norms with sharing on and off.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_policy import lora_grads

from agentforge.testing import memory_store
from agentforge.trainers.replay.prefix_sft import SharedPrefixSFTTrainer, split_prompt_completion
from agentforge.trainers.replay.select import TraceFilter
from agentforge.trainers.replay.sft_config import ReplaySFTConfig
from agentforge.trainers.replay.sft_trainer import ReplaySFTTrainer
from agentforge.types import AttemptState, LLMCall, Reward, Rollout, Span, SpanKind, Task

HEAD = list(range(100, 112))  # 12 shared tokens (system prompt, tool schemas)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A random-init 2-layer Llama with the default model's tokenizer, saved as a checkpoint folder."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from agentforge.model import prepare_default_model

    folder = tmp_path_factory.mktemp("tiny-llama-sft")
    tokenizer = AutoTokenizer.from_pretrained(prepare_default_model())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def examples() -> list[dict[str, list[int]]]:
    """``head + tail + answer [+ tool result + reply]`` rows: tails of 0-5 tokens, two rows share a prompt."""
    rows = [
        (HEAD + [200], [300, 301, 302], [], []),
        (HEAD + [201, 202, 203], [310, 311], [400, 401, 402], [320, 321, 322, 323]),
        (HEAD + [204, 205, 206, 207, 208], [330], [410], [340, 341]),
        (HEAD + [201, 202, 203], [350, 351, 352, 353], [420, 421], [360]),  # same prompt as row 1
    ]
    out = []
    for prompt, answer, tool, reply in rows:
        ids = prompt + answer + tool + reply
        mask = [0] * len(prompt) + [1] * len(answer) + [0] * len(tool) + [1] * len(reply)
        out.append({"input_ids": ids, "completion_mask": mask})
    return out


def sft_trainer(model_dir, tmp_path, data, **kw):  # type: ignore[no-untyped-def]
    """A :class:`SharedPrefixSFTTrainer` on ``data`` with a random (non-zero) rank-4 LoRA, float32."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer

    args = dict(
        output_dir=str(tmp_path / "sft"),
        per_device_train_batch_size=len(data),
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=0,
        disable_tqdm=True,
        save_strategy="no",
        dataset_num_proc=None,
    )
    args.update(kw)
    torch.manual_seed(0)
    return SharedPrefixSFTTrainer(
        model=str(model_dir),
        args=ReplaySFTConfig(**args),
        train_dataset=Dataset.from_list(data),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=LoraConfig(
            r=4, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM"
        ),
    )


def replay_config(output_dir: Path, **overrides: Any) -> ReplaySFTConfig:
    """A float32 replay-SFT config for the tiny model: 2 optimizer steps of 2 rows, rank-4 LoRA, nothing saved."""
    settings: dict[str, Any] = dict(
        max_steps=2,
        per_device_train_batch_size=2,
        lora_r=4,
        lora_alpha=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        bf16=False,
        gradient_checkpointing=False,
        dataset_num_proc=None,
        disable_tqdm=True,
    )
    return ReplaySFTConfig(output_dir=str(output_dir), **{**settings, **overrides})


def both_losses(trainer, batch, num_items_in_batch):  # type: ignore[no-untyped-def]
    """``(loss, metrics, grads)`` of TRL's per-row ``compute_loss`` and then of the shared one, same batch."""
    from trl import SFTTrainer

    model = trainer.model
    model.train()
    results = []
    for compute in (SFTTrainer.compute_loss, type(trainer).compute_loss):
        loss = compute(trainer, model, dict(batch), num_items_in_batch=num_items_in_batch)
        loss.backward()
        metrics = {k: v[-1] for k, v in trainer._metrics["train"].items() if k != "num_tokens"}
        results.append((loss.detach(), metrics, lora_grads(model)))
    return results


def test_split_keeps_masked_tool_tokens_in_the_completion_and_needs_right_padding() -> None:
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [5, 6, 11, 12, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    labels = torch.tensor([[-100, -100, 7, -100, 9, 10], [-100, -100, -100, 12, -100, -100]])
    batch = split_prompt_completion(ids, attn, labels, pad_token_id=0)
    assert batch is not None and batch.completion_len == 4
    assert batch.input_ids.tolist() == [[0, 5, 6, 7, 8, 9, 10], [5, 6, 11, 12, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0]]
    assert batch.labels.tolist() == [[7, -100, 9, 10], [12, -100, -100, -100]]
    assert split_prompt_completion(ids, attn.flip(1), labels) is None, "left padding: TRL's pass"
    no_loss = labels.clone()
    no_loss[1] = -100
    no_loss[1, 0] = 5  # position 0 is never scored (TRL shifts the labels)
    assert split_prompt_completion(ids, attn, no_loss) is None


@pytest.mark.parametrize("num_items_in_batch", [None, 23])
def test_loss_metrics_and_gradients_equal_trl_per_row_pass(tiny_model, tmp_path, num_items_in_batch) -> None:  # type: ignore[no-untyped-def]
    trainer = sft_trainer(tiny_model, tmp_path, examples())
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    calls: list[tuple[int, ...]] = []
    hook = trainer.model.get_base_model().model.register_forward_hook(
        lambda module, args, kwargs, out: calls.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    items = None if num_items_in_batch is None else torch.tensor(num_items_in_batch)
    (ref, ref_metrics, ref_grads), (got, metrics, grads) = both_losses(trainer, batch, items)
    hook.remove()

    rows, width = batch["input_ids"].shape
    assert calls[0] == (rows, width), "TRL's pass: every row whole"
    # the shared pass: the 12-token head once, the 3 distinct tails but their last token (width 4), completions
    assert calls[1:] == [(1, 12), (3, 4), (rows, 9)]
    assert trainer.shared_prefix_calls == 1 and trainer.fallback_calls == 0
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
    assert metrics.keys() == ref_metrics.keys() >= {"entropy", "mean_token_accuracy"}
    for key, value in ref_metrics.items():
        assert math.isclose(metrics[key], value, rel_tol=1e-5, abs_tol=1e-6), key
    assert grads.keys() == ref_grads.keys() and any("lora_A" in k for k in grads)
    for name, grad in ref_grads.items():
        scale = float(grad.abs().max())
        assert scale > 0, name
        torch.testing.assert_close(
            grads[name], grad, atol=1e-5 * scale, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
        )


def test_batches_with_nothing_to_share_use_trl_pass(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    data = examples()
    no_head = [
        dict(e, input_ids=[7 + i] + e["input_ids"][1:]) for i, e in enumerate(data)
    ]  # first tokens differ
    for rows, kw in ((data[:1], {}), (no_head, {}), (data, {"gradient_checkpointing": True})):
        trainer = sft_trainer(tiny_model, tmp_path, rows, **kw)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
        (ref, _, ref_grads), (got, _, grads) = both_losses(trainer, batch, None)
        assert trainer.shared_prefix_calls == 0 and trainer.fallback_calls == 1, kw or len(rows)
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
        for name, grad in ref_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5)


def add_trace(store, task_id: str, calls: list[tuple[list[int], list[int]]]) -> None:  # type: ignore[no-untyped-def]
    """One succeeded rollout (reward 1.0) whose LLM calls had these (prompt ids, completion ids)."""
    rollout = store.enqueue_rollout(Rollout(task=Task(task_id=task_id), resources={"policy": "policy@v0"}))
    _, attempt = store.claim_rollout("w-test")
    for prompt, completion in calls:
        call = LLMCall(
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=[-0.5] * len(completion),
            version="policy@v0",
        )
        store.add_span(
            Span(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, kind=SpanKind.llm, llm=call)
        )
    store.add_reward(Reward(rollout_id=rollout.rollout_id, attempt_id=attempt.attempt_id, value=1.0))
    store.finish_attempt(attempt.attempt_id, AttemptState.succeeded)


def test_replay_sft_with_gradient_accumulation_logs_the_same_losses_shared_or_not(
    tiny_model, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """2 optimizer steps of 2 micro-batches of 2 rows (8 trajectories of different lengths, two of them two-turn
    with tool tokens): TRL normalises by the step's loss tokens (``num_items_in_batch``); so does the shared pass.
    In float32: TRL's default bf16 autocast rounds each path differently (~1e-4 relative on this model)."""
    store = memory_store()
    for i in range(8):
        prompt = HEAD + [200 + i] * (i % 3 + 1)
        answer = [300 + i] * (i % 4 + 1)
        calls = [(prompt, answer)]
        if i % 4 == 1:  # a tool call, the tool's answer (no loss), the reply
            calls.append((prompt + answer + [400, 401, 402], [500 + i, 501 + i]))
        add_trace(store, f"t{i}", calls)
    runs = {}
    for share in (False, True):
        config = replay_config(
            tmp_path / f"share-{share}",
            share_prompt_prefix=share,
            gradient_accumulation_steps=2,
            learning_rate=1e-3,
            data_seed=0,
        )
        job = ReplaySFTTrainer(tiny_model, store, TraceFilter(), config)
        result = job.train()
        runs[share] = ([row for row in result.history if "loss" in row], job)
    (plain, plain_job), (shared, shared_job) = runs[False], runs[True]
    assert not isinstance(plain_job.trainer, SharedPrefixSFTTrainer)
    assert shared_job.trainer.shared_prefix_calls == 4 and shared_job.trainer.fallback_calls == 0
    assert shared_job.sampled_tokens == plain_job.sampled_tokens > 0
    assert len(plain) == len(shared) == 2
    first, again = plain[0], shared[0]
    for key in ("loss", "grad_norm", "entropy", "mean_token_accuracy", "num_tokens"):
        assert math.isclose(again[key], first[key], rel_tol=1e-5, abs_tol=1e-6), key
    assert math.isclose(shared[1]["loss"], plain[1]["loss"], rel_tol=1e-3), "after one update: rounding only"


def test_replay_sft_continues_a_saved_adapter(tiny_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``ReplaySFTConfig.init_adapter`` (a later rejection-sampling round): the job starts from the saved adapter's
    weights, not a fresh LoRA, and trains them further."""
    from safetensors.torch import load_file

    store = memory_store()
    for i in range(4):
        add_trace(store, f"t{i}", [(HEAD + [200 + i], [300 + i, 301 + i])])

    def config(name: str, **kw: object) -> ReplaySFTConfig:
        return replay_config(tmp_path / name, learning_rate=1e-2, **kw)

    first = ReplaySFTTrainer(tiny_model, store, TraceFilter(), config("first")).train()
    saved = load_file(str(first.adapter_dir / "adapter_model.safetensors"))
    job = ReplaySFTTrainer(
        tiny_model, store, TraceFilter(), config("second", init_adapter=str(first.adapter_dir))
    )
    start = {k: v.detach().clone() for k, v in job.trainer.model.named_parameters() if "lora_" in k}
    assert len(start) == len(saved) > 0
    for name, value in start.items():  # PEFT names the loaded tensors "<module>.lora_A.default.weight"
        assert torch.equal(value, saved[name.replace(".default", "")]), name
    second = job.train()
    after = load_file(str(second.adapter_dir / "adapter_model.safetensors"))
    assert any(not torch.equal(after[k], saved[k]) for k in saved)  # and it learns on
