"""The group LLM judge: rankings parsed and mapped back through the shuffle, ties, failures → None, TRL shape.

Every judge call goes to a served :class:`ScriptedUpstream` (a real port, the real ``openai`` client).
"""

from __future__ import annotations

import logging
import string
from collections.abc import Iterator

import pytest

from agentforge.errors import ConfigError, UserError
from agentforge.rewards import GroupJudge, make_group_judge_reward_func, parse_ranking, rank_rewards
from agentforge.testing import ScriptedError, ScriptedTurn, ScriptedUpstream

TASK = "Refund order #W123 for the customer."
CANDIDATES = ["I refunded order #W123.", "No.", "I refunded #W123 and emailed you the receipt."]


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    fake = ScriptedUpstream(model="judge")
    server = fake.serve()
    fake.base_url = f"{server.url}/v1"
    yield fake
    server.stop()


def make_judge(upstream: ScriptedUpstream, **kwargs: object) -> GroupJudge:
    return GroupJudge(upstream.base_url, "judge", criteria="Helpful and correct.", max_retries=0, **kwargs)  # type: ignore[arg-type]


def labels_for(judge: GroupJudge, task: str, candidates: list[str]) -> dict[int, str]:
    """Candidate index → the label the judge sees it under."""
    order = judge.presentation_order(task, candidates)
    return {index: string.ascii_uppercase[k] for k, index in enumerate(order)}


def shuffled_judge(upstream: ScriptedUpstream) -> GroupJudge:
    """A judge whose seed really permutes CANDIDATES (so mapping back is tested, not the identity)."""
    for seed in range(50):
        judge = make_judge(upstream, seed=seed)
        if judge.presentation_order(TASK, CANDIDATES) != [0, 1, 2]:
            return judge
    raise AssertionError("no seed in 0..49 shuffles three candidates")


def test_ranking_is_mapped_back_through_the_shuffle(upstream: ScriptedUpstream) -> None:
    judge = shuffled_judge(upstream)
    lab = labels_for(judge, TASK, CANDIDATES)
    upstream.add(f"{lab[2]} > {lab[0]} > {lab[1]}")  # best: candidate 2, worst: candidate 1

    result = judge.judge(TASK, CANDIDATES)

    assert result.rewards == [0.5, 0.0, 1.0] and result.error is None
    assert result.ranking == [[2], [0], [1]]
    (request,) = upstream.requests
    body = request.body
    assert body["model"] == "judge" and body["temperature"] == 0 and body["seed"] == judge.seed
    system, user = body["messages"]
    assert "Helpful and correct." in system["content"]
    assert user["content"].startswith(f"Task:\n{TASK}")
    for index, text in enumerate(CANDIDATES):  # each candidate under its shuffled label
        assert f"Candidate {lab[index]}:\n{text}" in user["content"]


def test_same_group_same_order_and_groups_get_different_orders(upstream: ScriptedUpstream) -> None:
    judge = make_judge(upstream)
    assert judge.presentation_order(TASK, CANDIDATES) == judge.presentation_order(TASK, CANDIDATES)
    orders = {tuple(judge.presentation_order(f"task {i}", ["w", "x", "y", "z"])) for i in range(20)}
    assert len(orders) > 3  # shuffled per group, not one fixed permutation


def test_ties_share_the_mean_of_their_positions(upstream: ScriptedUpstream) -> None:
    judge = shuffled_judge(upstream)
    lab = labels_for(judge, TASK, CANDIDATES)
    upstream.add(f"{lab[2]} = {lab[0]} > {lab[1]}", f"{lab[1]} = {lab[0]} = {lab[2]}")

    assert judge.rank(TASK, CANDIDATES) == [0.75, 0.0, 0.75]
    assert judge.rank(TASK, CANDIDATES) == [0.5, 0.5, 0.5]


def test_reasoning_then_ranking_and_json_answers(upstream: ScriptedUpstream) -> None:
    judge = shuffled_judge(upstream)
    lab = labels_for(judge, TASK, CANDIDATES)
    upstream.add(
        f"<think>{lab[1]} > {lab[0]}</think>Candidate {lab[1]} refuses. Final ranking: "
        f"**{lab[0]}** > **{lab[2]}** > **{lab[1]}**",
        f'{{"ranking": ["{lab[2]}", ["{lab[0]}", "{lab[1]}"]]}}',
    )
    assert judge.rank(TASK, CANDIDATES) == [1.0, 0.0, 0.5]
    assert judge.rank(TASK, CANDIDATES) == [0.25, 0.25, 1.0]


@pytest.mark.parametrize(
    "answer",
    ["They are all fine.", "A > B", "A > A > B", "A > B > C > D", '["A", "B"]', ""],
    ids=["prose", "incomplete", "duplicate", "unknown-label", "json-incomplete", "empty"],
)
def test_unreadable_answer_gives_none_for_the_group(
    upstream: ScriptedUpstream, answer: str, caplog: pytest.LogCaptureFixture
) -> None:
    judge = make_judge(upstream)
    upstream.add(answer)
    with caplog.at_level(logging.WARNING, logger="agentforge.rewards"):
        result = judge.judge(TASK, CANDIDATES)
    assert result.rewards == [None, None, None] and result.ranking == []
    assert result.error is not None and result.error.startswith("unparseable judge answer")
    assert result.answer == answer and judge.failures == 1
    assert "not scored (None)" in caplog.text


def test_upstream_error_gives_none_for_the_group(
    upstream: ScriptedUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    judge = make_judge(upstream)
    upstream.add(ScriptedTurn(error=ScriptedError(status=503, message="judge overloaded")))
    with caplog.at_level(logging.WARNING, logger="agentforge.rewards"):
        result = judge.judge(TASK, CANDIDATES)
    assert result.rewards == [None, None, None]
    assert result.error is not None and "judge overloaded" in result.error
    assert "judge overloaded" in caplog.text and judge.failures == 1


def test_unreachable_judge_gives_none() -> None:
    server = ScriptedUpstream(model="judge").serve()
    url = f"{server.url}/v1"
    server.stop()  # nothing listens there any more
    judge = GroupJudge(url, "judge", max_retries=0, timeout_s=5)
    assert judge.rank(TASK, CANDIDATES) == [None, None, None]


def test_group_size_and_argument_checks(upstream: ScriptedUpstream) -> None:
    judge = make_judge(upstream)
    with pytest.raises(UserError, match="2 to 26"):
        judge.rank(TASK, ["only one"])
    with pytest.raises(UserError, match="2 to 26"):
        judge.rank(TASK, ["x"] * 27)
    with pytest.raises(ConfigError, match="max_tokens=0"):
        GroupJudge(upstream.base_url, "judge", max_tokens=0)
    with pytest.raises(ConfigError, match="group_size=1"):
        make_group_judge_reward_func(judge, 1)
    assert upstream.requests == []


def test_parse_ranking_and_rank_rewards() -> None:
    assert parse_ranking("B > A > C", "ABC") == [["B"], ["A"], ["C"]]
    assert parse_ranking("[B] >> [C] = [A]", "ABC") == [["B"], ["C", "A"]]
    assert parse_ranking('Sure: ["c", "a", "b"]', "ABC") == [["C"], ["A"], ["B"]]
    assert parse_ranking("A > B, then C > A > B", "ABC") == [["C"], ["A"], ["B"]]  # last complete one
    assert parse_ranking("B < A < C", "ABC") is None
    assert rank_rewards([[1], [0]], 2) == [0.0, 1.0]
    assert rank_rewards([[0, 1, 2, 3]], 4) == [0.5] * 4
    assert rank_rewards([[3], [0, 2], [1]], 4) == [0.5, 0.0, 0.5, 1.0]


def _conversational(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_reward_func_ranks_each_consecutive_group(upstream: ScriptedUpstream) -> None:
    judge = make_judge(upstream)
    func = make_group_judge_reward_func(judge, group_size=3)
    prompts = [[{"role": "user", "content": "task one"}]] * 3 + [
        [{"role": "user", "content": "task two"}]
    ] * 3
    completions = [_conversational(t) for t in ["a1", "a2", "a3", "b1", "b2", "b3"]]
    first = labels_for(judge, "user: task one", ["a1", "a2", "a3"])
    second = labels_for(judge, "user: task two", ["b1", "b2", "b3"])
    upstream.add(f"{first[1]} > {first[2]} > {first[0]}", f"{second[0]} > {second[1]} > {second[2]}")

    scores = func(completions, prompts=prompts, completion_ids=[[1]] * 6)

    assert func.__name__ == "group_judge"
    assert scores == [0.0, 1.0, 0.5, 1.0, 0.5, 0.0]
    one, two = (r.body["messages"][1]["content"] for r in upstream.requests)
    assert "task one" in one and "a1" in one and "b1" not in one
    assert "task two" in two and "b3" in two and "a3" not in two


def test_reward_func_masks_bad_completions_and_failed_groups(upstream: ScriptedUpstream) -> None:
    judge = make_judge(upstream)
    func = make_group_judge_reward_func(judge, group_size=3)
    prompts = ["p1"] * 3 + ["p2"] * 3
    completions: list[object] = ["x", 42, "z", "u", "v", "w"]  # 42: not a completion
    lab = labels_for(judge, "p1", ["x", "z"])
    upstream.add(f"{lab[1]} > {lab[0]}", "no idea")

    assert func(completions, prompts=prompts) == [0.0, None, 1.0, None, None, None]
    assert "42" not in upstream.requests[0].body["messages"][1]["content"]


def test_reward_func_rejects_the_wrong_layout(upstream: ScriptedUpstream) -> None:
    func = make_group_judge_reward_func(make_judge(upstream), group_size=3)
    with pytest.raises(UserError, match="not a multiple of group_size=3"):
        func(["a"] * 5, prompts=["p"] * 5)
    with pytest.raises(UserError, match="'prompts'"):
        func(["a"] * 3)
    with pytest.raises(UserError, match="'prompts'"):
        func(["a"] * 3, prompts=["p"] * 2)
    with pytest.raises(UserError, match="different prompts"):
        func(["a"] * 3, prompts=["p", "p", "q"])
    assert upstream.requests == []
