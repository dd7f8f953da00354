"""``agentforge run``: runners that execute an agent on queued rollouts (or on a task file) via a gateway."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypedDict

import typer
from rich.markup import escape

from agentforge.commands.common import (
    console,
    open_store_url,
    parse_pins,
    progress,
    reported,
    user_code_importable,
)

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.runtime import Runner

__all__ = ["run"]


def run(
    agent: Annotated[str, typer.Argument(help="The agent as module:function (or file.py:function).")],
    gateway: Annotated[
        str, typer.Option(help="Gateway URL (from `agentforge serve`).")
    ] = "http://127.0.0.1:8000",
    store_url: Annotated[
        str | None, typer.Option(help="Trace store URL (default: the gateway's store API).")
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option(
            help='JSONL file of tasks ({"input": {...}, "metadata": {...}} per line): enqueue, '
            "run them all, print the mean reward and exit. Without it, serve queued rollouts until Ctrl-C."
        ),
    ] = None,
    group_size: Annotated[int, typer.Option(help="Rollouts per task (with --tasks).")] = 1,
    pin: Annotated[
        list[str] | None, typer.Option(help="Pin a resource version on the rollouts, NAME=VERSION (repeat).")
    ] = None,
    workers: Annotated[int, typer.Option(help="Concurrent rollouts.")] = 4,
    mode: Annotated[str, typer.Option(help="thread or process workers.")] = "thread",
    agent_name: Annotated[
        str | None,
        typer.Option(
            help="Agent name stored on the rollouts (with --tasks; default: the AGENT spec) and the "
            "only name this runner claims (without --tasks: default any)."
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(help="Give up waiting for --tasks after this many seconds.")
    ] = 3600.0,
    api_key: Annotated[
        str | None, typer.Option(envvar="AGENTFORGE_API_KEY", help="Bearer key of the gateway/store.")
    ] = None,
    engine_url: Annotated[
        str | None,
        typer.Option(
            help="The engine's own address that `agentforge serve` prints (engine URL): agents get it as "
            "ctx.engine, for calls never recorded or trained on (a simulated customer)."
        ),
    ] = None,
    engine_key: Annotated[
        str, typer.Option(envvar="AGENTFORGE_ENGINE_KEY", help="The engine's key that `serve` prints.")
    ] = "",
    engine_model: Annotated[str, typer.Option(help="The engine's model name that `serve` prints.")] = "base",
) -> None:
    """Run AGENT on rollouts through the gateway: every LLM call is recorded, the agent's return is the reward.

    Example: `agentforge run my_pkg.agents:triage --tasks tasks.jsonl --group-size 4`.
    """
    from agentforge.runtime import Runner, build_agent, enqueue_tasks, load_tasks

    if mode not in ("thread", "process"):
        raise typer.BadParameter("choose thread or process", param_hint="--mode")
    if group_size < 1 or workers < 1:
        raise typer.BadParameter("--group-size and --workers must be >= 1")
    if not gateway.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"{gateway!r} is not a URL like http://127.0.0.1:8000", param_hint="--gateway"
        )
    if engine_url is not None and not engine_url.startswith(("http://", "https://")):
        raise typer.BadParameter(
            f"{engine_url!r} is not a URL like http://127.0.0.1:40123/v1", param_hint="--engine-url"
        )
    from agentforge.runtime.context import EngineEndpoint

    engine = (
        None if engine_url is None else EngineEndpoint(engine_url, api_key=engine_key, model=engine_model)
    )
    pins = parse_pins(pin)
    user_code_importable()
    terminate_like_ctrl_c()  # SIGTERM cleans up as Ctrl-C does: nothing of this run is left running
    with reported():
        task_list = load_tasks(tasks) if tasks is not None else None
        build_agent(agent)  # a wrong spec fails here, before any store or queue is touched
        name = agent_name or (agent if task_list is not None else None)
        store = open_store_url(store_url or gateway, api_key=api_key)
        _check_pins(store, pins)
        runner = Runner(
            store,
            agent,
            gateway,
            workers=workers,
            mode=mode,
            agent_name=name,
            gateway_api_key=api_key,
            store_api_key=api_key,
            engine=engine,
        )
        ids: list[str] = []
        try:
            with runner:
                if task_list is None:
                    console.print(
                        f"[bold green]running[/] {agent} × {workers} against {gateway}; Ctrl-C to stop"
                    )
                    try:
                        runner.run_forever()
                    except KeyboardInterrupt:
                        console.print("stopping: unfinished rollouts go back to the queue")
                    return
                rollouts = enqueue_tasks(store, task_list, group_size, pins, agent=name or "")
                ids = [r.rollout_id for r in rollouts]
                summary = _wait(store, runner, ids, timeout)
        except BaseException:
            _cancel_queued(
                store, ids
            )  # after the runner gave its rollouts back: none is left for another runner
            raise
    typer.echo(json.dumps(summary))
    if summary["states"].get("succeeded", 0) != summary["rollouts"]:
        raise typer.Exit(1)


class _Summary(TypedDict):
    """What ``agentforge run --tasks`` prints as JSON."""

    rollouts: int
    states: dict[str, int]
    rewarded: int
    mean_reward: float | None
    errors: dict[str, int]


def _wait(store: TraceStore, runner: Runner, ids: list[str], timeout_s: float) -> _Summary:
    """Show progress until every rollout is finished; return counts and the mean reward."""
    from agentforge.errors import RolloutTimeout

    deadline = time.monotonic() + timeout_s
    with progress() as bar:
        task = bar.add_task("rollouts", total=len(ids))
        while True:
            runner.check_workers()
            states = [store.get_rollout(rid).state for rid in ids]
            done = sum(s.finished for s in states)
            bar.update(task, completed=done)
            if done == len(ids):
                break
            if time.monotonic() > deadline:
                raise RolloutTimeout(
                    f"{len(ids) - done} of {len(ids)} rollouts unfinished after {timeout_s:g} s"
                )
            time.sleep(0.5)
    rewards = []
    counts: dict[str, int] = {}
    for rid, state in zip(ids, states, strict=True):
        counts[state.value] = counts.get(state.value, 0) + 1
        final = store.final_reward(rid)
        if final is not None and final.value is not None:
            rewards.append(final.value)
    mean = sum(rewards) / len(rewards) if rewards else None
    errors = _errors(
        store, [rid for rid, state in zip(ids, states, strict=True) if state.value != "succeeded"]
    )
    for error, count in errors.most_common(3):
        console.print(f"[red]{count} rollout(s) failed:[/] {escape(error)}", soft_wrap=True)
    console.print(
        f"{len(ids)} rollouts {counts}; mean reward {mean if mean is None else round(mean, 4)} "
        f"over {len(rewards)} rewarded"
    )
    return {
        "rollouts": len(ids),
        "states": counts,
        "rewarded": len(rewards),
        "mean_reward": mean,
        "errors": dict(errors),
    }


def _errors(store: TraceStore, ids: list[str]) -> Counter[str]:
    """The last attempt's error of each failed rollout, counted (first line, 300 characters)."""
    out: Counter[str] = Counter()
    for rid in ids:
        attempts = store.list_attempts(rid)
        error = attempts[-1].error if attempts and attempts[-1].error else "no attempt finished"
        out[error.strip().splitlines()[0][:300] if error.strip() else "unknown error"] += 1
    return out


def _check_pins(store: TraceStore, pins: dict[str, str]) -> None:
    """Refuse pins to versions the store does not hold (``policy@v0``, the base model, always exists).

    Raises:
        NotFoundError: naming the versions that exist.
    """
    from agentforge.errors import NotFoundError
    from agentforge.types import parse_version_number

    for name, value in pins.items():
        if name != "policy" and not name.startswith("prompt"):
            continue
        number = parse_version_number(value, name=name)
        if name == "policy" and number == 0:
            continue
        have = sorted(r.version for r in store.list_resources(name))
        if number not in have:
            raise NotFoundError(
                f"--pin {name}={value}: the store has no such version (versions: {have or 'none'})"
            )


def terminate_like_ctrl_c() -> None:
    """Make SIGTERM (``kill``, a container stop, a process manager) raise ``KeyboardInterrupt`` in the main
    thread, so it takes Ctrl-C's path: the runner gives its running rollouts back and this run's queued
    ones are cancelled, instead of the process dying with rollouts left ``running`` until their heartbeat
    times out. No-op outside the main thread."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def _cancel_queued(store: TraceStore, ids: list[str]) -> None:
    """Cancel this run's rollouts that are still queued (best effort: the store may be gone)."""
    from agentforge.types import RolloutState

    for rid in ids:
        try:
            if store.get_rollout(rid).state == RolloutState.queued:
                store.update_rollout(rid, state=RolloutState.cancelled)
        except Exception:  # noqa: BLE001 - a claim may have raced us; the rollout then finishes normally
            continue
