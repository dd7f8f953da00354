"""Reward scorers: τ-bench reward, triage exact match, their TRL shapes, and the intent data loaders."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from prerequisites import load_data

from agentforge.agents.customer_service.datasets import (
    ESCALATE,
    bitext_triage_tasks,
    intent_labels,
    load_banking77,
    load_bitext,
    load_clinc150,
)
from agentforge.agents.customer_service.rewards import (
    TriagePrediction,
    entity_match,
    gold_of,
    intent_match,
    intent_reward_func,
    make_tau_reward_func,
    make_triage_reward_func,
    normalize_entity,
    normalize_intent,
    outputs_found,
    parse_triage,
    tau_reward,
    tau_reward_details,
    tau_reward_func,
    triage_reward,
    triage_reward_func,
)
from agentforge.agents.customer_service.tau_retail import load_tau_retail
from agentforge.errors import UserError
from agentforge.rewards import completion_text


@pytest.fixture(scope="module")
def env():
    return load_data(load_tau_retail)


@pytest.fixture(scope="module")
def task_with_outputs(env):
    task = next(
        t
        for t in env.tasks("test")
        if t.metadata["outputs"]
        and any(
            a["name"] in ("cancel_pending_order", "modify_pending_order_items") for a in t.metadata["actions"]
        )
    )
    db = env.new_db()
    for action in task.metadata["actions"]:
        db.call_tool(action["name"], action["kwargs"])
    return task, db


# -- τ reward ---------------------------------------------------------------------------------------


def test_tau_reward_needs_db_and_outputs(env, task_with_outputs):
    task, db = task_with_outputs
    outputs = task.metadata["outputs"]
    said = [{"role": "assistant", "content": f"Noted: {o.upper()}"} for o in outputs]
    assert tau_reward(db, task, said) == 1.0
    assert tau_reward(db.db_hash(), task, said, env=env) == 1.0  # by hash
    assert tau_reward(db, task.model_dump(), said) == 1.0  # a dumped Task works too
    assert tau_reward(env.new_db(), task, said) == 0.0  # the agent did nothing
    result = tau_reward_details(db, task, said[1:])
    assert result.reward == 0.0 and result.db_match and result.missing_outputs == outputs[:1]
    # only the agent's turns count: a user or tool message saying the output does not
    as_user = [{"role": "user", "content": o} for o in outputs] + [
        {"role": "tool", "content": " ".join(outputs)}
    ]
    assert tau_reward(db, task, as_user) == 0.0


def test_outputs_are_case_insensitive_and_ignore_commas():
    assert outputs_found(["1093.34", "Suite 356"], ["Your refund is $1,093.34 to SUITE 356."]) == []
    assert outputs_found(["1093.34"], ["Your refund is $1093.3"]) == ["1093.34"]
    assert outputs_found(["a"], [{"role": "assistant", "content": [{"type": "text", "text": "A"}]}]) == []
    assert outputs_found(["a"], [{"role": "assistant", "content": None, "tool_calls": []}]) == ["a"]
    with pytest.raises(UserError, match="agent_messages"):
        outputs_found(["a"], 42)


def test_gold_of_accepts_raw_tasks_and_rejects_others():
    raw = {"user_id": "u", "actions": [{"name": "think", "kwargs": {"thought": ""}}], "outputs": ["x"]}
    assert gold_of(raw) == (raw["actions"], ["x"])
    with pytest.raises(UserError, match="gold 'actions'"):
        gold_of({"instruction": "no gold"})
    with pytest.raises(UserError):
        gold_of("task")


def test_tau_reward_func_has_trl_shape(env, task_with_outputs):
    task, db = task_with_outputs
    good = [{"role": "assistant", "content": " ".join(task.metadata["outputs"])}]
    completions = [good, good, "nothing useful", good, 17]
    scores = tau_reward_func(
        completions,
        task=[task, task, task, None, task],
        db_hash=[db.db_hash(), env.new_db().db_hash(), db.db_hash(), db.db_hash(), db.db_hash()],
        prompts=["p"] * 5,
        completion_ids=[[1]] * 5,
        trainer_state=None,
    )
    assert scores == [1.0, 0.0, 0.0, None, None]  # no task / unsupported completion -> None (masked)
    assert tau_reward_func([good], task=[task], db_hash=[None]) == [None]  # rollout without a database
    assert make_tau_reward_func(env)([good], task=[task], db=[db]) == [1.0]
    assert tau_reward_func.__name__ == "tau_reward"
    with pytest.raises(UserError, match="one entry per completion"):
        tau_reward_func([good, good], task=[task], db_hash=[db.db_hash()])
    with pytest.raises(UserError, match="needs the kwargs"):
        tau_reward_func([good], task=[task])


class _CounterDB:
    """A tiny domain of its own: one counter, one tool."""

    def __init__(self) -> None:
        self.count = 0

    def call_tool(self, name, arguments):
        self.count += int(arguments.get("by", 1))
        return str(self.count)

    def db_hash(self) -> str:
        return f"count={self.count}"


class _CounterEnv:
    def new_db(self) -> _CounterDB:
        return _CounterDB()


def test_tau_reward_of_another_domain_needs_its_env(env):
    task = {"actions": [{"name": "increment", "kwargs": {"by": 2}}], "outputs": []}
    db = _CounterDB()
    db.call_tool("increment", {"by": 2})
    assert tau_reward(db, task, env=_CounterEnv()) == 1.0  # with its env: scored in its own domain
    with pytest.raises(UserError, match="env=.*CounterDB"):  # forgetting env=: an error, not a silent 0.0
        tau_reward(db, task)
    with pytest.raises(UserError, match="increment"):  # by hash: the unknown tool gives it away
        tau_reward(db.db_hash(), task)
    with pytest.raises(UserError, match="dataset 'counter_v1'"):
        tau_reward("hash", {"actions": [], "metadata": {}, "dataset": "counter_v1"})
    with pytest.raises(UserError, match="make_tau_reward_func"):
        make_tau_reward_func()([[{"role": "assistant", "content": "ok"}]], task=[task], db=[db])
    assert make_tau_reward_func(_CounterEnv())(
        [[{"role": "assistant", "content": "ok"}]], task=[task], db=[db]
    ) == [1.0]


# -- triage -----------------------------------------------------------------------------------------


def test_intent_normalisation():
    assert normalize_intent("  Cancel Order. ") == "cancel_order"
    assert normalize_intent("cancel-order") == normalize_intent("CANCEL__ORDER") == "cancel_order"
    assert normalize_intent('"track_refund"') == "track_refund"
    assert normalize_intent("oos") == normalize_intent("Out of scope") == ESCALATE
    assert intent_match("Track Order", "track_order") == 1.0
    assert intent_match("track_refund", "track_order") == 0.0
    assert intent_match(None, "track_order") == 0.0
    assert intent_match("oos", "escalate") == 1.0
    with pytest.raises(UserError, match="gold label"):
        intent_match("x", "")


def test_entity_normalisation_keeps_digits_exact():
    assert normalize_entity(" #W2378156. ") == normalize_entity("w2378156") == "W2378156"
    assert entity_match("00123842", "00123842") == 1.0
    assert entity_match("123842", "00123842") == 0.0  # leading zeros are part of the id
    assert entity_match(None, None) == entity_match("none", None) == 1.0
    assert entity_match("123", None) == 0.0 and entity_match(None, "123") == 0.0
    assert normalize_entity(123842) == "123842"


def test_triage_reward_weights():
    assert triage_reward("cancel_order", "#123", "cancel_order", "123") == 1.0
    assert triage_reward("cancel_order", "999", "cancel_order", "123") == 0.5
    assert triage_reward("track_order", "123", "cancel_order", "123") == 0.5
    assert triage_reward("track_order", None, "cancel_order", "123") == 0.0
    assert triage_reward("cancel_order", "999", "cancel_order", "123", intent_weight=0.8) == pytest.approx(
        0.8
    )
    with pytest.raises(UserError, match=r"intent_weight must be in \[0, 1\], got 2"):
        triage_reward("a", None, "a", None, intent_weight=2)


def test_parse_triage_formats():
    assert parse_triage("intent: Cancel Order\norder_id: #00123842") == TriagePrediction(
        "cancel_order", "00123842"
    )
    assert parse_triage("intent: track_order\norder_id: none") == TriagePrediction("track_order", None)
    assert parse_triage('Sure! {"intent": "get_refund", "order_id": "42"} done') == TriagePrediction(
        "get_refund", "42"
    )
    assert parse_triage("  track_refund\n") == TriagePrediction("track_refund")
    assert parse_triage("oos") == TriagePrediction(ESCALATE)
    assert parse_triage("I think you want to cancel, maybe?") is None
    assert parse_triage("") is None and parse_triage(None) is None
    assert parse_triage("banana", labels=["cancel_order"]) is None
    assert parse_triage("Cancel Order", labels=["cancel_order"]) == TriagePrediction("cancel_order")


def test_triage_reward_funcs_have_trl_shape():
    completions = [
        "intent: cancel_order\norder_id: 00123842",
        [{"role": "assistant", "content": "intent: cancel_order\norder_id: 123842"}],
        "I am not sure what you mean, could you rephrase please?",
        "intent: track_order",
        42,
        "intent: track_order",
    ]
    gold = {
        "intent": ["cancel_order", "cancel_order", "cancel_order", "track_order", "track_order", None],
        "order_id": ["00123842", "00123842", None, None, None, None],
    }
    scores = triage_reward_func(completions, prompts=["p"] * 6, completion_ids=[[0]] * 6, **gold)
    assert scores == [1.0, 0.5, None, 1.0, None, None]  # unparseable, unsupported, no gold -> None
    assert len(scores) == len(completions)
    assert make_triage_reward_func(unparseable=0.0)(
        completions[:3], **{k: v[:3] for k, v in gold.items()}
    ) == [1.0, 0.5, 0.0]
    assert intent_reward_func(["oos", "balance"], intent=["escalate", "transfer"]) == [1.0, 0.0]
    assert triage_reward_func.__name__ == "triage_reward" and intent_reward_func.__name__ == "intent_reward"
    with pytest.raises(UserError, match="one gold value per completion"):
        triage_reward_func(["x"], intent=["a", "b"], order_id=[None])
    with pytest.raises(UserError, match="'order_id'"):
        triage_reward_func(["x"], intent=["a"])
    assert completion_text([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]) == "a"


def test_importing_rewards_loads_no_data_and_no_torch():
    code = (
        "import sys, agentforge.rewards, agentforge.agents.customer_service.rewards;"
        "print('torch' in sys.modules, any('tau_retail' in m for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# -- intent data sets -------------------------------------------------------------------------------


def test_bitext_loader_uses_the_entity_span():
    tasks = load_data(load_bitext)
    assert len(tasks) == 4514 and len({t.metadata["intent"] for t in tasks}) == 27
    row = tasks[1]  # upstream entity_value 4587345 lost the zeros of the span 00004587345
    assert row.input["text"] == "can you help me canceling purchase 00004587345?"
    assert row.metadata["order_id"] == "00004587345" and row.metadata["intent"] == "cancel_order"
    assert sum(t.metadata["order_id"] is not None for t in tasks) == 473
    train, test = load_bitext("train"), load_bitext("test")
    assert len(train) + len(test) == 4514 and 300 < len(test) < 600
    assert not {t.input["text"] for t in train} & {t.input["text"] for t in test}


def test_bitext_triage_tasks_balanced_training_set():
    natural, held_out = load_data(bitext_triage_tasks, 800, 150)
    balanced, held_out_b = bitext_triage_tasks(800, 150, balanced=True)
    counts = Counter(t.metadata["label"] for t in balanced)
    assert len(balanced) == 800 and len(counts) == 11 and max(counts.values()) - min(counts.values()) <= 1
    assert Counter(t.metadata["label"] for t in natural).most_common(1)[0][1] > 150  # skewed: account
    assert [t.task_id for t in held_out_b] == [t.task_id for t in held_out]  # evaluation unchanged
    assert not {t.task_id for t in balanced} & {t.task_id for t in held_out}
    assert [t.task_id for t in bitext_triage_tasks(800, 150, balanced=True)[0]] == [
        t.task_id for t in balanced
    ]
    # More than the smallest category holds: the others fill up, nothing repeats.
    everything = bitext_triage_tasks(10_000, 1, balanced=True)[0]
    assert len(everything) == len({t.task_id for t in everything}) == len(load_bitext("train"))


def test_banking77_loader():
    train, test = load_data(load_banking77, "train"), load_data(load_banking77, "test")
    assert (len(train), len(test)) == (10003, 3080)
    assert train[0].metadata == {
        "dataset": "banking77",
        "split": "train",
        "index": 0,
        "intent": "card_arrival",
    }
    assert len(intent_labels("banking77")) == 77


def test_clinc150_out_of_scope_is_escalate():
    train = load_data(load_clinc150, "train")
    assert len(train) == 15100
    oos = [t for t in train if t.metadata["raw_intent"] == "oos"]
    assert len(oos) == 100 and {t.metadata["intent"] for t in oos} == {ESCALATE}
    assert all(t.metadata["domain"] is None for t in oos)
    assert len(load_clinc150("test", include_oos=False)) == 4500
    labels = intent_labels("clinc150")
    assert len(labels) == 151 and ESCALATE in labels and "oos" not in labels
    assert intent_reward_func(["oos"], intent=[oos[0].metadata["intent"]]) == [1.0]


def test_intent_data_missing_is_a_clear_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTFORGE_DATA_DIR", str(tmp_path))
    with pytest.raises(UserError, match="CLINC150 data not found at .*clinc150; set AGENTFORGE_DATA_DIR"):
        load_clinc150()
    with pytest.raises(UserError, match="Banking77 data not found"):
        load_banking77("test", data_dir=tmp_path)
    with pytest.raises(UserError, match="split must be"):
        load_banking77("dev")
    with pytest.raises(UserError, match="unknown intent data set"):
        intent_labels("imdb")
