"""Continual mode with late feedback: the order bot behind the app, simulated customers, gated promotions.

One command (``python examples/continual_order_app.py --simulate 12``) runs the whole loop and exits by itself:

* vLLM (runtime LoRA, hermes tool parser), the gateway and the SQLite store (``agentforge.stack.LocalStack``),
  with runner threads for the gate's evaluations;
* the app of ``examples/app/service.py`` serving the order bot (``examples/app/order_agent.py``:
  ``agents/customer_service/order_bot.py``'s LangGraph turn) on a local port (uvicorn in a thread);
* ``--simulate N`` customers, one every ``--interval-s`` seconds, each sending one held-out Bitext order message
  (``order_desk_tasks``' test split, never trained on by the main job) through the app's HTTP API. A customer's
  rating arrives ``--feedback-delay-s`` seconds **after the reply** (after the conversation was closed, so after
  its rollout finished): thumbs up (+1) when the turn succeeded — right tool, right order id, a reply stating the
  order's status (``rewards/tool_turn.py``, against the task's gold) — else thumbs down (−1). The store attaches
  the rating to the conversation's last span, the reply call, whose ``llm.version`` is the version that answered,
  whatever serves by then;
* :class:`~agentforge.trainers.continual.ContinualTrainer`: every ``--tasks-per-step`` rated conversations it
  re-runs each conversation's opening (the forced tool call, exactly as recorded) ``--group-size`` times and
  scores each re-run's call against the rated one (:func:`call_feedback_reward`), one GRPO step; every
  ``--swap-every`` steps the adapter goes through the promotion gate (``GatedPublisher``: staged in vLLM, exact
  sign test of task success on ``--gate-size`` training-split tasks against the live version) and serves the app
  only if it passes.

Written to ``--out`` (default ``runs/continual``): ``report.md`` (minutes, conversations, steps, promotions and
refusals, live reward before/after each version), ``promotions.md`` (every gate decision), ``live_reward.png``
(the customers' live reward per optimizer step with the trainer's batch reward and promotion markers),
``conversations.jsonl`` (one line per customer: the version that replied, the one serving at rating time, the
rating and the reward's span) and ``traces.db``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(
    0, str(HERE)
)  # main_job.py (the gate evaluation and the promotion log) sits next to this file

from continual_app import _service  # noqa: E402
from main_job import StepLog, evaluate, greedy  # noqa: E402

from agentforge.agents.customer_service.rewards.tool_turn import normalize_arguments, score_tool_turn  # noqa: E402

__all__ = ["Customers", "call_feedback_reward", "main"]


def _call(rendered: str) -> tuple[str, Any]:
    """``name(arguments)`` (the continual trainer's rendering of a call) → ``(name, normalised arguments)``."""
    name, _, rest = rendered.partition("(")
    return name.strip(), normalize_arguments(rest[:-1] if rest.endswith(")") else rest)


def call_feedback_reward(reply: str, reference: str, feedback: float) -> float | None:
    """Reward in [0, 1] of a re-run tool call against the rated conversation's call and its rating.

    ``sim`` is the mean of two exact parts (as ``rewards/tool_turn.py``): the same tool, and the same arguments
    after ``normalize_arguments``. A thumbs up rewards ``sim`` (do it again), a thumbs down ``1 - sim`` (do
    something else). A proxy: a thumbs down may be for the reply, not the call.

    Returns:
        The reward, or ``None`` (masked) for a rating of 0.
    """
    if feedback == 0:
        return None
    (name, args), (ref_name, ref_args) = _call(reply), _call(reference)
    sim = (float(bool(name) and name == ref_name) + float(args is not None and args == ref_args)) / 2
    return sim if feedback > 0 else 1.0 - sim


class Customers:
    """Simulated customers: one held-out message each through the app's HTTP API, a late rating each.

    Args:
        http: an ``httpx.Client`` on the app's root URL (or FastAPI's ``TestClient`` of the app).
        tasks: order-desk tasks (their ``input["text"]`` is the message, their gold scores the turn).
        delay_s: seconds between the reply and the rating.
        interval_s: seconds between two customers' arrivals.
        live_version: returns the version serving by default now (recorded at rating time).
    """

    def __init__(
        self, http: httpx.Client, tasks: list[Any], delay_s: float, interval_s: float, live_version: Any
    ) -> None:
        self.http = http
        self.tasks, self.delay_s, self.interval_s, self.live_version = (
            tasks,
            delay_s,
            interval_s,
            live_version,
        )
        self.records: list[dict[str, Any]] = []
        self.step = lambda: 0  # the trainer's optimizer step now (set once the trainer exists)
        self._due: list[tuple[float, int]] = []  # (when, record index) of ratings not yet sent
        self._lock = threading.Lock()
        self.done = threading.Event()

    def converse(self, task: Any) -> None:
        """One customer: open a session, send the message, close it; schedule the rating."""
        started = self.http.post("/sessions", json={"user": task.task_id}).json()
        auth = {"Authorization": f"Bearer {started['session_token']}"}
        sid = started["session_id"]
        resp = self.http.post(f"/sessions/{sid}/messages", json={"content": task.input["text"]}, headers=auth)
        self.http.post(f"/sessions/{sid}/close", headers=auth)
        answer = resp.json() if resp.status_code == 200 else {"reply": "", "tool_calls": []}
        turn = [
            *(
                {
                    "role": "assistant",
                    "tool_calls": [{"function": {"name": c["name"], "arguments": c["arguments"]}}],
                }
                for c in answer["tool_calls"]
            ),
            {"role": "assistant", "content": answer["reply"]},
        ]
        meta = task.metadata
        score = score_tool_turn(
            turn, meta["gold_tool"], meta["gold_arguments"], meta["gold_fact"], meta["fact_alternatives"]
        )
        record = {
            "session": sid,
            "task": task.task_id,
            "status": resp.status_code,
            "replied_at": time.time(),
            "step_at_reply": self.step(),
            "parts": score.parts(),
            "token": started["session_token"],
            "rating": 1.0 if score.success else -1.0,
        }
        with self._lock:
            self.records.append(record)
            heapq.heappush(self._due, (record["replied_at"] + self.delay_s, len(self.records) - 1))

    def _rate_due(self, until_all: bool) -> None:
        while True:
            with self._lock:
                if not self._due or self._due[0][0] > time.time():
                    if not until_all or not self._due:
                        return
                    wait = self._due[0][0] - time.time()
                else:
                    wait, (_, i) = 0.0, heapq.heappop(self._due)
            if wait > 0:
                time.sleep(min(wait, 1.0))
                continue
            record = self.records[i]
            record.update(
                live_at_rating=self.live_version(), rated_at=time.time(), step_at_rating=self.step()
            )
            auth = {"Authorization": f"Bearer {record.pop('token')}"}
            body = {"score": record["rating"], "comment": json.dumps(record["parts"])}
            out = self.http.post(f"/sessions/{record['session']}/feedback", json=body, headers=auth)
            record["reward_id"] = out.json().get("reward_id")

    def run(self) -> None:
        """Every customer in turn (one every ``interval_s``), rating each reply ``delay_s`` after it; then
        the remaining ratings; sets :attr:`done`."""
        try:
            for task in self.tasks:
                t0 = time.monotonic()
                self.converse(task)
                while time.monotonic() - t0 < self.interval_s:
                    self._rate_due(until_all=False)
                    time.sleep(0.5)
            self._rate_due(until_all=True)
        finally:
            self.done.set()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (``--help`` lists them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--simulate", type=int, default=12, help="simulated customers (held-out messages, cycled)")
    p.add_argument("--feedback-delay-s", type=float, default=45.0, help="seconds from a reply to its rating")
    p.add_argument("--interval-s", type=float, default=15.0, help="seconds between two customers' arrivals")
    p.add_argument("--group-size", type=int, default=4, help="re-runs per rated opening (GRPO G)")
    p.add_argument("--tasks-per-step", type=int, default=2, help="rated conversations per optimizer step")
    p.add_argument("--swap-every", type=int, default=3, help="publish (through the gate) every k steps")
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--gate-size", type=int, default=12, help="gate-slice tasks (training split, greedy)")
    p.add_argument("--gate-max-p", type=float, default=0.1, help="the eval gate's one-sided p-value bound")
    p.add_argument("--workers", type=int, default=8, help="runner threads (gate evaluations, re-runs)")
    p.add_argument("--port", type=int, default=8088, help="the app's port (loopback)")
    p.add_argument("--out", type=Path, default=Path("runs/continual"), help="output folder")
    return p.parse_args(argv)


def _attach(store: Any, records: list[dict[str, Any]]) -> None:
    """Add to each record the stored rating's span and the version that produced it (``llm.version``)."""
    for r in records:
        reward = store.final_reward(r["session"])
        span = next(
            (s for s in store.list_spans(rollout_id=r["session"]) if reward and s.span_id == reward.span_id),
            None,
        )
        r["reward_span"] = span.span_id if span else None
        r["replied_by"] = span.llm.version if span is not None and span.llm is not None else None
        r["rollout_state"] = store.get_rollout(r["session"]).state.value


def report(
    args: argparse.Namespace,
    records: list[dict[str, Any]],
    history: list[dict[str, Any]],
    entries: list[dict[str, Any]],
    minutes: float,
    steps: int,
) -> str:
    """Write report.md, promotions.md, live_reward.png and conversations.jsonl; return the summary line."""
    from agentforge.trainers.report import plot_reward_curves

    out = args.out
    with (out / "conversations.jsonl").open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    share = lambda rs: statistics.mean((r["rating"] + 1) / 2 for r in rs) if rs else float("nan")  # noqa: E731
    by_step: dict[int, list[dict[str, Any]]] = {}
    by_version: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_step.setdefault(r["step_at_reply"], []).append(r)
        by_version.setdefault(str(r["replied_by"]), []).append(r)
    live = [(s, share(rs)) for s, rs in sorted(by_step.items())]
    batch = [(h["step"], h.get("batch/reward_mean")) for h in history]
    markers = [(e["step"], e["outcome"]) for e in entries if e["outcome"] in ("promoted", "refused")]
    png = plot_reward_curves(
        {"live: thumbs-up share of customers": live, "trainer: re-run batch reward": batch},
        out / "live_reward.png",
        title="Continual order bot: live reward per optimizer step",
        markers={"live: thumbs-up share of customers": markers},
    )
    late = [r for r in records if r.get("rated_at") and r["rated_at"] > r["replied_at"]]
    replaced = [r for r in late if r.get("live_at_rating") != r.get("replied_by")]
    promoted = sum(e["outcome"] == "promoted" for e in entries)
    refused = sum(e["outcome"] == "refused" for e in entries)
    versions = list(by_version)
    first, last = (by_version[versions[0]], by_version[versions[-1]]) if versions else ([], [])
    summary = (
        f"{minutes:.1f} min; {len(records)} conversations rated ({len(late)} after the reply, "
        f"{len(replaced)} after their version was replaced); {steps} GRPO steps; {promoted} promoted, "
        f"{refused} refused; live thumbs-up share {share(first):.3f} ({versions[0] if versions else '-'}) "
        f"-> {share(last):.3f} ({versions[-1] if versions else '-'})"
    )
    lines = [
        "# Continual order bot with late feedback",
        "",
        f"- {summary}",
        f"- {args.simulate} customers every {args.interval_s:g} s, rating {args.feedback_delay_s:g} s after "
        f"the reply; {args.tasks_per_step} conversations × G={args.group_size} per step, gate every "
        f"{args.swap_every} steps (exact sign test on {args.gate_size} gate tasks, p ≤ {args.gate_max_p})",
        f"- live reward curve: {png.name}; promotion log: promotions.md; conversations: conversations.jsonl",
        "",
        "| version that replied | conversations | thumbs-up share | tool | arguments | reply |",
        "|---|---|---|---|---|---|",
    ]
    for v, rs in by_version.items():
        parts = [statistics.mean(r["parts"][p] for r in rs) for p in ("tool", "arguments", "reply")]
        lines.append(f"| {v} | {len(rs)} | {share(rs):.3f} | " + " | ".join(f"{x:.3f}" for x in parts) + " |")
    lines += [
        "",
        "| optimizer step at reply | conversations | thumbs-up share |",
        "|---|---|---|",
        *(f"| {s} | {len(by_step[s])} | {v:.3f} |" for s, v in live),
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    log = [
        "# Promotion log (every gate decision)",
        "",
        "| step | stage | outcome | candidate | live | live mean | candidate mean | p |",
        "|---" * 8 + "|",
    ]
    for e in entries:
        nums = [
            f"{x:.3f}" if isinstance(x, float) else "" for x in (e["live_mean"], e["candidate_mean"], e["p"])
        ]
        log.append(
            f"| {e['step']} | {e['stage']} | {e['outcome']} | {e['candidate']} | {e['live']} | "
            + " | ".join(nums)
            + " |"
        )
    (out / "promotions.md").write_text("\n".join(log) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    """Run the loop (module docstring); 0 when every conversation was rated late and attached to a span."""
    args = parse_args(argv)
    import uvicorn

    from agentforge import ContinualTrainer, GatedPublisher, LocalStack, TrainConfig, open_store
    from agentforge.agents.customer_service.order_desk import order_desk_tasks
    from agentforge.gate import EvalGate
    from agentforge.model import prepare_default_model

    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in ("traces.db", "traces.db-wal", "traces.db-shm"):
        (args.out / name).unlink(missing_ok=True)
    train, held_out = order_desk_tasks(args.gate_size, None)
    customers_tasks = [held_out[i % len(held_out)] for i in range(args.simulate)]
    gate_slice = greedy(train)
    store = open_store(f"sqlite:///{(args.out / 'traces.db').resolve()}")
    model = prepare_default_model()
    order_agent = _service_agent()
    with LocalStack(
        store,
        _gate_agent(),
        model=model,
        workers=args.workers,
        max_lora_rank=max(16, args.lora_r),
        runner_kwargs={"agent_name": ""},
    ) as stack:
        service = _service()
        app = service.create_app(
            stack.gateway.url, store, agent=order_agent, prompt_name=order_agent.PROMPT_NAME
        )
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning"))
        threading.Thread(target=server.run, name="app", daemon=True).start()
        while not server.started:
            time.sleep(0.1)
        gate = GatedPublisher(
            stack.swapper,
            store,
            gate=EvalGate(max_p=args.gate_max_p, min_gain=0.0),
            evaluate=lambda v: evaluate(store, gate_slice, v, f"gate-{v}")["scores"],
        )
        publisher = StepLog(gate)
        steps = args.simulate // args.tasks_per_step
        config = TrainConfig(
            output_dir=str(args.out / "trainer"),
            num_generations=args.group_size,
            tasks_per_step=args.tasks_per_step,
            swap_every=args.swap_every,
            learning_rate=args.learning_rate,
            lr_scheduler_type="constant",
            lora_r=args.lora_r,
            lora_alpha=2 * args.lora_r,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=True,
            gradient_checkpointing=False,
            rollout_timeout_s=300,
            wait_timeout_s=1200,
        )
        trainer = ContinualTrainer(
            model,
            store,
            stack.gateway.url,
            config,
            publisher,
            app_agent=service.AGENT,
            workers=args.workers,
            reward_fn=call_feedback_reward,
            poll_s=1.0,
        )
        http = httpx.Client(base_url=f"http://127.0.0.1:{args.port}", timeout=300)
        sim = Customers(http, customers_tasks, args.feedback_delay_s, args.interval_s, publisher.current)
        sim.step = lambda: int(trainer.lightning.trainer.state.global_step) if trainer.lightning else 0
        print(
            f"vLLM up in {stack.server.startup_s:.0f}s; app on :{args.port}; {args.simulate} customers, "
            f"ratings {args.feedback_delay_s:g}s after each reply",
            flush=True,
        )
        threading.Thread(target=sim.run, name="customers", daemon=True).start()
        threading.Thread(
            target=_stop_when_rated, args=(sim, trainer, args.tasks_per_step), daemon=True
        ).start()
        try:
            result = trainer.run(max_steps=steps)
        finally:
            server.should_exit = True
        gate.wait_watch()
        _attach(store, sim.records)
    minutes = (time.monotonic() - t0) / 60
    summary = report(args, sim.records, result["history"], publisher.entries, minutes, result["steps"])
    print(summary, flush=True)
    print(f"report: {args.out / 'report.md'}  curve: {args.out / 'live_reward.png'}", flush=True)
    store.close()
    return 0 if sim.records and all(r.get("reward_span") for r in sim.records) else 1


def _stop_when_rated(sim: Customers, trainer: Any, per_step: int) -> None:
    """Once every customer rated, stop the trainer when fewer than ``per_step`` rated conversations remain."""
    sim.done.wait()
    while not trainer._stop.is_set():
        if len(trainer.source.pending()) < per_step:
            time.sleep(2.0)  # a step forming now has already taken its conversations
            if len(trainer.source.pending()) < per_step:
                trainer.stop()
                return
        time.sleep(2.0)


def _service_agent() -> Any:
    """``examples/app/order_agent.py`` as a module."""
    sys.path.insert(0, str(HERE / "app"))
    import order_agent

    return order_agent


def _gate_agent() -> Any:
    from agentforge.agents.customer_service.order_bot import OrderDeskAgent

    return OrderDeskAgent()


if __name__ == "__main__":
    sys.exit(main())
