"""Property-based fuzzing of ``forget`` (issue 36, must-show: a fuzz pass over the new surfaces): whatever
subject strings it is given — near misses of real ids, SQL ``LIKE`` wildcards (``%``, ``_``), quotes, case and
whitespace variants, odd Unicode — it deletes exactly the rollouts whose server-set ``user_id`` / ``session_id``
equals one of them (none here), reports the rest of the store untouched, and never fails with anything but a
clear :class:`~agentforge.errors.UserError`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fuzzing import FUZZ
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.errors import UserError
from agentforge.stores.forget import forget
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, Span, Task

USERS = {"alice_17": "s-alice", "bob_22": "s-bob"}
NEAR = [
    "%",
    "_",
    "alice%",
    "alice_1_",
    "ALICE_17",
    " alice_17",
    "alice_17 ",
    "s-%",
    "s-alic_",
    "' OR 1=1 --",
    "",
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('forget') / 'traces.db'}")
    ids = {}
    for user, session in USERS.items():
        rid = store.enqueue_rollout(Rollout(user_id=user, session_id=session, task=Task(input={"u": user})))
        store.add_span(Span(rollout_id=rid.rollout_id, name="turn", attributes={"who": user}))
        ids[user] = rid.rollout_id
    store.enqueue_rollout(Rollout(metadata={"user": "alice_17", "session_id": "s-alice"}))  # a client's claim
    yield store, ids
    store.close()


def _not_a_real_id(text: str) -> bool:
    return text not in USERS and text not in USERS.values()


subjects = st.lists(st.one_of(st.sampled_from(NEAR), st.text(max_size=24)).filter(_not_a_real_id), max_size=3)


@settings(FUZZ, max_examples=120)
@given(users=subjects, sessions=subjects, rollouts=subjects)
def test_forget_deletes_nothing_for_subjects_that_name_no_one(world, users, sessions, rollouts) -> None:  # type: ignore[no-untyped-def]
    store, ids = world
    before = {r.rollout_id for r in store.list_rollouts()}
    try:
        report = forget(store, users=users, sessions=sessions, rollouts=rollouts, vacuum=False)
    except UserError as exc:  # only for "no subject at all"
        assert not (users or sessions or rollouts), exc
        return
    assert report.rollout_ids == [] and not any(report.deleted.values()), report
    assert {r.rollout_id for r in store.list_rollouts()} == before
    for user, rid in ids.items():
        assert store.get_rollout(rid).user_id == user and len(store.list_spans(rollout_id=rid)) == 1


def test_after_the_fuzz_the_real_id_deletes_exactly_its_rollout(tmp_path: Path) -> None:
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        alice = store.enqueue_rollout(Rollout(user_id="alice_17", session_id="s-alice")).rollout_id
        bob = store.enqueue_rollout(Rollout(user_id="alice_1", session_id="s-alice2")).rollout_id  # a prefix
        report = forget(store, users=["alice_17"], vacuum=False)
        assert report.rollout_ids == [alice]
        assert store.get_rollout(bob).user_id == "alice_1"
