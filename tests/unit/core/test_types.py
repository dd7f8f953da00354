"""The rollout state machine and the cross-boundary objects."""

from __future__ import annotations

import math

import pytest

from agentforge.errors import InvalidTransitionError, UserError
from agentforge.types import (
    ROLLOUT_TRANSITIONS,
    ResourceVersion,
    Reward,
    RolloutState,
    Span,
    Version,
    check_transition,
    new_ordered_id,
    parse_version_number,
    rollout_base_url,
)


def test_every_state_has_a_row_and_terminal_states_have_no_exit() -> None:
    assert set(ROLLOUT_TRANSITIONS) == set(RolloutState)
    assert ROLLOUT_TRANSITIONS[RolloutState.succeeded] == frozenset()
    assert ROLLOUT_TRANSITIONS[RolloutState.cancelled] == frozenset()


@pytest.mark.parametrize(
    ("current", "target"),
    [("queued", "running"), ("running", "succeeded"), ("running", "queued"), ("failed", "queued")],
)
def test_allowed_transitions(current: str, target: str) -> None:
    check_transition(RolloutState(current), RolloutState(target))


def test_forbidden_transition_names_both_states_and_the_allowed_ones() -> None:
    with pytest.raises(InvalidTransitionError) as info:
        check_transition(RolloutState.succeeded, RolloutState.running)
    assert "succeeded" in str(info.value) and "running" in str(info.value) and "terminal" in str(info.value)
    assert isinstance(info.value, UserError)


def test_nan_reward_is_kept_as_invalid_not_a_number() -> None:
    reward = Reward(rollout_id="ro-1", value=math.nan)
    assert reward.value is None and not reward.valid
    assert Reward(rollout_id="ro-1", value=0.7).valid


def test_resource_ref() -> None:
    assert ResourceVersion(name="policy", version=8).ref == "policy@v8"


@pytest.mark.parametrize("spelling", [3, "3", "v3", " policy@v3 ", Version("policy", 3)])
def test_every_version_spelling_parses_to_one_version(spelling: object) -> None:
    version = Version.parse(spelling, name="policy")  # type: ignore[arg-type]
    assert version == Version("policy", 3) and str(version) == "policy@v3"
    assert Version.parse(str(version)) == version and parse_version_number(spelling) == 3  # type: ignore[arg-type]
    assert ResourceVersion(name="policy", version=3).ref == str(version)


def test_version_errors_name_the_fix() -> None:
    with pytest.raises(UserError, match="names no resource; write it as name@v3"):
        Version.parse("v3")
    with pytest.raises(UserError, match="names 'other', not 'policy'"):
        Version.parse("other@v3", name="policy")
    with pytest.raises(UserError, match="names 'other', not 'policy'"):
        parse_version_number(Version("other", 3), name="policy", default=0)  # a default never hides this
    for bad in ("latest", "v²", "1" * 10, -1):
        with pytest.raises(UserError):
            parse_version_number(bad)  # type: ignore[arg-type]
    assert parse_version_number("policy", default=0) == 0  # the bare alias a span records for the base model
    assert parse_version_number("", default=0) == 0 and parse_version_number("policy@v7", default=0) == 7
    assert Version("policy", 2) < Version("policy", 10)  # numbers compare as integers, not text


def test_rollout_base_url_is_the_gateway_prefix() -> None:
    assert rollout_base_url("http://127.0.0.1:8000/", "ro-1") == "http://127.0.0.1:8000/rollouts/ro-1/v1"


def test_span_ids_sort_by_creation_time_and_stay_unique(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([1000.0, 1000.0, 1000.001, 2000.0])
    monkeypatch.setattr("agentforge.types.time.time", lambda: next(clock))
    ids = [new_ordered_id("sp") for _ in range(4)]
    assert all(i.startswith("sp-") and len(i) == 3 + 28 for i in ids)
    assert ids[0] != ids[1] and ids[0][:15] == ids[1][:15]  # same millisecond: same head, random tail
    assert ids[1][:15] < ids[2][:15] < ids[3][:15]  # later milliseconds sort later
    monkeypatch.undo()
    assert (
        Span(rollout_id="ro-1", name="x").span_id.startswith("sp-")
        and len({new_ordered_id("sp") for _ in range(1000)}) == 1000
    )
