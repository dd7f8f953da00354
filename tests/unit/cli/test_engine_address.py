"""Issue 18: the engine's own address (for a simulated customer) reaches agents as ``ctx.engine`` and is printed.

``agentforge run --engine-url`` hands what ``serve`` printed to every rollout (process workers too: the address
travels in the worker spec); ``agentforge train``'s stack builds it from the engine it started and prints the
same ``engine …`` line ``serve`` prints.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.runtime import EngineEndpoint

AGENT = """
def engine_agent(task, ctx):
    engine = ctx.engine
    seen = None if engine is None else {"url": engine.base_url, "key": engine.api_key, "model": engine.model}
    ctx.emit_span("engine-seen", {"engine": seen})
    return 1.0
"""


def _seen(store_url: str) -> list[object]:
    from agentforge.open import open_store

    store = open_store(store_url)
    try:
        rollouts = store.list_rollouts()
        spans = [s for r in rollouts for s in store.list_spans(r.rollout_id) if s.name == "engine-seen"]
        return [s.attributes["engine"] for s in spans]
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_run_hands_the_engine_address_to_every_rollout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    (tmp_path / "engine_agents.py").write_text(textwrap.dedent(AGENT))
    (tmp_path / "tasks.jsonl").write_text('{"input": {}}\n')
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    common = [
        "run",
        "engine_agents:engine_agent",
        "--gateway",
        "http://127.0.0.1:9",
        "--store-url",
        url,
        "--tasks",
        "tasks.jsonl",
        "--workers",
        "1",
        "--mode",
        mode,
        "--timeout",
        "120",
    ]
    engine = ["--engine-url", "http://127.0.0.1:40123/v1", "--engine-key", "k-1", "--engine-model", "base"]
    done = CliRunner().invoke(app, [*common, *engine])
    assert done.exit_code == 0, done.output
    assert _seen(url) == [{"url": "http://127.0.0.1:40123/v1", "key": "k-1", "model": "base"}]
    if mode == "thread":
        done = CliRunner().invoke(app, common)  # not given: None, never a guess
        assert done.exit_code == 0, done.output
        assert sorted(_seen(url), key=json.dumps) == sorted(
            [None, {"url": "http://127.0.0.1:40123/v1", "key": "k-1", "model": "base"}], key=json.dumps
        )
        bad = CliRunner().invoke(app, [*common, "--engine-url", "127.0.0.1:40123"])
        assert bad.exit_code == 2 and "--engine-url" in bad.output


def test_the_engine_line_and_the_client() -> None:
    from agentforge.commands import common

    engine = EngineEndpoint("http://127.0.0.1:40123/v1", api_key="k-2", model="base")
    with common.console.capture() as captured:
        common.print_engine(engine)
    line = re.sub(r"\s+", " ", captured.get())
    assert line.startswith("engine http://127.0.0.1:40123/v1 model base key k-2 (for a simulated customer")
    client = engine.openai_client(max_retries=0)
    assert str(client.base_url).rstrip("/") == engine.base_url and client.api_key == "k-2"
    assert EngineEndpoint("http://x/v1").openai_client().api_key  # a placeholder, never empty


@pytest.mark.slow  # the embedded engine (SmolLM2-135M): a few seconds
def test_the_train_stack_gives_agents_its_engine(tmp_path: Path) -> None:
    """What ``agentforge train`` wires: the stack's engine endpoint answers, and its runners hand it on."""
    from agentforge.runtime import enqueue_tasks
    from agentforge.stack import LocalStack
    from agentforge.testing import memory_store
    from agentforge.types import Task

    seen: list[EngineEndpoint | None] = []
    answers: list[str] = []

    def agent(task, ctx):  # type: ignore[no-untyped-def]
        seen.append(ctx.engine)
        reply = ctx.engine.openai_client(max_retries=0).chat.completions.create(
            model=ctx.engine.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        answers.append(reply.choices[0].message.content or "")
        return 1.0

    store = memory_store()
    with LocalStack(store, agent, backend="embedded", workers=1) as stack:
        assert stack.engine is not None and stack.engine.base_url == stack.server.base_url
        (rollout,) = enqueue_tasks(store, [Task(input={})])
        stack.runner.run_until_done([rollout.rollout_id], timeout_s=120)
    assert seen == [stack.engine] and len(answers) == 1
    assert store.get_rollout(rollout.rollout_id).state.value == "succeeded"
    assert not [s for s in store.list_spans(rollout.rollout_id) if s.kind.value == "llm"]  # never recorded
