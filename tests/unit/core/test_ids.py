"""Ids cannot be predicted from earlier ids (issue 36, High 1): a tenant that rebuilt the old seeded Mersenne
Twister from 312 of its own reward ids named another tenant's next rollout. The same attack, run here against
:func:`agentforge.types.new_id`, must fail; and a forked child never repeats its parent's ids."""

from __future__ import annotations

import os
import random

from agentforge.types import new_id, new_ordered_id


def _untemper(y: int) -> int:
    """Inverse of MT19937's output tempering (Matsumoto & Nishimura 1998)."""
    y ^= y >> 18
    y ^= (y << 15) & 0xEFC60000
    x = y
    for _ in range(5):
        x = y ^ ((x << 7) & 0x9D2C5680)
    y = x
    for _ in range(2):
        x = y ^ (x >> 11)
    return x & 0xFFFFFFFF


def _predict_next(ids: list[str]) -> str:
    """The next id, if ``ids`` came from ``random.Random().getrandbits(64)`` (two 32-bit outputs, low first)."""
    words: list[int] = []
    for i in ids:
        v = int(i.rsplit("-", 1)[1][-16:], 16)
        words += [v & 0xFFFFFFFF, v >> 32]
    state = [_untemper(w) for w in words[-624:]]
    clone = random.Random()
    clone.setstate((3, (*state, 624), None))
    return f"{ids[0].rsplit('-', 1)[0]}-{clone.getrandbits(64):016x}"


def test_the_attack_works_on_a_seeded_generator() -> None:
    # the generator ids came from before: the attack must be strong enough to fail the next test on it
    rng = random.Random()
    ids = [f"rw-{rng.getrandbits(64):016x}" for _ in range(312)]
    assert _predict_next(ids) == f"rw-{rng.getrandbits(64):016x}"


def test_ids_cannot_be_predicted_from_earlier_ids() -> None:
    ids = [new_id("rw") for _ in range(312)]
    guesses = {_predict_next(ids)}
    following = {new_id("rw") for _ in range(64)}
    assert not guesses & following
    ordered = [new_ordered_id("sp") for _ in range(312)]
    assert _predict_next(ordered).rsplit("-", 1)[1] not in {new_ordered_id("sp")[-16:] for _ in range(64)}


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    new_id("ro")  # the parent has unread random bytes buffered
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read)
        os.write(write, " ".join(new_id("ro") for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child = set(f.read().split())
    os.waitpid(pid, 0)
    parent = {new_id("ro") for _ in range(100)}
    assert len(child) == 100 and not child & parent
