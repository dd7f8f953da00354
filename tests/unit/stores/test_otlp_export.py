"""The OTLP export of what a SQL store commits (agentforge.stores.otlp, agentforge.stores.otel_spans).

The SDK's in-memory exporter stands in for the collector here (the real receiver is in
tests/integration/test_otlp_export_receiver.py): one trace per rollout with the right parents, GenAI attributes, content
only when asked for, the standard environment switching it on and off, and drops counted, never blocking a write.
"""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentforge.errors import ConfigError
from agentforge.open import open_store
from agentforge.stores.otel_spans import span_id_of, trace_id_of
from agentforge.stores.otlp import OTLPExport, OTLPSettings, export_to_otlp, otlp_settings_from_env
from agentforge.stores.server import otlp_metrics_text
from agentforge.stores.sql import SQLStore
from agentforge.types import AttemptState, LLMCall, Reward, Rollout, Span, SpanKind, ToolCall

FAST = OTLPSettings(endpoint="http://127.0.0.1:9", schedule_delay_s=0.05)


def _llm(text: str = "", tool: str | None = None) -> LLMCall:
    calls = [ToolCall(id="call-1", name=tool, arguments='{"order": 7}', parsed={"order": 7})] if tool else []
    return LLMCall(
        model="policy",
        version="policy@v3",
        request={"messages": [{"role": "user", "content": "where is 7?"}]},
        sampling={"temperature": 0.7, "max_tokens": 32, "stop": "\n"},
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[4, 5],
        logprobs=[-0.1, -0.2],
        response_text=text,
        tool_calls=calls,
        finish_reason="tool_calls" if tool else "stop",
        usage={"prompt_tokens": 3, "completion_tokens": 2},
        latency_s=0.25,
    )


def _one_rollout(store: SQLStore) -> tuple[Rollout, str, list[Span], Reward]:
    """A rollout that calls the model (a tool call), runs the tool, answers, is scored 1.0 and succeeds."""
    store.enqueue_rollout(Rollout(agent="desk", group_id="g1", resources={"policy": "policy@v3"}))
    rollout, attempt = store.claim_rollout("worker-1")  # type: ignore[misc]
    rid = rollout.rollout_id
    spans = [
        store.add_span(Span(rollout_id=rid, kind=SpanKind.llm, name="chat", llm=_llm(tool="find_order"))),
        store.add_span(
            Span(
                rollout_id=rid,
                kind=SpanKind.tool,
                name="find_order",
                attributes={"tool_call_id": "call-1", "arguments": '{"order": 7}', "output": "shipped"},
            )
        ),
        store.add_span(Span(rollout_id=rid, kind=SpanKind.llm, name="chat", llm=_llm("It shipped."))),
        store.add_span(Span(rollout_id=rid, name="retrieve", attributes={"hits": 3, "query": "order 7"})),
    ]
    reward = store.add_reward(Reward(rollout_id=rid, value=1.0, final=True))
    store.finish_attempt(attempt.attempt_id, AttemptState.succeeded)
    return rollout, attempt.attempt_id, spans, reward


def _exported(settings: OTLPSettings = FAST):  # type: ignore[no-untyped-def]
    store, memory = SQLStore("sqlite://"), InMemorySpanExporter()
    export = OTLPExport(store, settings, exporter=memory)
    store.listen(export)
    return store, export, memory


def test_a_rollout_is_one_trace_with_the_right_parents_and_genai_attributes() -> None:
    store, export, memory = _exported()
    rollout, attempt_id, spans, reward = _one_rollout(store)
    assert export.flush(10)
    store.close()
    out = {s.attributes.get("agentforge.span.id") or s.name: s for s in memory.get_finished_spans()}
    assert len(out) == 7 and export.metrics()["exported"] == 7  # root, attempt, 4 spans, reward
    assert {s.context.trace_id for s in out.values()} == {trace_id_of(rollout.rollout_id)}
    root, attempt = out["rollout desk"], out["invoke_agent desk"]
    assert root.parent is None and root.context.span_id == span_id_of("rollout", rollout.rollout_id)
    assert (
        attempt.parent.span_id == root.context.span_id
        and attempt.attributes["gen_ai.operation.name"] == "invoke_agent"
    )
    first, tool, answer, custom = (out[s.span_id] for s in spans)
    assert all(s.parent.span_id == attempt.context.span_id for s in (first, tool, answer, custom))
    assert out["reward reward"].parent.span_id == custom.context.span_id  # the span it follows
    assert out["reward reward"].attributes["gen_ai.evaluation.score.value"] == 1.0
    assert (
        root.attributes["agentforge.reward"] == 1.0
        and root.attributes["agentforge.rollout.state"] == "succeeded"
    )
    assert root.attributes["agentforge.resource.policy"] == "policy@v3"
    assert first.name == "chat policy" and first.kind.name == "CLIENT"
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "policy",
        "gen_ai.response.model": "policy@v3",
        "gen_ai.usage.input_tokens": 3,
        "gen_ai.usage.output_tokens": 2,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.max_tokens": 32,
        "gen_ai.conversation.id": rollout.rollout_id,
        "gen_ai.provider.name": "agentforge",
        "agentforge.attempt.id": attempt_id,
    }
    assert {k: first.attributes.get(k) for k in expected} == expected
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert first.attributes["gen_ai.request.stop_sequences"] == ("\n",)
    assert first.attributes["agentforge.tool_calls"] == ("find_order",)
    # tool calls: name and id always; arguments and text are content, not exported by default
    assert '"name": "find_order"' in first.attributes["gen_ai.output.messages"]
    assert "order" not in first.attributes["gen_ai.output.messages"].replace("find_order", "")
    assert (
        "gen_ai.input.messages" not in first.attributes and "gen_ai.output.messages" not in answer.attributes
    )
    assert tool.name == "execute_tool find_order" and tool.attributes["gen_ai.tool.call.id"] == "call-1"
    assert "gen_ai.tool.call.arguments" not in tool.attributes
    assert custom.name == "retrieve" and custom.attributes["agentforge.attributes.hits"] == 3
    assert "agentforge.attributes.query" not in custom.attributes
    # the span's own times: start, and end = start + latency for an LLM call recorded without an end
    assert first.start_time == int(spans[0].started_at * 1e9)
    assert first.end_time == int((spans[0].ended_at or spans[0].started_at + 0.25) * 1e9)
    assert reward.span_id == spans[-1].span_id


def test_content_is_exported_only_when_asked_for() -> None:
    store, export, memory = _exported(OTLPSettings(schedule_delay_s=0.05, capture_content=True))
    _, _, spans, _ = _one_rollout(store)
    assert export.flush(10)
    store.close()
    out = {s.attributes.get("agentforge.span.id"): s for s in memory.get_finished_spans()}
    first, tool, answer, custom = (out[s.span_id] for s in spans)
    assert '"content": "where is 7?"' in first.attributes["gen_ai.input.messages"]
    assert '"arguments": {"order": 7}' in first.attributes["gen_ai.output.messages"]
    assert '"content": "It shipped."' in answer.attributes["gen_ai.output.messages"]
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"order": 7}'
    assert tool.attributes["gen_ai.tool.call.result"] == "shipped"
    assert custom.attributes["agentforge.attributes.query"] == "order 7"


def test_failed_attempts_and_rollouts_are_error_spans_each_exported_once() -> None:
    store, export, memory = _exported()
    store.enqueue_rollout(Rollout(agent="desk", max_attempts=2))
    for n in range(2):
        _, attempt = store.claim_rollout("w")  # type: ignore[misc]
        store.finish_attempt(attempt.attempt_id, AttemptState.failed, error=f"RolloutTimeout: try {n}")
        store.finish_attempt(attempt.attempt_id, AttemptState.failed)  # no change: nothing new exported
    assert export.flush(10)
    store.close()
    names = sorted(s.name for s in memory.get_finished_spans())
    assert names == ["invoke_agent desk", "invoke_agent desk", "rollout desk"]
    assert all(s.status.status_code.name == "ERROR" for s in memory.get_finished_spans())
    root = next(s for s in memory.get_finished_spans() if s.parent is None)
    assert (
        root.attributes["error.type"] == "RolloutTimeout"
        and root.status.description == "RolloutTimeout"  # the message is content: exported only when asked
    )


def test_an_orphan_span_is_a_trace_of_its_own() -> None:
    store, export, memory = _exported()
    span = store.add_span(Span(kind=SpanKind.llm, name="chat", llm=_llm("hi")))
    assert export.flush(10)
    store.close()
    (out,) = memory.get_finished_spans()
    assert out.parent is None and out.context.trace_id == trace_id_of(f"orphan:{span.span_id}")


class _Stuck(SpanExporter):
    """A collector that never answers until released, then refuses everything."""

    def __init__(self) -> None:
        self.release, self.calls = threading.Event(), 0

    def export(self, spans):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.release.wait(30)
        return SpanExportResult.FAILURE


def test_a_stuck_collector_never_blocks_a_write_and_every_lost_span_is_counted() -> None:
    store, stuck = SQLStore("sqlite://"), _Stuck()
    export = OTLPExport(
        store, OTLPSettings(max_queue_size=4, max_export_batch_size=2, schedule_delay_s=0.05), stuck
    )
    store.listen(export)
    store.add_span(Span(name="first"))
    deadline = time.monotonic() + 10
    while stuck.calls == 0 and time.monotonic() < deadline:  # the export thread now hangs on the first batch
        time.sleep(0.01)
    started = time.perf_counter()
    for i in range(20):
        store.add_span(Span(name=f"s{i}"))
    assert time.perf_counter() - started < 15  # each write waits for its commit only, not the 30 s hang
    assert export.metrics() == {
        "exported": 0,
        "dropped_queue_full": 16,
        "dropped_export_failed": 0,
        "build_errors": 0,
        "queued": 4,
    }
    text = otlp_metrics_text(store)
    assert (
        'agentforge_otlp_dropped_total{reason="queue_full"} 16' in text
        and "agentforge_otlp_export_enabled 1" in text
    )
    stuck.release.set()
    assert export.flush(10)
    assert export.metrics()["dropped_export_failed"] == 5 and export.metrics()["queued"] == 0
    store.close()


def test_a_failing_listener_loses_no_write() -> None:
    store = SQLStore("sqlite://")

    class Broken:
        def committed(self, items):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

        def rollouts_changed(self, ids):  # type: ignore[no-untyped-def]
            raise RuntimeError("boom")

        def close(self) -> None:
            pass

    store.listen(Broken())
    store.enqueue_rollout(Rollout(rollout_id="ro-1"))
    _, attempt = store.claim_rollout("w")  # type: ignore[misc]
    assert store.add_span(Span(rollout_id="ro-1", name="x")).sequence is not None
    assert store.finish_attempt(attempt.attempt_id, AttemptState.succeeded).state == "succeeded"
    assert [s.name for s in store.list_spans("ro-1")] == ["x"]
    store.close()


def test_the_standard_environment_switches_the_export_on_and_off(monkeypatch) -> None:
    assert otlp_settings_from_env({}) is None
    on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert otlp_settings_from_env(on) == OTLPSettings()
    assert otlp_settings_from_env(on | {"OTEL_SDK_DISABLED": "true"}) is None
    assert otlp_settings_from_env(on | {"OTEL_TRACES_EXPORTER": "none"}) is None
    tuned = otlp_settings_from_env(
        on
        | {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            "OTEL_BSP_MAX_QUEUE_SIZE": "64",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "8",
            "OTEL_BSP_SCHEDULE_DELAY": "250",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
        }
    )
    assert tuned == OTLPSettings(
        protocol="grpc",
        max_queue_size=64,
        max_export_batch_size=8,
        schedule_delay_s=0.25,
        capture_content=True,
    )
    with pytest.raises(ConfigError, match="'http/json' is not supported"):
        otlp_settings_from_env(on | {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(ConfigError, match="OTEL_BSP_MAX_QUEUE_SIZE='lots' is not a number"):
        otlp_settings_from_env(on | {"OTEL_BSP_MAX_QUEUE_SIZE": "lots"})
    with pytest.raises(ConfigError, match=r"max_export_batch_size \(512\) <= max_queue_size \(8\)"):
        otlp_settings_from_env(on | {"OTEL_BSP_MAX_QUEUE_SIZE": "8"})
    plain = open_store("sqlite://")
    assert plain.listener is None and export_to_otlp(plain) is None  # type: ignore[attr-defined]
    plain.close()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    exporting = open_store("sqlite://")
    assert isinstance(exporting.listener, OTLPExport)  # type: ignore[attr-defined]
    exporting.close()


def test_an_exporter_that_cannot_be_built_drops_and_counts_everything(monkeypatch) -> None:
    def broken(settings):  # type: ignore[no-untyped-def]
        raise FileNotFoundError("no such certificate: /etc/otel/ca.pem")

    monkeypatch.setattr("agentforge.stores.otlp._make_exporter", broken)
    store = SQLStore("sqlite://")
    export = export_to_otlp(store, FAST)
    assert export is not None
    for i in range(3):
        store.add_span(Span(name=f"s{i}"))
    assert export.flush(10)
    assert export.metrics()["dropped_export_failed"] == 3 and export.metrics()["exported"] == 0
    assert len(store.list_spans(orphans=True)) == 3
    store.close()


def test_with_content_capture_off_no_marker_leaves_by_any_attribute_or_status() -> None:
    """Issue 36 (a contract from public bug reports elsewhere): a tool whose result carries a marker and fails
    quoting it, a completion carrying it, an attempt and a rollout that fail with it in their error, and a
    reward whose note quotes the completion: no exported attribute, event or status description holds it."""
    marker = "MARKER-4f1c-private"
    store, export, memory = _exported()
    store.enqueue_rollout(Rollout(agent="desk", max_attempts=1, metadata={"note": marker}))
    rollout, attempt = store.claim_rollout("worker-1")  # type: ignore[misc]
    rid = rollout.rollout_id
    store.add_span(Span(rollout_id=rid, kind=SpanKind.llm, name="chat", llm=_llm(f"your code is {marker}")))
    store.add_span(
        Span(
            rollout_id=rid,
            kind=SpanKind.tool,
            name="lookup",
            status="error",
            error=f"the lookup of {marker} failed",
            attributes={"output": marker},
        )
    )
    store.add_span(Span(rollout_id=rid, name="step", status="error", error=f"ValueError: bad {marker}"))
    store.add_reward(Reward(rollout_id=rid, value=0.0, final=True, metadata={"note": f"said {marker}"}))
    store.finish_attempt(attempt.attempt_id, AttemptState.failed, error=f"agent raised: {marker}")
    assert export.flush(10)
    store.close()
    exported = memory.get_finished_spans()
    assert len(exported) >= 6
    for span in exported:
        texts = [span.name, str(span.status.description), *(str(v) for v in span.attributes.values())]
        texts += [str(e.attributes) + e.name for e in span.events]
        assert not any(marker in t for t in texts), (span.name, texts)
    statuses = {
        s.name: (s.attributes.get("error.type"), s.status.description)
        for s in exported
        if s.status.description
    }
    assert statuses["step"] == ("ValueError", "ValueError") and statuses["execute_tool lookup"] == (
        "error",
        "error",
    )
