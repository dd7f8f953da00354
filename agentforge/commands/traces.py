"""``agentforge traces list`` and ``agentforge traces show``: what the trace store holds, in the terminal.

The terminal counterpart of the dashboard, over any store URL (SQLite, PostgreSQL, a store server or a
gateway's store API). ``list`` filters rollouts (agent, state, training-reward range, policy version, age);
``show`` prints one rollout as its agent saw it — the conversation of its last LLM call, its spans, its
rewards with their named parts, and the token-exact training trajectories the GRPO trainer builds from it
(:func:`agentforge.trainers.samples.build_trajectories`, the trainers' own builder) with a summary of their
trainable masks. Tables go to stderr (sized for 80 columns); ``--json`` writes the data to stdout instead.
"""

from __future__ import annotations

import json
import math
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from agentforge.commands.common import console, reported

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.trainers.samples import Trajectory
    from agentforge.types import Reward, Rollout, Span

__all__ = ["traces_app", "parse_since", "mask_runs"]

traces_app = typer.Typer(
    help="Look at stored rollouts: their conversations, spans, rewards and training trajectories.",
    no_args_is_help=True,
)

StoreUrl = Annotated[
    str | None,
    typer.Option(
        help="Trace store URL: sqlite, postgresql or http(s) (default: $AGENTFORGE_STORE_URL or SQLite in $AGENTFORGE_HOME)."
    ),
]
ApiKey = Annotated[
    str | None,
    typer.Option(
        envvar="AGENTFORGE_API_KEY",
        help="Bearer key of an http(s) store (set $AGENTFORGE_API_KEY rather than the flag).",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Write JSON to stdout instead of tables to stderr.")]

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str, now: float | None = None) -> float:
    """The epoch second a ``--since`` value names.

    Args:
        text: an age (``90s``, ``30m``, ``2h``, ``1d``; a bare number is seconds) or an ISO-8601 time
            (``2026-12-01T09:30``; without an offset it is UTC).
        now: the current time in epoch seconds (default: :func:`time.time`).

    Returns:
        Epoch seconds; rollouts created at or after it match.

    Raises:
        typer.BadParameter: the text is neither an age nor an ISO time.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if match:
        return (time.time() if now is None else now) - float(match[1]) * _UNITS[match[2] or "s"]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither an age (30m, 2h, 1d) nor an ISO time (2026-12-01T09:30)",
            param_hint="--since",
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def mask_runs(env_mask: list[int]) -> str:
    """A trainable mask as runs: ``[0, 0, 1, 1, 1]`` → ``"0×2 1×3"`` (1 = sampled by the policy)."""
    runs: list[list[int]] = []
    for bit in env_mask:
        if runs and runs[-1][0] == bit:
            runs[-1][1] += 1
        else:
            runs.append([bit, 1])
    return " ".join(f"{bit}×{count}" for bit, count in runs)


def _store(url: str | None, api_key: str | None) -> TraceStore:
    from agentforge.commands.common import open_store_url

    return open_store_url(url, must_exist=True, api_key=api_key)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M:%S")


def _versions(spans: list[Span], rollout: Rollout) -> list[str]:
    """The policy versions that served the rollout's LLM calls (its pin when it made none)."""
    seen = [s.llm.version for s in spans if s.llm is not None and s.llm.version]
    if not seen and rollout.resources.get("policy"):
        seen = [rollout.resources["policy"]]
    return list(dict.fromkeys(seen))


def _summary(store: TraceStore, rollout: Rollout) -> dict[str, Any]:
    from agentforge.types import SpanKind

    spans = store.list_spans(rollout_id=rollout.rollout_id, kind=SpanKind.llm)
    reward = store.final_reward(rollout.rollout_id)
    return {
        "rollout_id": rollout.rollout_id,
        "agent": rollout.agent,
        "state": rollout.state.value,
        "reward": None if reward is None else reward.value,
        "versions": _versions(spans, rollout),
        "llm_calls": len(spans),
        "task_id": rollout.task.task_id,
        "created_at": rollout.created_at,
    }


def list_cmd(
    agent: Annotated[str | None, typer.Option(help="Only this agent's rollouts.")] = None,
    state: Annotated[
        str | None, typer.Option(help="queued, running, succeeded, failed, timed_out or cancelled.")
    ] = None,
    min_reward: Annotated[
        float | None, typer.Option(help="Training reward at least this (unscored rollouts drop out).")
    ] = None,
    max_reward: Annotated[float | None, typer.Option(help="Training reward at most this.")] = None,
    version: Annotated[
        str | None, typer.Option(help="Served by this policy version: 3, v3 or policy@v3 (0 = base).")
    ] = None,
    since: Annotated[
        str | None, typer.Option(help="Created within an age (30m, 2h, 1d) or after an ISO time.")
    ] = None,
    limit: Annotated[int, typer.Option(help="Show at most this many (the newest).", min=1)] = 50,
    store_url: StoreUrl = None,
    api_key: ApiKey = None,
    json_out: JsonOut = False,
) -> None:
    """List rollouts, newest last, with their state, training reward, policy versions and LLM calls.

    Example: `agentforge traces list --agent triage --state succeeded --min-reward 1 --since 2h`.
    """
    from agentforge.types import RolloutState, Version

    states = [s.value for s in RolloutState]
    if state is not None and state not in states:
        raise typer.BadParameter(f"choose one of {', '.join(states)}", param_hint="--state")
    wanted = None
    if version is not None:
        with reported():
            wanted = str(Version.parse(version, name="policy"))
    after = None if since is None else parse_since(since)
    with reported():
        store = _store(store_url, api_key)
        rollouts = store.list_rollouts(
            state=None if state is None else RolloutState(state), agent=agent, since=after
        )
        rows = []
        for rollout in reversed(rollouts):  # newest first until the limit, shown oldest first
            row = _summary(store, rollout)
            value = row["reward"]
            if (min_reward is not None or max_reward is not None) and value is None:
                continue
            if (min_reward is not None and value < min_reward) or (
                max_reward is not None and value > max_reward
            ):
                continue
            if wanted is not None and wanted not in row["versions"]:
                continue
            rows.append(row)
            if len(rows) == limit:
                break
        rows.reverse()
    if json_out:
        typer.echo(json.dumps(rows))
        return
    _print_list(rows, total=len(rollouts))


def _print_list(rows: list[dict[str, Any]], total: int) -> None:
    from rich.markup import escape
    from rich.table import Table

    # 19 + 10 + 9 + 6 + 7 + 5 + 11 characters and 12 of padding: 79 columns, ids never cut (copy them)
    table = Table(box=None, pad_edge=False)
    table.add_column("rollout", no_wrap=True, min_width=19)
    table.add_column("agent", no_wrap=True, max_width=10, overflow="ellipsis")
    table.add_column("state", no_wrap=True)
    table.add_column("reward", no_wrap=True, max_width=6)
    table.add_column("version", no_wrap=True, max_width=7, overflow="ellipsis")
    table.add_column("calls", no_wrap=True, justify="right")
    table.add_column("created", no_wrap=True)
    for row in rows:
        reward = "—" if row["reward"] is None else f"{row['reward']:.3g}"
        versions = ",".join(v.removeprefix("policy@") for v in row["versions"]) or "—"
        created = datetime.fromtimestamp(row["created_at"], UTC).strftime("%m-%d %H:%M")
        table.add_row(
            row["rollout_id"],
            escape(row["agent"]),
            row["state"],
            reward,
            escape(versions),
            str(row["llm_calls"]),
            created,
        )
    console.print(table)
    console.print(
        f"{len(rows)} shown of {total} rollouts (times UTC); `agentforge traces show ROLLOUT_ID` for one"
    )


def show_cmd(
    rollout_id: Annotated[str, typer.Argument(help="The rollout's id (see `agentforge traces list`).")],
    max_chars: Annotated[
        int, typer.Option(help="Cut each message to this many characters (0: whole).", min=0)
    ] = 400,
    store_url: StoreUrl = None,
    api_key: ApiKey = None,
    json_out: JsonOut = False,
) -> None:
    """Show one rollout: its conversation, spans, rewards and the training trajectories built from it.

    Example: `agentforge traces show ro-1f2e3d4c5b6a7980`.
    """
    with reported():
        store = _store(store_url, api_key)
        rollout = store.get_rollout(rollout_id)
        data = _details(store, rollout)
    if json_out:
        typer.echo(json.dumps(data, default=str))
        return
    _print_details(data, max_chars)


def _details(store: TraceStore, rollout: Rollout) -> dict[str, Any]:
    spans = store.list_spans(rollout_id=rollout.rollout_id)
    rewards = store.list_rewards(rollout.rollout_id)
    final = store.final_reward(rollout.rollout_id)
    return {
        "rollout": rollout.model_dump(mode="json"),
        "attempts": [a.model_dump(mode="json") for a in store.list_attempts(rollout.rollout_id)],
        "messages": _conversation(spans),
        "spans": [_span_row(s) for s in spans],
        "rewards": [_reward_row(r, final) for r in rewards],
        "training_reward": None if final is None else final.value,
        **_trajectories(store.list_spans(rollout_id=rollout.rollout_id, valid_only=True)),
    }


def _conversation(spans: list[Span]) -> list[dict[str, Any]]:
    """The messages of the last successful LLM call plus its answer (the dashboard's own reading of them)."""
    from agentforge.dashboard.views import conversation

    return conversation(spans)


def _span_row(span: Span) -> dict[str, Any]:
    llm = span.llm
    latency = llm.latency_s if llm is not None and llm.latency_s else None
    if latency is None and span.ended_at is not None:
        latency = span.ended_at - span.started_at
    return {
        "sequence": span.sequence,
        "span_id": span.span_id,
        "kind": span.kind.value,
        "name": span.name or (llm.model if llm else ""),
        "status": span.status,
        "latency_s": latency,
        "version": llm.version if llm else "",
        "prompt_tokens": None if llm is None or llm.prompt_token_ids is None else len(llm.prompt_token_ids),
        "completion_tokens": None
        if llm is None or llm.completion_token_ids is None
        else len(llm.completion_token_ids),
        "finish_reason": llm.finish_reason if llm else None,
        "late": bool(span.attributes.get("late")),
        "error": span.error,
        "flags": list(llm.flags) if llm else [],
    }


def _reward_row(reward: Reward, final: Reward | None) -> dict[str, Any]:
    return {
        "sequence": reward.sequence,
        "name": reward.name,
        "value": reward.value,
        "final": reward.final,
        "source": reward.source,
        "parts": reward.metadata.get("parts", {}),
        "metadata": {k: v for k, v in reward.metadata.items() if k != "parts"},
        "training": final is not None and final.reward_id == reward.reward_id,
    }


def _trajectories(spans: list[Span]) -> dict[str, Any]:
    """The trainer's trajectories of a rollout (its valid spans), or why there are none."""
    from agentforge.trainers.samples import SampleValidationError, build_trajectories

    try:
        built = build_trajectories(spans)
    except SampleValidationError as exc:
        return {"trajectories": [], "trajectory_error": str(exc)}
    return {"trajectories": [_trajectory_row(t, i == len(built) - 1) for i, t in enumerate(built)]}


def _trajectory_row(traj: Trajectory, trains: bool) -> dict[str, Any]:
    return {
        "prompt_tokens": len(traj.prompt_ids),
        "completion_tokens": len(traj.completion_ids),
        "sampled_tokens": traj.sampled_tokens,
        "env_tokens": len(traj.env_mask) - traj.sampled_tokens,
        "mask": mask_runs(traj.env_mask),
        "versions": list(dict.fromkeys(traj.versions)),
        "truncated": traj.truncated,
        "span_ids": traj.span_ids,
        "trains": trains,  # the GRPO sample source trains on a rollout's last trajectory
    }


def _cut(text: Any, max_chars: int) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    return (
        text
        if not max_chars or len(text) <= max_chars
        else text[:max_chars] + f"… (+{len(text) - max_chars})"
    )


def _print_details(data: dict[str, Any], max_chars: int) -> None:
    from rich.markup import escape
    from rich.table import Table

    r = data["rollout"]
    console.print(
        f"[bold]{r['rollout_id']}[/]  agent {escape(r['agent'] or '—')}  state {r['state']}  "
        f"attempts {r['attempts']}  task {escape(r['task']['task_id'])}  created {_clock(r['created_at'])} UTC",
        soft_wrap=True,
    )
    if r["resources"]:
        console.print("pinned: " + escape(", ".join(f"{k}={v}" for k, v in r["resources"].items())))
    if r["error"]:
        console.print(f"[red]error:[/] {escape(r['error'])}", soft_wrap=True)
    console.rule("conversation (the last LLM call as the agent sent it, then its answer)")
    for m in data["messages"]:
        content = _cut(m.get("content") or "", max_chars)
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            content += f"\n→ {fn.get('name', '')}({_cut(fn.get('arguments', ''), max_chars)})"
        console.print(f"[bold cyan]{escape(str(m.get('role', '?')))}[/]: {escape(content)}")
    if not data["messages"]:
        console.print("(no LLM call recorded)")
    spans = Table("seq", "kind", "name", "status", "latency", "version", "tokens", "finish", box=None)
    for s in data["spans"]:
        tokens = "" if s["prompt_tokens"] is None else f"{s['prompt_tokens']}+{s['completion_tokens']}"
        latency = "" if s["latency_s"] is None else f"{s['latency_s']:.2f}s"
        status = s["status"] + (" late" if s["late"] else "")
        spans.add_row(
            str(s["sequence"]),
            s["kind"],
            escape(s["name"][:18]),
            status,
            latency,
            escape(s["version"]),
            tokens,
            s["finish_reason"] or "",
        )
    console.rule(f"spans ({len(data['spans'])})")
    console.print(spans)
    for s in data["spans"]:  # why a call failed, in the engine's or the gateway's words
        if s["error"]:
            flags = f" [{', '.join(s['flags'])}]" if s["flags"] else ""
            console.print(
                f"[red]span {s['sequence']}:[/] {escape(s['error'])}{escape(flags)}", soft_wrap=True
            )
        elif s["flags"]:  # e.g. token_in_continuation, prefix_break:<reason> (why a conversation split)
            console.print(
                f"[yellow]span {s['sequence']} flags:[/] {escape(', '.join(s['flags']))}", soft_wrap=True
            )
    rewards = Table("seq", "name", "value", "final", "source", "parts", box=None)
    for w in data["rewards"]:
        value = "None (invalid)" if w["value"] is None else f"{w['value']:.4g}"
        parts = ", ".join(f"{k}={_number(v)}" for k, v in w["parts"].items())
        rewards.add_row(
            str(w["sequence"]),
            escape(w["name"]) + (" ★" if w["training"] else ""),
            value,
            "✓" if w["final"] else "",
            escape(w["source"]),
            escape(parts),
        )
    console.rule(f"rewards ({len(data['rewards'])}; ★ = the training reward)")
    console.print(rewards if data["rewards"] else "(no reward)")
    _print_trajectories(data)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) and math.isfinite(value) else str(value)


def _print_trajectories(data: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.rule(f"training trajectories ({len(data['trajectories'])}; mask 1 = sampled, 0 = not trained on)")
    if "trajectory_error" in data:
        console.print(f"[yellow]not trainable:[/] {escape(data['trajectory_error'])}", soft_wrap=True)
        return
    table = Table("#", "prompt", "completion", "sampled", "versions", "mask runs", box=None)
    for i, t in enumerate(data["trajectories"]):
        table.add_row(
            f"{i}{' ★' if t['trains'] else ''}",
            str(t["prompt_tokens"]),
            str(t["completion_tokens"]),
            str(t["sampled_tokens"]) + (" trunc" if t["truncated"] else ""),
            escape(",".join(t["versions"])),
            _cut(t["mask"], 40),
        )
    console.print(table if data["trajectories"] else "(no LLM call: nothing to train on)")
    if data["trajectories"]:
        console.print("★ = the trajectory GRPO trains on (a rollout's last); the others count as extra")


traces_app.command("list")(list_cmd)
traces_app.command("show")(show_cmd)
