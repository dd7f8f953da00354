"""The τ task format as docs/new_domain.md ("The task format, precisely") states it, rule by rule, on a real env."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agentforge.agents.customer_service.rewards import tau_reward_details
from agentforge.errors import UserError
from agentforge.runtime import load_tasks
from agentforge.types import Task

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "new_domain.md"


class _DB:
    def __init__(self) -> None:
        self.stock = {"a": 1, "b": 1}

    def call_tool(self, name: str, arguments: dict[str, Any] | str) -> str:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments)
        if name == "take" and self.stock.get(args.get("item"), 0) > 0:
            self.stock[args["item"]] -= 1
            return "ok"
        if name == "look":
            return json.dumps(self.stock)
        return "Error: cannot"

    def db_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.stock, sort_keys=True).encode()).hexdigest()


class _Env:
    def new_db(self) -> _DB:
        return _DB()


ENV = _Env()


def _task(actions: Any = (), outputs: Any = None, **extra: Any) -> Task:
    metadata: dict[str, Any] = {"dataset": "shop_v1", **extra}
    if actions is not None:
        metadata["actions"] = list(actions)
    if outputs is not None:
        metadata["outputs"] = outputs
    return Task(input={"instruction": "x"}, metadata=metadata)


def _said(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": t} for t in texts]


def test_the_guide_has_the_section() -> None:
    assert "### The task format, precisely" in GUIDE.read_text(encoding="utf-8")


def test_only_input_is_required_and_the_reward_reads_metadata(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"input": {"instruction": "hi"}, "metadata": {"actions": [], "outputs": ["hello"]}}\n')
    (task,) = load_tasks(path)
    assert task.task_id  # generated
    assert tau_reward_details(ENV.new_db(), task, _said("Hello!"), env=ENV).reward == 1.0
    with pytest.raises(UserError, match="actions"):
        tau_reward_details(ENV.new_db(), _task(actions=None), [], env=ENV)


def test_actions_replay_with_kwargs_or_arguments_and_only_the_final_state_counts() -> None:
    gold = _task([{"name": "take", "kwargs": {"item": "a"}}, {"name": "take", "arguments": {"item": "b"}}])
    db = ENV.new_db()
    for item in ("b", "a"):  # another order, plus a read and a failed write
        db.call_tool("take", json.dumps({"item": item}))
    db.call_tool("look", "{}")
    db.call_tool("take", '{"item": "a"}')  # out of stock: "Error: cannot", no change
    result = tau_reward_details(db, gold, [], env=ENV)
    assert result.db_match and result.reward == 1.0
    assert not tau_reward_details(ENV.new_db(), gold, [], env=ENV).db_match


def test_outputs_are_lowercased_comma_free_substrings_of_one_assistant_text() -> None:
    def missing(outputs: list[str], messages: Any) -> list[str]:
        return tau_reward_details(ENV.new_db(), _task([], outputs), messages, env=ENV).missing_outputs

    assert missing(["1093.34"], _said("That is $1,093.34.")) == []
    assert missing(["Not available"], _said("it is NOT AVAILABLE")) == []
    assert missing(["$1093"], _said("1093 dollars")) == ["$1093"]  # only case and commas are normalised
    assert missing(["12"], _said("order 112")) == []  # a substring, not a word
    assert missing(["red", "blue"], _said("red one", "and blue")) == []  # each output on its own
    assert missing(["red blue"], _said("red", "blue")) == ["red blue"]  # never across two messages
    parts = [{"role": "assistant", "content": [{"type": "text", "text": "Blue"}]}]
    assert (
        missing(["blue"], parts) == []
        and missing(["blue"], ["blue"]) == []
        and missing(["blue"], [{"content": "blue"}]) == []
    )
    others = [
        {"role": "system", "content": "blue"},
        {"role": "user", "content": "blue"},
        {"role": "tool", "tool_call_id": "c", "content": "blue"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "look", "arguments": "blue"}}
            ],
        },
    ]
    assert missing(["blue"], others) == ["blue"]
    assert (
        missing([], []) == [] and tau_reward_details(ENV.new_db(), _task([], None), [], env=ENV).reward == 1.0
    )


def test_the_reward_is_all_or_nothing_and_the_dataset_guards_the_default_env() -> None:
    gold = _task([{"name": "take", "kwargs": {"item": "a"}}], ["done"])
    db = ENV.new_db()
    db.call_tool("take", {"item": "a"})
    assert tau_reward_details(db, gold, _said("done"), env=ENV).reward == 1.0
    assert (
        tau_reward_details(db, gold, _said("finished"), env=ENV).reward == 0.0
    )  # db matches, output missing
    assert (
        tau_reward_details(ENV.new_db(), gold, _said("done"), env=ENV).reward == 0.0
    )  # said it, did not do it
    with pytest.raises(UserError, match="shop_v1"):
        tau_reward_details(db.db_hash(), gold, _said("done"))
