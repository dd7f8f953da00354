"""One conversation, one trajectory: 4-turn tool conversations through the real gateway, with and without
token-in continuations (:mod:`agentforge.gateway.prefix`), side by side.

Each rollout is one conversation with the default model (SmolLM2-135M) at temperature 1: a worked example,
"What is the weather in Paris?" → the model's tool call (``tool_choice="required"`` on vLLM, where guided
decoding forces it; ``"auto"`` on the embedded backend, which cannot force calls) → the tool's answer → the
model → a new user question → ... four LLM calls in all, the third one streamed. For every rollout the script
builds the trainer's trajectories from the stored spans (:func:`agentforge.trainers.samples.build_trajectories`)
and checks the trained (last) one:

* ``ids_match``: every call's prompt ids (as the engine saw them) are a prefix of the merged sample, and the
  sampled ids sit in it, each at its place with its logprobs;
* ``tool_masked``: the tokens of each tool answer and user turn lie in ``env_mask == 0`` stretches;
* the step-1 importance-sampling ratio of the merged sample on the unchanged model, as TRL computes it at
  step 1 (``old_per_token_logps`` = this model's log-probabilities at temperature 1, ``sampling`` = the
  engine's): per sequence ``exp(Σ mask·Δ)`` (TRL's default ``sequence_mask`` mode) and per token ``exp(Δ)``.

Printed per mode (``token_in`` off = the ordinary path, on = continuations): the share of one-trajectory
rollouts, ``extra_trajectories`` (what the trainer's batch report counts), and the mean ratios.

    python benchmarks/one_trajectory.py --engine embedded --rollouts 4
    python benchmarks/one_trajectory.py --engine vllm --rollouts 8 --json
    python benchmarks/one_trajectory.py --engine vllm --dtype bfloat16   # the trainer side in bf16, as on CPU
    python benchmarks/one_trajectory.py --engine vllm --dialect anthropic --modes on   # Messages API conversations
    python benchmarks/one_trajectory.py --engine vllm --dialect responses --modes on   # Responses API conversations
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from typing import Any

import httpx

from agentforge.config import default_model_dir
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.open import open_store
from agentforge.testing import memory_store
from agentforge.trainers.samples import Trajectory, build_trajectories
from agentforge.types import Rollout, Span

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
EXAMPLE = [
    {"role": "user", "content": "What is the weather in London?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_london",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "London"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_london", "content": "rainy, 12 C"},
    {"role": "assistant", "content": "It is rainy and 12 C in London."},
]
FOLLOW_UPS = ("And in Tokyo?", "What about Rome?", "And Oslo?")
TOOL_ANSWER = "sunny, 21 C"


def _stream_message(text: str) -> dict[str, Any]:
    """The assistant message of an SSE chat stream (content and tool calls accumulated)."""
    content, calls = [], {}
    for line in text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                acc = calls.setdefault(
                    call.get("index", 0), {"id": None, "type": "function", "name": "", "args": ""}
                )
                acc["id"] = call.get("id") or acc["id"]
                acc["name"] += (call.get("function") or {}).get("name") or ""
                acc["args"] += (call.get("function") or {}).get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}
            for _, c in sorted(calls.items())
        ]
    return message


def conversation(
    url: str | list[str], model: str, *, force_first: bool, turns: int = 4, max_tokens: int = 48
) -> list[str]:
    """Run one conversation of ``turns`` LLM calls against ``url`` (a rollout's ``.../v1``; a list: one per
    gateway replica, call ``i`` sent to ``url[i % len(url)]``).

    Returns:
        The texts the conversation added between calls (tool answers, user turns), in order.
    """
    messages: list[dict[str, Any]] = [*EXAMPLE, {"role": "user", "content": "What is the weather in Paris?"}]
    added: list[str] = []
    with httpx.Client(timeout=600) as client:
        for turn in range(turns):
            body = {
                "model": model,
                "messages": messages,
                "tools": [WEATHER_TOOL],
                "tool_choice": "required" if force_first and turn == 0 else "auto",
                "temperature": 1.0,
                "max_tokens": max_tokens,
                "stream": turn == 2,
            }
            base = url if isinstance(url, str) else url[turn % len(url)]
            response = client.post(f"{base}/chat/completions", json=body)
            response.raise_for_status()
            if body["stream"]:
                message = _stream_message(response.text)
            else:
                raw = response.json()["choices"][0]["message"]
                message = {"role": "assistant", "content": raw.get("content")}
                if raw.get("tool_calls"):
                    message["tool_calls"] = raw["tool_calls"]
            messages.append(message)
            if message.get("tool_calls"):
                for call in message["tool_calls"]:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": TOOL_ANSWER})
                    added.append(TOOL_ANSWER)
            else:
                messages.append({"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]})
                added.append(messages[-1]["content"])
    return added[: turns - 1]


def ids_match(traj: Trajectory, spans: list[Span]) -> bool:
    """Every merged call's engine prompt ids are a prefix of the sample and its sampled ids follow them."""
    ids = traj.ids
    merged = [s for s in spans if s.span_id in traj.span_ids]
    for span in merged:
        prompt, completion = span.llm.prompt_token_ids, span.llm.completion_token_ids  # type: ignore[union-attr]
        start = len(prompt) - len(traj.prompt_ids)
        if ids[: len(prompt)] != prompt or ids[len(prompt) : len(prompt) + len(completion)] != completion:
            return False
        if traj.env_mask[start : start + len(completion)] != [1] * len(completion):
            return False
        if traj.logprobs[start : start + len(completion)] != span.llm.logprobs:  # type: ignore[union-attr]
            return False
    return sum(traj.env_mask) == sum(len(s.llm.completion_token_ids) for s in merged)  # type: ignore[union-attr,arg-type]


def tool_masked(traj: Trajectory, added: list[str], tokenizer: Any) -> bool:
    """Each added text (tool answer, user turn) appears in the decoded ``env_mask == 0`` stretches only."""
    stretches, current = [], []
    for token, mask in zip(traj.completion_ids, traj.env_mask, strict=True):
        if mask == 0:
            current.append(token)
        elif current:
            stretches.append(tokenizer.decode(current))
            current = []
    if current:
        stretches.append(tokenizer.decode(current))
    text = "\n".join(stretches)
    return all(a in text for a in added)


def step1_ratios(traj: Trajectory, model: Any) -> tuple[float, float]:
    """``(sequence ratio, mean token ratio)`` of the sample on ``model`` against the engine's logprobs."""
    import torch

    ids = torch.tensor([traj.ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(traj.prompt_ids) - 1 : -1].float()
    logps = torch.log_softmax(logits, -1).gather(1, torch.tensor(traj.completion_ids)[:, None])[:, 0]
    mask = torch.tensor(traj.env_mask, dtype=torch.bool)
    delta = (logps - torch.tensor(traj.logprobs))[mask]
    return math.exp(float(delta.sum())), float(delta.exp().mean())


def _anthropic_history() -> list[dict[str, Any]]:
    """:data:`EXAMPLE` and the first question in the Messages API's shape (tool_use / tool_result blocks)."""
    return [
        {"role": "user", "content": "What is the weather in London?"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_london", "name": "get_weather", "input": {"city": "London"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_london", "content": "rainy, 12 C"}],
        },
        {"role": "assistant", "content": "It is rainy and 12 C in London."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]


def anthropic_conversation(
    root: str, model: str, *, force_first: bool, turns: int = 4, max_tokens: int = 48
) -> list[str]:
    """:func:`conversation` spoken in the Anthropic Messages API with the official ``anthropic`` SDK, pointed
    at ``root`` (a rollout's ``<gateway>/rollouts/<id>``): ``tool_choice`` ``any`` first when ``force_first``,
    then ``auto``; the third call streamed (the SDK's accumulated message goes into the history)."""
    import anthropic

    client = anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=600)
    tool = {
        "name": "get_weather",
        "description": WEATHER_TOOL["function"]["description"],
        "input_schema": WEATHER_TOOL["function"]["parameters"],
    }
    messages = _anthropic_history()
    added: list[str] = []
    for turn in range(turns):
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "tools": [tool],
            "max_tokens": max_tokens,
            "tool_choice": {"type": "any" if force_first and turn == 0 else "auto"},
            "extra_body": {"temperature": 1.0},
        }
        if turn == 2:
            with client.messages.stream(**kwargs) as stream:
                answer = stream.get_final_message()
        else:
            answer = client.messages.create(**kwargs)
        blocks = [b.model_dump(exclude_none=True) for b in answer.content]
        messages.append({"role": "assistant", "content": blocks})
        uses = [b for b in blocks if b["type"] == "tool_use"]
        if uses:
            results = [{"type": "tool_result", "tool_use_id": b["id"], "content": TOOL_ANSWER} for b in uses]
            messages.append({"role": "user", "content": results})
            added.extend(TOOL_ANSWER for _ in uses)
        else:
            messages.append({"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]})
            added.append(FOLLOW_UPS[turn % len(FOLLOW_UPS)])
    return added[: turns - 1]


def responses_conversation(
    url: str, model: str, *, force_first: bool, turns: int = 4, max_tokens: int = 48
) -> list[str]:
    """:func:`conversation` spoken in the OpenAI Responses API with the official ``openai`` SDK (the whole history
    sent as input items each call, as the OpenAI Agents SDK does), pointed at ``url`` (a rollout's ``.../v1``):
    ``tool_choice`` ``required`` first when ``force_first``, then ``auto``; the third call streamed (the SDK's
    accumulated response goes into the history)."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "What is the weather in London?"},
        {
            "type": "function_call",
            "call_id": "call_london",
            "name": "get_weather",
            "arguments": '{"city": "London"}',
        },
        {"type": "function_call_output", "call_id": "call_london", "output": "rainy, 12 C"},
        {"role": "assistant", "content": "It is rainy and 12 C in London."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    added: list[str] = []
    for turn in range(turns):
        kwargs: dict[str, Any] = {
            "model": model,
            "input": items,
            "tools": [tool],
            "max_output_tokens": max_tokens,
            "temperature": 1.0,
            "tool_choice": "required" if force_first and turn == 0 else "auto",
        }
        if (
            turn == 2
        ):  # the finished response of either kind (a turn cut by max_output_tokens ends "incomplete",
            with client.responses.stream(
                **kwargs
            ) as stream:  # for which the SDK's get_final_response raises)
                ends = ("response.completed", "response.incomplete")
                answer = next(e.response for e in stream if e.type in ends)
        else:
            answer = client.responses.create(**kwargs)
        calls = []
        for out in answer.output:
            if out.type == "message":
                items.append(
                    {
                        "role": "assistant",
                        "content": "".join(c.text for c in out.content if c.type == "output_text"),
                    }
                )
            elif out.type == "function_call":
                calls.append(out.call_id)
                items.append(
                    {
                        "type": "function_call",
                        "call_id": out.call_id,
                        "name": out.name,
                        "arguments": out.arguments,
                    }
                )
        if calls:
            items.extend({"type": "function_call_output", "call_id": c, "output": TOOL_ANSWER} for c in calls)
            added.extend(TOOL_ANSWER for _ in calls)
        else:
            items.append({"role": "user", "content": FOLLOW_UPS[turn % len(FOLLOW_UPS)]})
            added.append(FOLLOW_UPS[turn % len(FOLLOW_UPS)])
    return added[: turns - 1]


def run_mode(
    engine: Any,
    token_in: bool,
    rollouts: int,
    force_first: bool,
    model: Any,
    tokenizer: Any,
    dialect: str = "chat",
    replicas: int = 1,
    store_url: str | None = None,
) -> dict:
    """``rollouts`` conversations through a fresh gateway (spoken as chat calls, or as the Anthropic Messages
    API with ``dialect="anthropic"``, or the Responses API with ``dialect="responses"``); the per-mode summary.
    ``replicas`` > 1 (chat only): that many gateways, each on its own connection to the store ``store_url``
    (default: an in-memory one shared), and each conversation's calls go to them in turn."""
    if replicas > 1 and dialect != "chat":
        raise ValueError("replicas > 1 runs chat conversations only")
    router = ModelRouter()
    upstream = Upstream(
        base_url=engine.base_url, model=engine.base_model_name, api_key=engine.api_key, token_in=token_in
    )
    router.register("policy@v0", upstream)
    router.set_alias("policy", "policy@v0")
    store = open_store(store_url) if store_url else memory_store()
    others = [open_store(store_url) if store_url else store for _ in range(replicas - 1)]
    more = [GatewayServer(s, router).start() for s in others]
    rows = []
    t0 = time.monotonic()
    try:
        with GatewayServer(store, router) as gateway:
            for _ in range(rollouts):
                rollout_id = store.enqueue_rollout(Rollout()).rollout_id
                if dialect == "responses":
                    added = responses_conversation(
                        gateway.rollout_base_url(rollout_id), "policy", force_first=force_first
                    )
                elif dialect == "anthropic":
                    root = f"{gateway.url}/rollouts/{rollout_id}"
                    added = anthropic_conversation(root, "policy", force_first=force_first)
                else:
                    urls = [g.rollout_base_url(rollout_id) for g in (gateway, *more)]
                    added = conversation(urls, "policy", force_first=force_first)
                spans = [s for s in store.list_spans(rollout_id=rollout_id) if s.llm is not None]
                trajectories = build_trajectories(spans)
                last = trajectories[-1]
                seq, tok = step1_ratios(last, model)
                rows.append(
                    {
                        "trajectories": len(trajectories),
                        "calls": len(spans),
                        "continued": sum("token_in_continuation" in s.llm.flags for s in spans),  # type: ignore[union-attr]
                        "breaks": [f for s in spans for f in s.llm.flags if f.startswith("prefix_break:")],  # type: ignore[union-attr]
                        "guided": [f for s in spans for f in s.llm.flags if f.startswith("guided_")],  # type: ignore[union-attr]
                        "ids_match": ids_match(last, spans),
                        "tool_masked": tool_masked(last, added, tokenizer)
                        if len(trajectories) == 1
                        else None,
                        "sequence_ratio": seq,
                        "token_ratio": tok,
                    }
                )
    finally:
        for g in more:
            g.stop()
    for s in {id(s): s for s in [store, *others]}.values():
        s.close()
    return {
        "dialect": dialect,
        "replicas": replicas,
        "token_in": token_in,
        "rollouts": rollouts,
        "one_trajectory_share": sum(r["trajectories"] == 1 for r in rows) / rollouts,
        "extra_trajectories": sum(r["trajectories"] - 1 for r in rows),
        "ids_match_share": sum(r["ids_match"] for r in rows) / rollouts,
        "tool_masked_share": sum(bool(r["tool_masked"]) for r in rows) / rollouts,
        "sequence_ratio_mean": statistics.fmean(r["sequence_ratio"] for r in rows),
        "token_ratio_mean": statistics.fmean(r["token_ratio"] for r in rows),
        "seconds": time.monotonic() - t0,
        "rows": rows,
    }


def _engine(kind: str, vllm_url: str | None, vllm_key: str | None) -> Any:
    if kind == "embedded":
        from agentforge.serving.embedded import EmbeddedServer

        return EmbeddedServer()
    from agentforge.model import prepare_default_model
    from agentforge.serving.vllm import VLLMServer

    return VLLMServer.connect(vllm_url, api_key=vllm_key) if vllm_url else VLLMServer(prepare_default_model())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", choices=("embedded", "vllm"), default="embedded")
    parser.add_argument("--rollouts", type=int, default=4, help="conversations per mode")
    parser.add_argument("--modes", default="off,on", help="token_in modes to run, in order (off,on)")
    parser.add_argument("--vllm-url", default=None, help="reuse a running vLLM server (its .../v1 URL)")
    parser.add_argument("--vllm-key", default=None, help="that server's inference key")
    parser.add_argument(
        "--dtype", default="float32", help="the trainer-side model's dtype (float32, bfloat16)"
    )
    parser.add_argument(
        "--dialect",
        choices=("chat", "anthropic", "responses"),
        default="chat",
        help="the API the conversations speak",
    )
    parser.add_argument(
        "--replicas", type=int, default=1, help="gateway replicas a conversation's calls go to in turn (chat)"
    )
    parser.add_argument("--store-url", default=None, help="the replicas' shared store (default: in memory)")
    parser.add_argument("--json", action="store_true", help="print the summaries as one JSON line last")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_dir())
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=dtype).eval()
    engine = _engine(args.engine, args.vllm_url, args.vllm_key)
    started = args.vllm_url is None
    if started:
        engine.start()
    try:
        summaries = [
            run_mode(
                engine,
                mode == "on",
                args.rollouts,
                args.engine == "vllm",
                model,
                tokenizer,
                args.dialect,
                args.replicas,
                args.store_url,
            )
            for mode in args.modes.split(",")
        ]
    finally:
        if started:
            engine.stop()
    for s in summaries:
        print(
            f"{args.engine} {s['dialect']} replicas={s['replicas']} token_in={'on ' if s['token_in'] else 'off'}: "
            "one trajectory in "
            f"{s['one_trajectory_share']:.0%} of {s['rollouts']} rollouts, extra_trajectories={s['extra_trajectories']}, "
            f"ids match {s['ids_match_share']:.0%}, tool outputs masked {s['tool_masked_share']:.0%}, "
            f"step-1 IS ratio: sequence {s['sequence_ratio_mean']:.3f}, token {s['token_ratio_mean']:.3f} "
            f"({s['seconds']:.0f} s)"
        )
    if args.json:
        print(json.dumps(summaries))


if __name__ == "__main__":
    main()
