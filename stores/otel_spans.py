"""Stored records as OpenTelemetry spans that follow the GenAI semantic conventions (``gen_ai.*``).

One trace per rollout; its ids are derived from agentforge's own ids (BLAKE2b of the rollout, attempt, span and
reward ids), so every process that exports a part of a rollout (the gateway its LLM calls, a runner its tool spans
and the finished attempt) lands in the same trace, under the right parent, whatever the order of arrival::

    rollout {agent}                  the rollout, enqueued to final state (root; agentforge.reward: training reward)
    └─ invoke_agent {agent}          one per attempt (gen_ai.operation.name invoke_agent)
       ├─ chat {model}               one per LLM call (CLIENT; text_completion for /v1/completions)
       │  └─ reward {name}           a reward, under the span it follows (gen_ai.evaluation.*)
       ├─ execute_tool {tool}        one per tool span
       └─ {name}                     a custom span (emit_span)

An orphan span (no rollout) is a trace of its own. Attribute names are the semantic conventions' constants
(``opentelemetry-semantic-conventions``, GenAI spans: https://opentelemetry.io/docs/specs/semconv/gen-ai/);
agentforge's own fields go under ``agentforge.*``. Message text, tool arguments and results are content: they are
exported only with ``capture_content`` (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``, the GenAI
instrumentations' switch); tool-call names and ids, token counts and finish reasons always are.

Spans are made by an SDK ``TracerProvider`` of their own (never the global one) whose id generator hands out the
derived ids, so the SDK builds every span and the caller exports the finished ones itself.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import re
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from agentforge.types import Attempt, AttemptState, Reward, Rollout, RolloutState, Span
from agentforge.types import SpanKind as RecordKind

__all__ = ["SpanBuilder", "trace_id_of", "span_id_of"]

#: ``gen_ai.provider.name`` of the calls the gateway served (a custom value, as the conventions allow).
PROVIDER = "agentforge"
_OPS = gen_ai.GenAiOperationNameValues
_SAMPLING = {
    "temperature": gen_ai.GEN_AI_REQUEST_TEMPERATURE,
    "top_p": gen_ai.GEN_AI_REQUEST_TOP_P,
    "top_k": gen_ai.GEN_AI_REQUEST_TOP_K,
    "max_tokens": gen_ai.GEN_AI_REQUEST_MAX_TOKENS,
    "max_completion_tokens": gen_ai.GEN_AI_REQUEST_MAX_TOKENS,
    "seed": gen_ai.GEN_AI_REQUEST_SEED,
    "frequency_penalty": gen_ai.GEN_AI_REQUEST_FREQUENCY_PENALTY,
    "presence_penalty": gen_ai.GEN_AI_REQUEST_PRESENCE_PENALTY,
}


def _digest(kind: str, key: str, size: int) -> int:
    return int.from_bytes(hashlib.blake2b(f"{kind}:{key}".encode(), digest_size=size).digest(), "big") or 1


def trace_id_of(rollout_id: str) -> int:
    """The 128-bit trace id of a rollout (the same in every process)."""
    return _digest("trace", rollout_id, 16)


def span_id_of(kind: str, key: str) -> int:
    """The 64-bit span id of a record: ``kind`` ``"rollout"``, ``"attempt"``, ``"span"`` or ``"reward"``."""
    return _digest(kind, key, 8)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class _GivenIds(IdGenerator):
    """Hands out the ids set just before each ``start_span`` (one builder thread uses a provider)."""

    span_id = trace_id = 0

    def generate_span_id(self) -> int:
        return self.span_id

    def generate_trace_id(self) -> int:
        return self.trace_id


class _Collect(SpanProcessor):
    """Keeps every ended span until the builder hands them out."""

    def __init__(self) -> None:
        self.ended: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


class SpanBuilder:
    """Turns stored records into finished OTel spans (see the module docstring). Not thread-safe: one thread.

    Args:
        resource: the OTel resource of every span (service name and the like).
        capture_content: also export message text, tool arguments and results.
    """

    def __init__(self, resource: Resource, capture_content: bool = False) -> None:
        self._ids, self._out = _GivenIds(), _Collect()
        provider = TracerProvider(resource=resource, id_generator=self._ids, sampler=ALWAYS_ON)
        provider.add_span_processor(self._out)
        self._tracer = provider.get_tracer("agentforge", _version())
        self.capture_content = capture_content

    def take(self) -> list[ReadableSpan]:
        """The spans finished since the last call."""
        ended, self._out.ended = self._out.ended, []
        return ended

    # --- one method per record -----------------------------------------------------------------------
    def span(self, span: Span) -> None:
        """An LLM, tool or custom span, under its attempt (or its rollout, or alone for an orphan)."""
        rid = span.rollout_id
        trace = trace_id_of(rid or f"orphan:{span.span_id}")
        parent = None if rid is None else _parent_of(rid, span.attempt_id)
        # few attributes: each costs the exporter's encoder a few microseconds on every call
        attrs: dict[str, Any] = {"agentforge.span.id": span.span_id}
        if rid is not None:
            attrs[gen_ai.GEN_AI_CONVERSATION_ID] = rid
        if span.attempt_id:
            attrs["agentforge.attempt.id"] = span.attempt_id
        if span.attributes.get("late"):
            attrs.update(
                {"agentforge.late": True, "agentforge.late_reason": str(span.attributes.get("late_reason"))}
            )
        end = span.ended_at
        if span.kind is RecordKind.llm and span.llm is not None:
            name, kind = self._llm(span, attrs)
            end = end if end is not None else span.started_at + span.llm.latency_s
        elif span.kind is RecordKind.tool:
            name, kind = self._tool(span, attrs), SpanKind.INTERNAL
        else:
            name, kind = span.name or "span", SpanKind.INTERNAL
            attrs.update(self._custom_attributes(span.attributes))
        error = span.error if span.status == "error" else None
        self._emit(
            name, span_id_of("span", span.span_id), parent, trace, kind, span.started_at, end, attrs, error
        )

    def reward(self, reward: Reward) -> None:
        """A reward, as a point in time under the span it follows (else its attempt, else its rollout)."""
        attrs: dict[str, Any] = {
            gen_ai.GEN_AI_EVALUATION_NAME: reward.name,
            "agentforge.reward.id": reward.reward_id,
            "agentforge.reward.final": reward.final,
            "agentforge.reward.source": reward.source,
            "agentforge.reward.valid": reward.valid,
            "agentforge.rollout.id": reward.rollout_id,
        }
        if reward.value is not None:
            attrs[gen_ai.GEN_AI_EVALUATION_SCORE_VALUE] = reward.value
        if reward.span_id is not None:
            parent = span_id_of("span", reward.span_id)
        else:
            parent = _parent_of(reward.rollout_id, reward.attempt_id)
        self._emit(
            f"reward {reward.name}",
            span_id_of("reward", reward.reward_id),
            parent,
            trace_id_of(reward.rollout_id),
            SpanKind.INTERNAL,
            reward.created_at,
            reward.created_at,
            attrs,
        )

    def attempt(self, rollout: Rollout, attempt: Attempt) -> None:
        """An ended attempt: the ``invoke_agent`` span its calls hang under."""
        attrs = {
            gen_ai.GEN_AI_OPERATION_NAME: _OPS.INVOKE_AGENT.value,
            gen_ai.GEN_AI_AGENT_NAME: rollout.agent,
            gen_ai.GEN_AI_CONVERSATION_ID: rollout.rollout_id,
            "agentforge.rollout.id": rollout.rollout_id,
            "agentforge.attempt.id": attempt.attempt_id,
            "agentforge.attempt.number": attempt.number,
            "agentforge.attempt.state": str(attempt.state),
            "agentforge.worker.id": attempt.worker_id,
        }
        error = None if attempt.state is AttemptState.succeeded else (attempt.error or str(attempt.state))
        self._emit(
            " ".join(filter(None, ("invoke_agent", rollout.agent))),
            span_id_of("attempt", attempt.attempt_id),
            span_id_of("rollout", rollout.rollout_id),
            trace_id_of(rollout.rollout_id),
            SpanKind.INTERNAL,
            attempt.started_at,
            attempt.ended_at or attempt.heartbeat_at,
            attrs,
            error,
        )

    def rollout(self, rollout: Rollout, final_reward: Reward | None) -> None:
        """A finished rollout: the trace's root span."""
        attrs: dict[str, Any] = {
            "agentforge.rollout.id": rollout.rollout_id,
            "agentforge.rollout.state": str(rollout.state),
            "agentforge.rollout.attempts": rollout.attempts,
            "agentforge.task.id": rollout.task.task_id,
            gen_ai.GEN_AI_AGENT_NAME: rollout.agent,
            gen_ai.GEN_AI_CONVERSATION_ID: rollout.rollout_id,
        }
        if rollout.group_id:
            attrs["agentforge.group.id"] = rollout.group_id
        attrs.update({f"agentforge.resource.{k}": v for k, v in rollout.resources.items()})
        if final_reward is not None and final_reward.value is not None:
            attrs["agentforge.reward"] = final_reward.value
        error = None if rollout.state is RolloutState.succeeded else (rollout.error or str(rollout.state))
        self._emit(
            " ".join(filter(None, ("rollout", rollout.agent))),
            span_id_of("rollout", rollout.rollout_id),
            None,
            trace_id_of(rollout.rollout_id),
            SpanKind.INTERNAL,
            rollout.created_at,
            rollout.updated_at,
            attrs,
            error,
        )

    # --- attributes ----------------------------------------------------------------------------------
    def _llm(self, span: Span, attrs: dict[str, Any]) -> tuple[str, SpanKind]:
        llm = span.llm
        assert llm is not None
        op = _OPS.CHAT.value if llm.endpoint == "chat" else _OPS.TEXT_COMPLETION.value
        usage = llm.usage
        inputs = usage.get("prompt_tokens", len(llm.prompt_token_ids or ()))
        outputs = usage.get("completion_tokens", len(llm.completion_token_ids or ()))
        attrs.update(
            {
                gen_ai.GEN_AI_OPERATION_NAME: op,
                gen_ai.GEN_AI_PROVIDER_NAME: PROVIDER,
                gen_ai.GEN_AI_REQUEST_MODEL: llm.model,
                gen_ai.GEN_AI_RESPONSE_MODEL: llm.version or llm.model,
                gen_ai.GEN_AI_REQUEST_STREAM: llm.stream,
                gen_ai.GEN_AI_USAGE_INPUT_TOKENS: int(inputs),
                gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: int(outputs),
                "agentforge.version": llm.version,
                "agentforge.trainable": llm.trainable,
            }
        )
        if llm.finish_reason:
            attrs[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] = [llm.finish_reason]
        if llm.tool_calls:
            attrs["agentforge.tool_calls"] = [call.name for call in llm.tool_calls]
        if llm.flags:
            attrs["agentforge.flags"] = list(llm.flags)
        for key, attr in _SAMPLING.items():
            value = llm.sampling.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                attrs[attr] = value
        stop = llm.sampling.get("stop")
        if stop:
            attrs[gen_ai.GEN_AI_REQUEST_STOP_SEQUENCES] = (
                [stop] if isinstance(stop, str) else [str(s) for s in stop]
            )
        parts: list[dict[str, Any]] = []
        if self.capture_content and llm.response_text:
            parts.append({"type": "text", "content": llm.response_text})
        for call in llm.tool_calls:  # names and ids always; arguments are content
            part = {"type": "tool_call", "id": call.id, "name": call.name}
            parts.append(
                part | ({"arguments": call.parsed or call.arguments} if self.capture_content else {})
            )
        if parts:
            message = {"role": "assistant", "parts": parts, "finish_reason": llm.finish_reason or "unknown"}
            attrs[gen_ai.GEN_AI_OUTPUT_MESSAGES] = _json([message])
        if self.capture_content:
            attrs[gen_ai.GEN_AI_INPUT_MESSAGES] = _json(_input_messages(llm.request))
            if llm.request.get("tools"):
                attrs[gen_ai.GEN_AI_TOOL_DEFINITIONS] = _json(llm.request["tools"])
        return f"{op} {llm.model}".strip(), SpanKind.CLIENT

    def _tool(self, span: Span, attrs: dict[str, Any]) -> str:
        attrs.update(
            {
                gen_ai.GEN_AI_OPERATION_NAME: _OPS.EXECUTE_TOOL.value,
                gen_ai.GEN_AI_TOOL_NAME: span.name,
                gen_ai.GEN_AI_TOOL_TYPE: "function",
            }
        )
        call_id = span.attributes.get("tool_call_id")
        if call_id:
            attrs[gen_ai.GEN_AI_TOOL_CALL_ID] = str(call_id)
        if self.capture_content:
            arguments = span.attributes.get("arguments", span.attributes.get("input"))
            if arguments is not None:
                attrs[gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS] = _text(arguments)
            if span.attributes.get("output") is not None:
                attrs[gen_ai.GEN_AI_TOOL_CALL_RESULT] = _text(span.attributes["output"])
        return f"{_OPS.EXECUTE_TOOL.value} {span.name}".strip()

    def _custom_attributes(self, attributes: dict[str, Any]) -> dict[str, Any]:
        """A custom span's own attributes: numbers and booleans always, text only with content capture."""
        out: dict[str, Any] = {}
        for key, value in attributes.items():
            if isinstance(value, bool) or (isinstance(value, int | float) and math.isfinite(value)):
                out[f"agentforge.attributes.{key}"] = value
            elif self.capture_content and value is not None and not isinstance(value, int | float):
                out[f"agentforge.attributes.{key}"] = _text(value)
        return out

    def _emit(
        self,
        name: str,
        span_id: int,
        parent: int | None,
        trace: int,
        kind: SpanKind,
        start_s: float,
        end_s: float | None,
        attrs: dict[str, Any],
        error: str | None = None,
    ) -> None:
        self._ids.span_id, self._ids.trace_id = span_id, trace
        context = Context()
        if parent is not None:
            remote = SpanContext(trace, parent, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
            context = trace_api.set_span_in_context(NonRecordingSpan(remote), context)
        otel = self._tracer.start_span(
            name, context=context, kind=kind, attributes=attrs, start_time=_ns(start_s)
        )
        if error is not None:
            kind_of_error = _ERROR_CLASS.match(error)
            error_type = kind_of_error.group(0) if kind_of_error else "error"
            otel.set_attribute(ERROR_TYPE, error_type)
            # an error message may quote what failed (a tool result, the completion): content, like the rest
            otel.set_status(Status(StatusCode.ERROR, error[:500] if self.capture_content else error_type))
        otel.end(end_time=_ns(max(end_s if end_s is not None else start_s, start_s)))


#: an error's class, when its message starts with one (``UpstreamTimeout: ...``, ``tool_error``); else "error"
_ERROR_CLASS = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,63}(?=:|$)")


def _version() -> str | None:
    try:
        return importlib.metadata.version("agentforge")
    except importlib.metadata.PackageNotFoundError:
        return None


def _parent_of(rollout_id: str, attempt_id: str | None) -> int:
    return span_id_of("attempt", attempt_id) if attempt_id else span_id_of("rollout", rollout_id)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else _json(value)


def _input_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages in the conventions' shape (role + parts); a completion prompt is one user turn."""
    if "messages" not in request:
        prompt = request.get("prompt", "")
        return [{"role": "user", "parts": [{"type": "text", "content": _text(prompt)}]}]
    out = []
    for message in request.get("messages") or ():
        if not isinstance(message, dict):
            continue
        role, parts = str(message.get("role", "user")), []
        content = message.get("content")
        if role == "tool":
            parts.append(
                {"type": "tool_call_response", "id": message.get("tool_call_id"), "response": content}
            )
        elif content:
            parts.append({"type": "text", "content": _text(content)})
        for call in message.get("tool_calls") or ():
            function = call.get("function", {}) if isinstance(call, dict) else {}
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id") if isinstance(call, dict) else None,
                    "name": function.get("name"),
                    "arguments": function.get("arguments"),
                }
            )
        out.append({"role": role, "parts": parts})
    return out
