"""The lightning trainer under ``accelerate launch``: configs load, and 2 CPU processes (DDP over gloo) train.

The smoke run launches THIS file as the training script on 2 CPU processes. ``accelerate launch --cpu``
uses its single-process launcher (several CPU processes need ``mpirun`` there), so the test launches with
``--multi_gpu`` and ``ACCELERATE_USE_CPU=true``: torchrun starts 2 ranks, accelerate sets up DDP over gloo:
each rank builds the same :class:`LightningTrainer` over stored groups (offline GRPO on a store seeded
with 4 groups of 2 synthetic engine-style samples) and records what it trained on and what it published.
Checked: both ranks finished the same number of steps; only rank 0 called the sample source and the
publisher; every rank trained on its own disjoint slice of whole groups, and together they covered every
stored sample exactly once per epoch. ``test_publish_guard`` in ``test_trainer.py`` covers the guard on
one process too.

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 --mixed_precision no \
        tests/unit/trainers/test_accelerate.py OUT_DIR                                   # what the test runs
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
AGENT = "ddp-smoke"


def test_accelerate_configs_load() -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType

    ddp = load_config_from_file(str(ROOT / "configs" / "accelerate" / "ddp.yaml"))
    assert ddp.distributed_type == DistributedType.MULTI_GPU and ddp.num_processes == 2
    zero2 = load_config_from_file(str(ROOT / "configs" / "accelerate" / "zero2.yaml"))
    assert zero2.distributed_type == DistributedType.DEEPSPEED
    assert zero2.deepspeed_config["zero_stage"] == 2


def _seed(store, tokenizer) -> None:
    """4 succeeded groups of 2 rollouts, each with one LLM span of engine-style ids and logprobs."""
    from agentforge.types import LLMCall, Reward, Rollout, RolloutState, Span, SpanKind, Task

    for g, word in enumerate(["apple", "river", "stone", "cloud"]):
        for i in range(2):
            rollout = store.enqueue_rollout(
                Rollout(agent=AGENT, group_id=f"grp-{g}", task=Task(task_id=f"t-{g}", input={}))
            )
            store.update_rollout(rollout.rollout_id, state=RolloutState.running)
            completion = tokenizer.encode(f" {word}" if i == 0 else " something else")
            call = LLMCall(
                version="policy@v0",
                prompt_token_ids=tokenizer.encode(f"Say a word like {word}:"),
                completion_token_ids=completion,
                logprobs=[-1.0] * len(completion),
                finish_reason="stop",
            )
            store.add_span(Span(kind=SpanKind.llm, rollout_id=rollout.rollout_id, name="llm", llm=call))
            store.add_reward(Reward(rollout_id=rollout.rollout_id, value=float(i == 0), final=True))
            store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)


class _RecordingPublisher:
    """Counts publishes per rank in a file; never touches serving."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path, self.rank, self.version = path, rank, 0

    def current(self) -> str:
        return f"policy@v{self.version}"

    def publish(self, adapter_dir: Path, step: int) -> str:
        self.version += 1
        with self.path.open("a") as fh:
            fh.write(json.dumps({"rank": self.rank, "step": step, "dir": str(adapter_dir)}) + "\n")
        return self.current()


def main(out: Path, model: Path) -> None:
    """One rank of the smoke run on checkpoint ``model`` (rank 0 seeds the store first; the others wait at a
    barrier)."""
    from accelerate import PartialState
    from transformers import AutoTokenizer

    from agentforge.stores.sql import SQLStore
    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.grpo_trainer import LightningTrainer
    from agentforge.trainers.replay.grpo import StoredGroupSource
    from agentforge.trainers.replay.select import TraceFilter, select_traces

    state = PartialState()
    store = SQLStore(f"sqlite:///{out / 'traces.db'}")
    if state.is_main_process:
        _seed(store, AutoTokenizer.from_pretrained(model))
    state.wait_for_everyone()
    selection = select_traces(store, TraceFilter(agent=AGENT))
    source = StoredGroupSource(selection.groups(), 2)
    if state.is_main_process:
        groups = {g: [rec.rollout_id for rec in recs] for g, recs in selection.groups().items()}
        (out / "groups.json").write_text(json.dumps(groups))
    config = TrainConfig(
        output_dir=str(out / "run"),
        num_generations=2,
        tasks_per_step=1,
        num_train_epochs=1,
        learning_rate=5e-4,
        lora_r=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        max_completion_length=8,
    )
    publisher = _RecordingPublisher(out / "published.jsonl", state.process_index)
    trainer = LightningTrainer(
        model, store, None, config, publisher, source=source, swap_during_training=False
    )
    seen: list[list[str]] = []
    inner = trainer.trainer.rollout_func

    def recording(prompts, grpo):  # what this rank received from the rollout_func
        result = inner(prompts, grpo)
        seen.append(list(result["rollout_id"]))
        return result

    trainer.trainer.rollout_func = recording
    result = trainer.train()
    record = {
        "rank": state.process_index,
        "steps": result["steps"],
        "seen": seen,
        "source_calls": len(source.reports),
        "versions": result["versions"],
        "history": len(trainer.history),
        "distributed": str(state.distributed_type),
        "backend": state.backend,
        "zero_stage": getattr(trainer.trainer.model_wrapped, "zero_optimization_stage", lambda: None)(),
    }
    (out / f"rank-{state.process_index}.json").write_text(json.dumps(record))
    store.close()


LAUNCHES = {
    # accelerate's --cpu takes its single-process launcher; --multi_gpu + ACCELERATE_USE_CPU runs torchrun.
    "ddp": (["--multi_gpu"], {"ACCELERATE_USE_CPU": "true"}, "DistributedType.MULTI_CPU", None),
    "zero2": (
        ["--config_file", str(ROOT / "configs" / "accelerate" / "zero2.yaml")],
        # spinning OpenMP waits, not the suite's passive ones (tests/conftest.py): beside a busy core this
        # launch took 72 s with passive waits and 27 s with spinning ones (DDP is faster passive: 63 s vs 82 s)
        {"OMP_WAIT_POLICY": "ACTIVE"},
        "DistributedType.DEEPSPEED",
        2,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_two_cpu_processes_train_and_only_rank_0_publishes(tmp_path: Path, launch: str) -> None:
    # imported here, not at the top: torchrun runs this file as a script, where tests/support is not on the path
    from tiny_model import tiny_model

    flags, extra_env, distributed, zero_stage = LAUNCHES[launch]
    if launch == "zero2":
        pytest.importorskip("deepspeed", reason="ZeRO-2 needs `pip install deepspeed`")
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "OMP_NUM_THREADS": "1", **extra_env}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *flags,
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(29517 + len(launch)),
        __file__,
        str(tmp_path),
        str(tiny_model()),  # what is checked is the launch and who publishes, not the model's size
    ]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["steps"] for r in ranks] == [2, 2]
    assert {(r["distributed"], r["backend"], r["zero_stage"]) for r in ranks} == {
        (distributed, "gloo", zero_stage)
    }
    # Only rank 0 ran the source, wrote metrics and published (once, at the end: offline training).
    assert [r["source_calls"] for r in ranks] == [2, 0]
    assert [r["history"] for r in ranks] == [2, 0]
    published = [json.loads(line) for line in (tmp_path / "published.jsonl").read_text().splitlines()]
    assert [p["rank"] for p in published] == [0] and ranks[0]["versions"] == ["policy@v1"]
    assert ranks[1]["versions"] == []
    # Each rank got its own slice (whole groups), together every stored sample exactly once.
    groups = {rid: g for g, ids in json.loads((tmp_path / "groups.json").read_text()).items() for rid in ids}
    for r in ranks:
        for batch in r["seen"]:
            assert len(batch) == 2 and groups[batch[0]] == groups[batch[1]]  # a whole group per rank
    per_rank = [[rid for batch in r["seen"] for rid in batch] for r in ranks]
    assert all(len(ids) == 4 for ids in per_rank)
    assert not set(per_rank[0]) & set(per_rank[1])
    assert len(set(per_rank[0]) | set(per_rank[1])) == 8


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
