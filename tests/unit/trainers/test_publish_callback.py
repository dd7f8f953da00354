"""The lightning trainer publishes from a TrainerCallback exactly where TRL would sync its own vLLM.

TRL generates a new batch every ``steps_per_generation × num_iterations`` micro-batches, counted from the
trainer's first step (after a resume: the checkpoint's step); ``TrainConfig`` sets ``steps_per_generation``
to the gradient accumulation, so that is every ``num_iterations`` optimizer steps. The callback must ask for a publish at the beginning of
exactly those steps (a version nobody samples from is never published mid-iteration), and stage the trained
adapter for the rollouts right after (``rollout_version="trained"``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import TrainerControl, TrainerState

from agentforge.trainers.step_callbacks import PublishCallback


class _Owner:
    def __init__(self, state: TrainerState) -> None:
        self.state, self.asked_at, self.staged_at = state, [], []

    def maybe_publish(self) -> None:
        self.asked_at.append(self.state.global_step)

    def maybe_stage(self) -> None:
        assert self.asked_at[-1:] == [self.state.global_step]  # after the publish of the same step
        self.staged_at.append(self.state.global_step)


@pytest.mark.parametrize(
    ("num_iterations", "first_step", "expected"),
    [(1, 0, [0, 1, 2, 3, 4, 5]), (2, 0, [0, 2, 4]), (3, 0, [0, 3]), (2, 3, [3, 5, 7])],
)
def test_publish_is_asked_for_at_the_steps_that_generate(
    num_iterations: int, first_step: int, expected: list[int]
) -> None:
    state, control = TrainerState(global_step=first_step), TrainerControl()
    args = SimpleNamespace(num_iterations=num_iterations)
    owner = _Owner(state)
    callback = PublishCallback(owner)  # type: ignore[arg-type]
    callback.on_train_begin(args, state, control)  # a resume starts counting at the checkpoint's step
    for step in range(first_step, first_step + 6):
        state.global_step = step
        callback.on_step_begin(args, state, control)
    assert owner.asked_at == expected
    assert owner.staged_at == expected  # the trained adapter is staged for the batch the step generates
