"""``serving_gc``: a serving process freezes what start-up built and collects its young generation less often."""

from __future__ import annotations

import gc

import pytest

from agentforge.config import SERVING_GC_THRESHOLD, serving_gc


@pytest.fixture
def restored_gc():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_serving_gc_freezes_start_up_and_raises_the_young_threshold(restored_gc) -> None:
    older = gc.get_threshold()[1:]
    serving_gc()
    assert gc.get_threshold() == (SERVING_GC_THRESHOLD, *older)
    assert gc.get_freeze_count() > 1000  # the imported modules' objects are out of every scan
    cycle: list[object] = []
    cycle.append(cycle)  # cycles made after start-up are still collected
    del cycle
    assert gc.collect() >= 1


def test_serving_gc_refuses_a_threshold_below_the_default(restored_gc) -> None:
    with pytest.raises(ValueError, match="at least 700"):
        serving_gc(100)
