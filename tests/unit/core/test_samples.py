"""Token-exact sample building: the merge rule, masks and validation (issue 4 handed cases 1-3)."""

from __future__ import annotations

import pytest

from agentforge.errors import UserError
from agentforge.trainers.samples import SampleValidationError, build_trajectories, to_rollout_func_output
from agentforge.types import LLMCall, Span, SpanKind


def _llm(seq: int, prompt: list[int], completion: list[int], **kw: object) -> Span:
    logprobs = kw.pop("logprobs", [-0.5] * len(completion))
    call = LLMCall(
        prompt_token_ids=prompt, completion_token_ids=completion, logprobs=logprobs, version="policy@v1", **kw
    )
    return Span(rollout_id="ro-1", kind=SpanKind.llm, llm=call, sequence=seq)


def test_continuing_calls_merge_and_tool_tokens_are_masked() -> None:
    turn1 = _llm(1, [1, 2, 3], [10, 11])
    tool = Span(rollout_id="ro-1", kind=SpanKind.tool, sequence=2)
    turn2 = _llm(3, [1, 2, 3, 10, 11, 50, 51, 52], [12, 13, 14])
    (traj,) = build_trajectories([turn2, tool, turn1])  # order comes from sequence
    assert traj.prompt_ids == [1, 2, 3]
    assert traj.completion_ids == [10, 11, 50, 51, 52, 12, 13, 14]
    assert traj.env_mask == [1, 1, 0, 0, 0, 1, 1, 1]
    assert traj.logprobs == [-0.5, -0.5, 0.0, 0.0, 0.0, -0.5, -0.5, -0.5]
    assert traj.sampled_tokens == 5
    assert len(traj.completion_ids) == len(traj.logprobs) == len(traj.env_mask)


def test_template_that_strips_earlier_reasoning_starts_a_new_trajectory_verbatim() -> None:
    # Turn 1 sampled "<think>..</think>answer" (ids 20..24); the template drops the think part from history,
    # so turn 2's prompt is not a continuation. It must not be re-wrapped: a second trajectory, ids verbatim.
    think_prompt = [1, 2, 90]  # 90 = "<think>" opened by the template in the prompt
    turn1 = _llm(1, think_prompt, [20, 21, 22, 23, 24])
    turn2 = _llm(2, [1, 2, 24, 7, 8, 90], [30, 31])
    first, second = build_trajectories([turn1, turn2])
    assert first.ids == [1, 2, 90, 20, 21, 22, 23, 24] and first.env_mask == [1] * 5
    assert second.prompt_ids == [1, 2, 24, 7, 8, 90] and second.completion_ids == [30, 31]


def test_shorter_rerender_after_tool_call_keeps_lengths_equal() -> None:
    # Re-rendering after the tool call yields K fewer tokens than recorded: not a prefix → new trajectory;
    # every trajectory still has equal-length ids, mask and logprobs.
    turn1 = _llm(1, [1, 2, 3], [10, 11, 12, 13])
    turn2 = _llm(2, [1, 2, 3, 10, 11, 60, 61], [14])  # the recorded 12, 13 were dropped by the template
    trajs = build_trajectories([turn1, turn2])
    assert len(trajs) == 2
    for t in trajs:
        assert len(t.completion_ids) == len(t.logprobs) == len(t.env_mask)


def test_missing_ids_or_logprobs_is_a_clear_validation_error() -> None:
    no_ids = Span(rollout_id="ro-1", kind=SpanKind.llm, llm=LLMCall(trainable=False, flags=["no_token_ids"]))
    with pytest.raises(SampleValidationError, match="no engine token ids"):
        build_trajectories([no_ids])
    short = _llm(1, [1], [5, 6], logprobs=[-1.0])
    with pytest.raises(SampleValidationError, match="1 logprobs for 2 completion tokens"):
        build_trajectories([short])


def test_failed_and_non_llm_spans_are_ignored_and_truncation_is_recorded() -> None:
    failed = _llm(1, [1], [2])
    failed.status = "error"
    ok = _llm(2, [1, 2], [3], finish_reason="length")
    (traj,) = build_trajectories([failed, ok])
    assert traj.truncated and traj.span_ids == [ok.span_id]


def test_rollout_func_output_shape() -> None:
    trajs = build_trajectories([_llm(1, [1, 2], [3, 4])])
    out = to_rollout_func_output(trajs, [0.5], task=["t1"])
    assert out["prompt_ids"] == [[1, 2]] and out["completion_ids"] == [[3, 4]] and out["env_mask"] == [[1, 1]]
    assert out["reward"] == [0.5] and out["version"] == ["policy@v1"] and out["task"] == ["t1"]
    with pytest.raises(UserError, match="2 entries for 1 trajectories"):
        to_rollout_func_output(trajs, [0.5, 1.0])
