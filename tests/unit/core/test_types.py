"""The rollout state machine and the cross-boundary objects."""

from __future__ import annotations

import math

import pytest

from agentforge.errors import InvalidTransitionError, UserError
from agentforge.types import ROLLOUT_TRANSITIONS, ResourceVersion, Reward, RolloutState, check_transition


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
