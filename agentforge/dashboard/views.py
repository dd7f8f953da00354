"""What each dashboard page shows, read through the :class:`~agentforge.ports.TraceStore` port only.

* :func:`runs_view` — every training run from its ``trainer.metrics`` spans (the GRPO trainer writes one per
  logged step, an orphan span with ``attributes.run_id``): reward, held-out score, seconds per step, version;
* :func:`version_timeline` — adapter versions published and every promotion-gate decision
  (:func:`agentforge.gate.list_decisions`: passed, refused, promoted, rolled back, kept), oldest first;
* :func:`rollout_view` — one rollout: its conversation, its spans on a timeline, its rewards and the token view
  of the trainer's own samples (:func:`agentforge.trainers.samples.build_trajectories`);
* :func:`versions_view` — adapters and prompts with their lineage and the live one, and :func:`prompt_diff`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agentforge.gate import DECISION_PREFIX, list_decisions
from agentforge.prompts import CANARY_PREFIX
from agentforge.types import ResourceVersion, SpanKind

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.types import Span

__all__ = [
    "METRICS_SPAN",
    "runs_view",
    "version_timeline",
    "rollout_view",
    "versions_view",
    "prompt_diff",
    "conversation",
]

#: The name of the span the GRPO trainer writes per logged step (``LightningTrainer.record_metrics``).
METRICS_SPAN = "trainer.metrics"
#: Log keys read from a metrics span: the batch reward (TRL), the held-out score, seconds per step.
_REWARD, _HELD_OUT, _STEP_S = "reward", "eval/held_out", "train/step_s"


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def runs_view(store: TraceStore) -> list[dict[str, Any]]:
    """Every training run that logged a step, newest first.

    Args:
        store: the trace store.

    Returns:
        One dict per run: ``run_id``, ``steps`` (each ``step``, ``reward``, ``held_out``, ``step_s`` seconds,
        ``version``, ``time`` epoch seconds; ``None`` where a step did not log the number), ``started`` and
        ``updated`` (epoch seconds) and ``versions`` (the versions it served, in order).
    """
    runs: dict[str, dict[str, Any]] = {}
    for span in store.list_spans(orphans=True, kind=SpanKind.custom):
        attrs = span.attributes
        if span.name != METRICS_SPAN or not isinstance(attrs.get("run_id"), str):
            continue
        run = runs.setdefault(attrs["run_id"], {"run_id": attrs["run_id"], "steps": [], "versions": []})
        run["steps"].append(
            {
                "step": attrs.get("step"),
                "reward": _finite(attrs.get(_REWARD)),
                "held_out": _finite(attrs.get(_HELD_OUT)),
                "step_s": _finite(attrs.get(_STEP_S)),
                "version": attrs.get("version") or "",
                "time": span.started_at,
            }
        )
        if attrs.get("version") and attrs["version"] not in run["versions"]:
            run["versions"].append(attrs["version"])
    for run in runs.values():
        run["started"] = min(s["time"] for s in run["steps"])
        run["updated"] = max(s["time"] for s in run["steps"])
    return sorted(runs.values(), key=lambda r: r["updated"], reverse=True)


def version_timeline(store: TraceStore) -> list[dict[str, Any]]:
    """Adapter publications and promotion decisions in time order (the Runs page's version timeline).

    Returns:
        Dicts with ``time`` (epoch seconds), ``event`` (``published``, ``rolled back`` for a rollback
        publication, or a decision's outcome: ``passed``, ``refused``, ``promoted``, ``rolled_back``, …),
        ``name``, ``version`` (``policy@v3``), ``stage`` and ``detail``.
    """
    events: list[dict[str, Any]] = []
    for r in store.list_resources():
        if r.kind != "adapter":
            continue
        event = "rolled back" if "rollback_of" in r.payload else "published"
        detail = f"rollback to v{r.payload['rollback_of']}" if event == "rolled back" else ""
        if not detail:
            detail = "base model" if r.payload.get("base") else f"step {r.payload.get('step', '?')}"
        events.append(
            {
                "time": r.created_at,
                "event": event,
                "name": r.name,
                "version": r.ref,
                "stage": "",
                "detail": detail,
            }
        )
    for d in list_decisions(store):
        events.append(
            {
                "time": d.created_at,
                "event": d.outcome,
                "name": d.name,
                "version": d.candidate,
                "stage": d.stage,
                "detail": f"against {d.live}: {d.reason}",
            }
        )
    return sorted(events, key=lambda e: e["time"])


def conversation(spans: list[Span]) -> list[dict[str, Any]]:
    """The messages of the last successful LLM call, then its answer: the conversation as the agent saw it.

    Args:
        spans: the rollout's spans.

    Returns:
        Chat messages (``role``, ``content``, optional ``tool_calls`` as ``name``/``arguments``).
    """
    calls = [s.llm for s in spans if s.kind == SpanKind.llm and s.llm is not None and s.status == "ok"]
    if not calls:
        return []
    llm = calls[-1]
    messages = [dict(m) for m in llm.request.get("messages", []) if isinstance(m, dict)]
    if not messages and "prompt" in llm.request:
        messages = [{"role": "prompt", "content": llm.request["prompt"]}]
    answer: dict[str, Any] = {"role": "assistant", "content": llm.response_text}
    if llm.tool_calls:
        answer["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in llm.tool_calls]
    return [*messages, answer]


def _span_rows(spans: list[Span]) -> list[dict[str, Any]]:
    """Spans with their start and end in seconds after the rollout's first span (for the timeline)."""
    if not spans:
        return []
    t0 = min(s.started_at for s in spans)
    rows = []
    for s in spans:
        llm = s.llm
        latency = llm.latency_s if llm is not None and llm.latency_s else None
        if latency is None and s.ended_at is not None:
            latency = s.ended_at - s.started_at
        start = s.started_at - t0
        rows.append(
            {
                "sequence": s.sequence,
                "kind": s.kind.value,
                "name": s.name or (llm.model if llm else ""),
                "status": s.status,
                "error": s.error,
                "version": llm.version if llm else "",
                "start_s": start,
                "end_s": start + (latency or 0.0),
                "latency_s": latency,
                "tokens": None
                if llm is None or llm.completion_token_ids is None
                else f"{len(llm.prompt_token_ids or [])}+{len(llm.completion_token_ids)}",
                "finish_reason": llm.finish_reason if llm else None,
                "late": bool(s.attributes.get("late")),
            }
        )
    return rows


def _tokens(
    ids: list[int], mask: list[int] | None, logprobs: list[float] | None, decode: Callable[[int], str]
) -> list[dict[str, Any]]:
    out = []
    for i, token in enumerate(ids):
        trained = bool(mask[i]) if mask is not None else False
        lp = logprobs[i] if logprobs is not None and trained else None
        out.append(
            {
                "id": token,
                "text": decode(token),
                "trained": trained,
                "logprob": lp,
                "p": None if lp is None else math.exp(lp),
            }
        )
    return out


def _trajectories(spans: list[Span], decode: Callable[[int], str]) -> dict[str, Any]:
    from agentforge.trainers.samples import SampleValidationError, build_trajectories

    try:
        built = build_trajectories(spans)
    except SampleValidationError as exc:
        return {"trajectories": [], "trajectory_error": str(exc)}
    rows = []
    for i, t in enumerate(built):
        rows.append(
            {
                "trains": i == len(built) - 1,  # the GRPO sample source trains on a rollout's last trajectory
                "prompt": _tokens(t.prompt_ids, None, None, decode),
                "completion": _tokens(t.completion_ids, t.env_mask, t.logprobs, decode),
                "sampled_tokens": t.sampled_tokens,
                "env_tokens": len(t.env_mask) - t.sampled_tokens,
                "versions": list(dict.fromkeys(t.versions)),
                "truncated": t.truncated,
            }
        )
    return {"trajectories": rows}


def rollout_view(store: TraceStore, rollout_id: str, decode: Callable[[int], str]) -> dict[str, Any]:
    """Everything the one-rollout page shows.

    Args:
        store: the trace store.
        rollout_id: the rollout.
        decode: token id → its text (the served model's tokenizer; ``str`` of the id without one).

    Returns:
        ``rollout``, ``attempts``, ``messages`` (:func:`conversation`), ``spans`` (with ``start_s``/``end_s``
        seconds after the first span, ``latency_s``, ``version``), ``rewards``, ``training_reward`` and
        ``trajectories`` (each with ``prompt`` and ``completion`` tokens: ``text``, ``trained`` (mask 1),
        ``logprob``, ``p``), or ``trajectory_error``.

    Raises:
        NotFoundError: no such rollout.
    """
    rollout = store.get_rollout(rollout_id)
    spans = store.list_spans(rollout_id=rollout_id)
    final = store.final_reward(rollout_id)
    rewards = [
        {
            "name": r.name,
            "value": r.value,
            "final": r.final,
            "source": r.source,
            "sequence": r.sequence,
            "parts": r.metadata.get("parts", {}),
            "training": final is not None and final.reward_id == r.reward_id,
        }
        for r in store.list_rewards(rollout_id)
    ]
    return {
        "rollout": rollout,
        "attempts": store.list_attempts(rollout_id),
        "messages": conversation(spans),
        "spans": _span_rows(spans),
        "rewards": rewards,
        "training_reward": None if final is None else final.value,
        **_trajectories(store.list_spans(rollout_id=rollout_id, valid_only=True), decode),
    }


def _produced_by(store: TraceStore) -> dict[str, dict[str, Any]]:
    """Per adapter version (``policy@v3``): the run that published it. An adapter record names its step, not
    its run, so the run is the one whose logged step of that number lies closest in time to the record."""
    steps = [(run["run_id"], s["step"], s["time"]) for run in runs_view(store) for s in run["steps"]]
    out: dict[str, dict[str, Any]] = {}
    for r in store.list_resources():
        step = r.payload.get("step")
        near = [
            (abs(t - r.created_at), run_id) for run_id, n, t in steps if r.kind == "adapter" and n == step
        ]
        if near:
            out[r.ref] = {"run_id": min(near)[1], "step": step}
    return out


def versions_view(store: TraceStore) -> list[dict[str, Any]]:
    """Adapters and prompts, one group per resource name, with lineage and the live version marked.

    Returns:
        Dicts ``name``, ``kind``, ``live`` (the active version's ``ref`` or ``None``) and ``versions`` (each
        ``ref``, ``version``, ``active``, ``created_at``, ``detail``, ``lineage``: the step and run that
        produced an adapter, ``rollback_of``, a prompt's source and run, and ``decisions``: its gate record).
    """
    internal = (DECISION_PREFIX, CANARY_PREFIX)
    produced = _produced_by(store)
    decisions: dict[str, list[str]] = {}
    for d in list_decisions(store):
        decisions.setdefault(d.candidate, []).append(f"{d.stage} {d.outcome}")
    groups: dict[str, dict[str, Any]] = {}
    for r in store.list_resources():
        if r.name.startswith(internal) or r.kind not in ("adapter", "prompt"):
            continue
        group = groups.setdefault(r.name, {"name": r.name, "kind": r.kind, "live": None, "versions": []})
        if r.active:
            group["live"] = r.ref
        group["versions"].append(
            {
                "ref": r.ref,
                "version": r.version,
                "active": r.active,
                "created_at": r.created_at,
                "detail": _detail(r),
                "lineage": _lineage(r, produced),
                "decisions": decisions.get(r.ref, []),
            }
        )
    return list(groups.values())


def _detail(r: ResourceVersion) -> str:
    if r.kind == "prompt":
        return str(r.payload.get("template", ""))
    if r.payload.get("base"):
        return "base model"
    return f"{r.payload.get('path', '')} (rank {r.payload.get('rank', '?')}, base {r.payload.get('base_model', '?')})"


def _lineage(r: ResourceVersion, produced: dict[str, dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        k: r.payload[k] for k in ("step", "rollback_of", "source", "run_id") if k in r.payload
    }
    if r.kind == "adapter" and r.ref in produced and "run_id" not in out:
        out["run_id"] = produced[r.ref]["run_id"]
    return out


def prompt_diff(store: TraceStore, name: str, old: int, new: int) -> list[str]:
    """A unified diff of two versions of a prompt's template (:func:`difflib.unified_diff`).

    Args:
        store: the trace store.
        name: the prompt's resource name (``prompt:triage``).
        old: the earlier version number; new: the later one.

    Returns:
        The diff lines (empty when the templates are equal).

    Raises:
        NotFoundError: a version does not exist.
    """
    a = str(store.get_resource(name, old).payload.get("template", ""))
    b = str(store.get_resource(name, new).payload.get("template", ""))
    return list(
        difflib.unified_diff(a.splitlines(), b.splitlines(), f"{name} v{old}", f"{name} v{new}", lineterm="")
    )
