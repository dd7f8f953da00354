"""Issue 15, item 4: the stored logprobs and the trainer's recomputed ones describe the same distribution.

Two embedded engines serve the same tiny model (a copy of ``tiny_model`` whose final norm is scaled ×20, so
its logits spread and a temperature visibly changes every log-probability): one returns processed logprobs
(of the distribution sampled from), one raw logprobs (vLLM's default). An agent samples through the gateway at
temperature 0.7, 1.3 and 1.0 on each; the trainer (configured temperature 1.0, weights identical to the
engine's: LoRA B starts at zero) runs one GRPO step on them.

Guards against: the trainer recomputing every span at its one configured temperature and ignoring the span's
own (the processed 0.7 / 1.3 spans' ratio would be far from 1 and then be capped, i.e. silently
down-weighted); spans whose engine returned raw logprobs at a temperature other than 1 (the stored values
describe another distribution than the one sampled) being trained on instead of excluded and counted; the
engine's log-prob mode not being recorded on the spans; the raw ratio not being logged before TRL's cap.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tiny_model import tiny_model

from agentforge.gateway.router import ModelRouter
from agentforge.gateway.server import GatewayServer
from agentforge.runtime import Runner
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.hotswap import HotSwapper
from agentforge.serving.publisher import HotSwapPublisher
from agentforge.stores.sql import SQLStore
from agentforge.trainers.grpo_config import TrainConfig
from agentforge.trainers.grpo_trainer import LightningTrainer
from agentforge.types import SpanKind, Task

pytestmark = pytest.mark.slow

TEMPERATURES = (0.7, 1.3, 1.0)


def _peaky_model(folder: Path) -> Path:
    """``tiny_model()`` with its final norm ×20: logits with a spread of a few nats instead of ~0.1."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = tiny_model()
    model = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        model.model.norm.weight.mul_(20.0)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def _agent(task: Task, ctx) -> float:  # type: ignore[no-untyped-def]
    out = ctx.openai_client().chat.completions.create(
        model=task.input["model"],
        messages=[{"role": "user", "content": f"Say something ({task.task_id})."}],
        max_tokens=6,
        temperature=task.input["temperature"],
    )
    return float(len(out.choices[0].message.content or "") % 2)  # any reward: the ratio is under test


def test_importance_ratio_is_one_for_every_span_at_its_own_temperature(tmp_path: Path) -> None:
    model = _peaky_model(tmp_path / "peaky")
    store = SQLStore(f"sqlite:///{tmp_path / 'traces.db'}")
    processed = EmbeddedServer(model, logprobs_mode="processed_logprobs")
    raw = EmbeddedServer(model)  # raw_logprobs, vLLM's default
    processed.start()
    raw.start()
    router = ModelRouter()
    swapper = HotSwapper(processed, router, alias="policy")
    swapper.register_base()
    HotSwapper(raw, router, alias="rawpolicy").register_base()
    gateway = GatewayServer(store, router).start()
    runner = Runner(store, _agent, gateway.url, workers=2, mode="thread").start()
    try:
        tasks = [
            Task(task_id=f"{alias}-{t}", input={"model": alias, "temperature": t})
            for alias in ("policy", "rawpolicy")
            for t in TEMPERATURES
        ]
        config = TrainConfig(
            output_dir=str(tmp_path / "run"),
            num_generations=2,
            tasks_per_step=len(tasks),
            max_steps=1,
            temperature=1.0,
            lora_r=8,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            seed=0,
            max_completion_length=6,
            rollout_timeout_s=120,
            wait_timeout_s=300,
        )
        trainer = LightningTrainer(model, store, tasks, config, HotSwapPublisher(swapper, store))
        result = trainer.train()
    finally:
        runner.stop()
        gateway.stop()

    row = result["history"][0]
    # Every trained span (processed at 0.7, 1.3, 1.0; raw at 1.0) recomputes to its stored logprobs: the raw
    # ratio, before any cap, is 1 ± 0.01 on every sampled token.
    ratio = {k.rsplit("/", 1)[1]: v for k, v in row.items() if k.startswith("sampling/raw_importance_ratio/")}
    assert set(ratio) == {"mean", "min", "max", "p01", "p99", "outside_share"}, row
    assert 0.99 <= ratio["min"] and ratio["max"] <= 1.01 and ratio["outside_share"] == 0.0, ratio
    assert ratio["min"] <= ratio["p01"] <= ratio["mean"] <= ratio["p99"] <= ratio["max"], ratio
    # The raw engine's 0.7 and 1.3 spans (2 rollouts each) are excluded and counted, not down-weighted.
    assert row["batch/skipped_unmatched_logprobs"] == 4.0
    assert row["batch/skipped_failed"] == 0.0 and row["batch/skipped_invalid"] == 0.0

    # The engine's mode is recorded on every span; the request's temperature is on it too.
    spans = [s for s in store.list_spans(kind=SpanKind.llm) if s.rollout_id]
    modes = {(s.llm.model, s.attributes.get("logprobs_mode")) for s in spans if s.llm}
    assert modes == {("policy", "processed_logprobs"), ("rawpolicy", "raw_logprobs")}

    # The guard bites: recomputed at the configured 1.0 instead of their own temperature, the processed
    # 0.7 / 1.3 spans would be far outside 1 ± 0.01.
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model).eval()
    worst = 0.0
    for span in spans:
        llm = span.llm
        if llm is None or llm.model != "policy" or llm.sampling.get("temperature") == 1.0:
            continue
        ids = torch.tensor([llm.prompt_token_ids + llm.completion_token_ids])
        with torch.no_grad():
            logits = reference(ids).logits[0, len(llm.prompt_token_ids) - 1 : -1]
        at_one = torch.log_softmax(logits.float(), -1).gather(
            1, torch.tensor(llm.completion_token_ids)[:, None]
        )
        stored = torch.tensor(llm.logprobs)[:, None]
        worst = max(worst, float((at_one - stored).abs().max()))
    assert worst > math.log(1.05), (
        f"the configured-temperature recomputation differs by only {worst:.4f} nats"
    )
    processed.stop()
    raw.stop()
    store.close()
