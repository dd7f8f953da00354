"""docs/new_domain.md runs as written: its files make a working domain, and its commands train an adapter.

The fast test writes the guide's files into an empty folder and runs its agent through a real gateway and
store against a scripted engine (the model's turns are scripted, everything else is real). The slow test runs
every shell command of the guide, in order, in one bash script: serve, run, traces, train two GRPO steps on
the embedded engine, promote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import gateway_env
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.errors import UserError
from agentforge.runtime import Runner, enqueue_tasks, load_tasks
from agentforge.testing import ScriptedToolCall, ScriptedTurn, memory_store

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "new_domain.md"
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```\w*\n(.*?)\n```", re.DOTALL)
BASH_BLOCK = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)


def write_guide_files(folder: Path) -> list[str]:
    """Write every ``<!-- file: PATH -->`` block of the guide under ``folder``; returns the paths."""
    text = GUIDE.read_text(encoding="utf-8")
    written = []
    for path, body in FILE_BLOCK.findall(text):
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(body + "\n", encoding="utf-8")
        written.append(path)
    return written


@pytest.fixture
def domain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    folder = tmp_path / "empty-folder"
    folder.mkdir()
    assert write_guide_files(folder) == [
        "library/domain.py",
        "tasks.jsonl",
        "check_tasks.py",
        "library/agent.py",
        "library/customer.py",
    ]
    monkeypatch.syspath_prepend(str(folder))
    for name in [m for m in sys.modules if m == "library" or m.startswith("library.")]:
        monkeypatch.delitem(sys.modules, name)
    import library.agent
    import library.customer  # noqa: F401 - it must import
    import library.domain

    yield folder, library.domain, library.agent
    for name in [m for m in sys.modules if m == "library" or m.startswith("library.")]:
        del sys.modules[name]


def test_the_guides_tasks_score_one_on_their_gold_path_and_need_their_env(domain) -> None:  # type: ignore[no-untyped-def]
    from agentforge.agents.customer_service.rewards import tau_reward

    folder, dom, _ = domain
    tasks = load_tasks(folder / "tasks.jsonl")
    assert len(tasks) == 4
    for task in tasks:
        db = dom.ENV.new_db()
        for action in task.metadata["actions"]:
            assert not db.call_tool(action["name"], action["kwargs"]).startswith("Error"), task.task_id
        said = [
            {"role": "assistant", "content": f"Sorry, that book is {o}."} for o in task.metadata["outputs"]
        ]
        assert tau_reward(db, task, said, env=dom.ENV) == 1.0, task.task_id
        assert tau_reward(dom.ENV.new_db(), task, [], env=dom.ENV) == 0.0  # did nothing, said nothing
        with pytest.raises(UserError, match="env="):  # the guide's promise: no silent 0.0 on the retail DB
            tau_reward(db, task, said)
    checked = subprocess.run([sys.executable, "check_tasks.py"], cwd=folder, capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.strip() == "tasks ok", checked.stderr
    db = dom.ENV.new_db()
    assert db.call_tool("lend_book", '{"book_id": "b2", "member_id": "m1"}') == "Error: Emma is not available"
    assert db.call_tool("find_book", "{not json").startswith("Error: arguments are not JSON")


def test_the_guides_agent_runs_through_the_gateway_and_traces_show_it(domain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder, _, agent_module = domain
    turns = [
        ScriptedTurn(tool_calls=[ScriptedToolCall("find_book", '{"title": "Dune"}')]),
        ScriptedTurn(tool_calls=[ScriptedToolCall("lend_book", '{"book_id": "b1", "member_id": "m7"}')]),
        ScriptedTurn("Done: Dune is lent to you, m7."),
    ]
    with gateway_env(tmp_path, turns) as (store, gateway, _, url):
        (task,) = load_tasks(folder / "tasks.jsonl")[:1]
        (rollout,) = enqueue_tasks(store, [task])
        with Runner(store, agent_module.library_agent, gateway.url, workers=1) as runner:
            runner.run_until_done([rollout.rollout_id], timeout_s=60)
        assert store.get_rollout(rollout.rollout_id).state.value == "succeeded"
        (reward,) = store.list_rewards(rollout.rollout_id)
        assert reward.value == 1.0
        assert reward.metadata["parts"] == {"db_match": 1.0, "outputs_missing": 0.0}

        shown = CliRunner().invoke(app, ["traces", "show", rollout.rollout_id, "--store-url", url, "--json"])
        assert shown.exit_code == 0, shown.output
        data = json.loads(shown.stdout)
        assert [s["kind"] for s in data["spans"]].count("llm") == 3
        assert data["rewards"][0]["parts"]["db_match"] == 1.0
        assert data["messages"][-1]["content"] == "Done: Dune is lent to you, m7."
        assert [m["role"] for m in data["messages"]].count("tool") == 2
        assert data["trajectories"] and sum(t["sampled_tokens"] for t in data["trajectories"]) > 0


@pytest.mark.slow
def test_every_command_of_the_guide_runs(tmp_path: Path) -> None:
    folder = tmp_path / "empty-folder"
    folder.mkdir()
    write_guide_files(folder)
    script = "\n".join(BASH_BLOCK.findall(GUIDE.read_text(encoding="utf-8")))
    assert "agentforge train" in script and "agentforge traces show" in script
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    logs = {p.name: p.read_text()[-3000:] for p in folder.glob("*.log")}
    assert done.returncode == 0, (done.stdout[-4000:], done.stderr[-4000:], logs)
    summary = json.loads((folder / "train.json").read_text())
    assert summary, summary
    adapters = sorted((folder / "runs" / "library").rglob("adapter_config.json"))
    assert adapters, "no adapter was saved"


class _Customer:
    """A scripted customer with the simulator's interface (``respond``, ``done``)."""

    def __init__(self, replies: list[str]) -> None:
        self.replies, self.heard, self.done = list(replies), [], False

    def respond(self, agent_message: str) -> str:
        self.heard.append(agent_message)
        reply = self.replies.pop(0)
        self.done = not self.replies
        return reply


def test_the_guides_agent_talks_with_a_customer(domain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import functools

    folder, _, agent_module = domain
    turns = [
        ScriptedTurn("Which member are you?"),
        ScriptedTurn(tool_calls=[ScriptedToolCall("find_book", '{"title": "Dune"}')]),
        ScriptedTurn(tool_calls=[ScriptedToolCall("lend_book", '{"book_id": "b1", "member_id": "m7"}')]),
        ScriptedTurn("Done."),
    ]
    customer = _Customer(["I am m7.", "Thanks!"])
    with gateway_env(tmp_path, turns) as (store, gateway, _, _url):
        (task,) = load_tasks(folder / "tasks.jsonl")[:1]
        (rollout,) = enqueue_tasks(store, [task])
        agent = functools.partial(agent_module.library_agent, customer=customer)
        with Runner(store, agent, gateway.url, workers=1) as runner:
            runner.run_until_done([rollout.rollout_id], timeout_s=60)
        assert customer.heard == ["Which member are you?", "Done."] and customer.done
        assert [r.value for r in store.list_rewards(rollout.rollout_id)] == [1.0]


def test_the_guides_simulated_customer_talks_through_ctx_engine(domain, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Section 4: the customer's calls reach the engine the runner names (``ctx.engine``), never the store."""
    import library.customer

    from agentforge.runtime import EngineEndpoint
    from agentforge.testing import ScriptedUpstream

    folder = domain[0]
    turns = [
        ScriptedTurn("Which member are you?"),
        ScriptedTurn(tool_calls=[ScriptedToolCall("find_book", '{"title": "Dune"}')]),
        ScriptedTurn(tool_calls=[ScriptedToolCall("lend_book", '{"book_id": "b1", "member_id": "m7"}')]),
        ScriptedTurn("Done."),
    ]
    customer = ScriptedUpstream(["I am m7.", "Thanks! ###STOP###"])
    served = customer.serve()
    try:
        with gateway_env(tmp_path, turns) as (store, gateway, policy, _url):
            (task,) = load_tasks(folder / "tasks.jsonl")[:1]
            (rollout,) = enqueue_tasks(store, [task])
            engine = EngineEndpoint(f"{served.url}/v1", api_key="engine-key", model="base")
            agent = library.customer.library_agent_with_customer
            with Runner(store, agent, gateway.url, workers=1, engine=engine) as runner:
                runner.run_until_done([rollout.rollout_id], timeout_s=60)
            assert store.get_rollout(rollout.rollout_id).state.value == "succeeded"
            assert [r.value for r in store.list_rewards(rollout.rollout_id)] == [1.0]
            assert policy.served == 4 and customer.served == 2
            assert all(r.headers.get("authorization") == "Bearer engine-key" for r in customer.requests)
            spans = [s for s in store.list_spans(rollout.rollout_id) if s.kind.value == "llm"]
            assert len(spans) == 4  # the policy's calls only: the customer's were never recorded
            heard = " ".join(str(m.get("content")) for m in customer.requests[-1].body["messages"])
            assert "Which member are you?" in heard and "Done." in heard
    finally:
        served.stop()
    store = memory_store()  # a runner not given the engine: the agent says what to do
    (rollout,) = enqueue_tasks(store, [task])
    with Runner(store, agent, "http://127.0.0.1:9", workers=1) as runner:
        runner.run_until_done([rollout.rollout_id], timeout_s=60)
    assert "no engine address" in str(store.get_rollout(rollout.rollout_id).error)
