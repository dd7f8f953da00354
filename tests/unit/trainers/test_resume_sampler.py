"""Issue 15, item 3 (fast part): the order a resumed run draws its tasks in is the uninterrupted run's.

Guards against: TRL's ``RepeatSampler`` seeding one generator when it is built and advancing it every epoch,
so a sampler rebuilt by a resume in epoch ``e`` yields epoch 0's order again (silently different data); the
lightning trainer's sampler re-seeds from ``seed + epoch`` through ``set_epoch``, which ``accelerate``'s
``DataLoader.set_epoch`` calls before every epoch.
"""

from __future__ import annotations

from trl.trainer.utils import RepeatSampler

from agentforge.trainers.lightning_grpo import EpochSeededSampling


class _Base:
    def _get_train_sampler(self, dataset=None):  # type: ignore[no-untyped-def]
        return RepeatSampler(list(range(8)), mini_repeat_count=2, batch_size=2, repeat_count=1, seed=0)


class _Trainer(EpochSeededSampling, _Base):
    pass


def _epochs(sampler, epochs: range, set_epoch: bool) -> list[list[int]]:  # type: ignore[no-untyped-def]
    out = []
    for epoch in epochs:
        if set_epoch:
            sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_trl_sampler_alone_repeats_epoch_0_after_a_rebuild() -> None:
    """The bug the override exists for (if TRL fixes it, this fails and the override can go)."""
    uninterrupted = _epochs(_Base()._get_train_sampler(), range(3), set_epoch=False)
    resumed = _epochs(_Base()._get_train_sampler(), range(1, 3), set_epoch=False)
    assert resumed != uninterrupted[1:]


def test_a_sampler_rebuilt_at_a_resume_continues_the_uninterrupted_order() -> None:
    uninterrupted = _epochs(_Trainer()._get_train_sampler(), range(3), set_epoch=True)
    resumed = _epochs(_Trainer()._get_train_sampler(), range(1, 3), set_epoch=True)
    assert resumed == uninterrupted[1:]
    assert uninterrupted[0] != uninterrupted[1], "each epoch still gets its own order"
    # every index, each repeated for its group, once per epoch
    assert all(sorted(epoch) == sorted(i for i in range(8) for _ in range(2)) for epoch in uninterrupted)
