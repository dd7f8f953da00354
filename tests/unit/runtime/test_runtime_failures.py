"""Handed cases: a context overflow on turn 3 and a 2 MB tool output, through the real gateway.

A failed attempt is marked failed (never scored 0), a retry supersedes it, and the counts of finished
rollouts add up; a huge tool output is stored on its span but the agent only sends a bounded version.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.tools import tool
from runtime_helpers import gateway_env

from agentforge.errors import UserError
from agentforge.runtime import RolloutContext, Runner, bound_tool_output, enqueue_tasks
from agentforge.runtime.callbacks import ToolSpanCallback
from agentforge.testing import ScriptedError, ScriptedTurn
from agentforge.types import AttemptState, Rollout, RolloutState, SpanKind, Task

FAST = {"heartbeat_s": 0.2, "heartbeat_timeout_s": 2.0, "poll_s": 0.02}
OVERFLOW = ScriptedError(
    400,
    "This model's maximum context length is 2048 tokens. However, your prompt contains at least 2301 input tokens.",
    "BadRequestError",
)


def three_turn_agent(task: Task, ctx: RolloutContext) -> float:
    """A chat whose prompt grows every turn (each user turn adds the previous answer and more text)."""
    client = ctx.openai_client(max_retries=0)
    messages = [{"role": "user", "content": task.input["q"]}]
    try:
        for turn in range(3):
            out = client.chat.completions.create(model=ctx.model, messages=messages)  # type: ignore[arg-type]
            messages += [
                {"role": "assistant", "content": out.choices[0].message.content or ""},
                {"role": "user", "content": f"turn {turn}: " + "more context " * 40},
            ]
    finally:
        client.close()
    return 1.0


def _finished_counts(store: object, rollouts: list[Rollout]) -> dict[str, int]:
    counts = {s.value: len(store.list_rollouts(state=s)) for s in RolloutState}  # type: ignore[attr-defined]
    assert sum(counts.values()) == len(rollouts)
    return counts


def test_context_overflow_on_turn_3_fails_the_attempt_and_the_retry_supersedes_it(tmp_path: Path) -> None:
    # Exactly one call of the whole run, the 3rd, is over the context limit; every other call succeeds.
    turns = ["a1", "a2", ScriptedTurn(error=OVERFLOW)] + ["ok"] * 15
    with gateway_env(tmp_path, turns) as (store, gateway, upstream, _url):
        rollouts = enqueue_tasks(
            store, [{"q": f"question {i}"} for i in range(5)], resources={"policy": "policy"}
        )
        with Runner(store, three_turn_agent, gateway.url, **FAST) as runner:  # 1 worker: calls in order
            done = runner.run_until_done([r.rollout_id for r in rollouts], timeout_s=30)
        assert upstream.remaining == 0
        assert [r.state for r in done] == [RolloutState.succeeded] * 5
        assert _finished_counts(store, rollouts) == {**{s.value: 0 for s in RolloutState}, "succeeded": 5}

        retried = [r for r in done if r.attempts == 2]
        assert len(retried) == 1 and all(r.attempts == 1 for r in done if r not in retried)
        failed, succeeded = store.list_attempts(retried[0].rollout_id)
        assert failed.state is AttemptState.failed and succeeded.state is AttemptState.succeeded
        assert (
            failed.error.startswith("BadRequestError (HTTP 400):")
            and "maximum context length" in failed.error
        )

        rid = retried[0].rollout_id
        dead_spans = store.list_spans(attempt_id=failed.attempt_id, kind=SpanKind.llm)
        assert [s.status for s in dead_spans] == ["ok", "ok", "error"]
        assert "maximum context length" in (dead_spans[-1].error or "")
        valid = store.list_spans(rollout_id=rid, kind=SpanKind.llm, valid_only=True)
        assert len(valid) == 3 and {s.attempt_id for s in valid} == {succeeded.attempt_id}
        assert all(s.status == "ok" for s in valid)
        # The failed attempt was not scored 0: the only reward is the retry's.
        assert [(r.value, r.attempt_id) for r in store.list_rewards(rid)] == [(1.0, succeeded.attempt_id)]
        assert all(store.final_reward(r.rollout_id).value == 1.0 for r in done)  # type: ignore[union-attr]


def _mixed_unicode(n_chars: int) -> str:
    pieces = "Grüße, 世界! Ωμέγα — مرحبا שלום 🚀👩🏽‍💻 e\u0301 ñ ß Ж 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\t\n"
    text = pieces * (n_chars // len(pieces) + 1)
    return text[:n_chars]


BIG = _mixed_unicode(2_000_000)


@tool
def fetch_page(url: str) -> str:
    """Fetch a web page (returns ~2 MB of mixed-Unicode text)."""
    return BIG


def tool_agent(task: Task, ctx: RolloutContext) -> float:
    """Calls a LangChain tool that returns 2 MB, sends a bounded version of it to the model."""
    page = fetch_page.invoke(
        {"url": "https://example.test"}, config={"callbacks": [ToolSpanCallback.for_context(ctx)]}
    )
    client = ctx.openai_client(max_retries=0)
    try:
        client.chat.completions.create(
            model="policy",
            messages=[
                {"role": "user", "content": "Summarise the page."},
                {
                    "role": "tool",
                    "tool_call_id": "call_1",
                    "content": bound_tool_output(page, task.input["budget"]),
                },
            ],
        )  # type: ignore[arg-type]
    finally:
        client.close()
    return 1.0


def test_two_megabyte_tool_output_is_stored_bounded_for_the_model_and_overflow_fails_cleanly(
    tmp_path: Path,
) -> None:
    # max_model_len=400 fake tokens (about 1600 characters): a 1000-character budget fits, 8000 does not.
    with gateway_env(tmp_path, ["ok"] * 4, max_model_len=400) as (store, gateway, upstream, _url):
        fits, overflows = enqueue_tasks(store, [{"budget": 1000}, {"budget": 8000}], max_attempts=2)
        with Runner(store, tool_agent, gateway.url, **FAST) as runner:
            done_fits, done_over = runner.run_until_done(
                [fits.rollout_id, overflows.rollout_id], timeout_s=30
            )

        assert done_fits.state is RolloutState.succeeded
        (span,) = store.list_spans(rollout_id=fits.rollout_id, kind=SpanKind.tool)
        assert span.name == "fetch_page" and span.status == "ok"
        assert span.attributes["output"] == BIG and span.attributes["output_chars"] == 2_000_000
        sent = [
            m["content"] for req in upstream.requests for m in req.body["messages"] if m["role"] == "tool"
        ]
        assert len(sent[0]) <= 1000 and sent[0].endswith(" chars]") and "…[truncated " in sent[0]
        assert sent[0] == bound_tool_output(BIG, 1000) and sent[0].startswith(BIG[:900])
        assert all(len(s) <= 8000 for s in sent)

        assert done_over.state is RolloutState.failed and done_over.attempts == 2
        assert "maximum context length is 400 tokens" in (done_over.error or "")
        attempts = store.list_attempts(overflows.rollout_id)
        assert [a.state for a in attempts] == [AttemptState.failed] * 2
        assert (
            store.list_rewards(overflows.rollout_id) == []
            and store.final_reward(overflows.rollout_id) is None
        )
        assert (
            len(store.list_spans(rollout_id=overflows.rollout_id, kind=SpanKind.tool)) == 2
        )  # one per attempt


def test_bound_tool_output() -> None:
    assert bound_tool_output("short", 10) == "short"
    assert bound_tool_output("", 0) == ""
    out = bound_tool_output("x" * 1000, 100)
    assert len(out) == 100 and out == "x" * 78 + "…[truncated 922 chars]"
    big = bound_tool_output(BIG, 5000)
    dropped = int(big.rsplit("[truncated ", 1)[1].split(" ")[0])
    assert len(big) <= 5000 and BIG.startswith(big[: len(big) - len(f"…[truncated {dropped} chars]")])
    assert len(BIG) - dropped == len(big) - len(f"…[truncated {dropped} chars]")
    surrogates = "ab\ud83d\ude80" * 50  # a str holding UTF-16 surrogate halves: never cut between them
    cut = bound_tool_output(surrogates, 23)
    assert not ("\ud800" <= cut.split("…")[0][-1] <= "\udbff")
    assert bound_tool_output("x" * 100, 3) == "…[truncated 100 chars]"  # budget below the marker
    with pytest.raises(UserError, match="max_chars=-1"):
        bound_tool_output("x", -1)
