"""The one conformance suite every ``TraceStore`` backend passes (run by ``test_store_conformance.py``).

Each test takes the ``store`` fixture (``fixtures_store.py``), a fresh empty store of one backend.
Modelled on langgraph's ``checkpoint-conformance``.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from fixtures_store import adapter_root
from pydantic import ValidationError

from agentforge.errors import InvalidTransitionError, NotFoundError, UserError
from agentforge.queries import RolloutQuery
from agentforge.stores.base import TraceStore
from agentforge.types import (
    LATE_FINAL,
    TRAINED_STEP,
    AttemptState,
    LLMCall,
    ResourceVersion,
    Reward,
    Rollout,
    RolloutState,
    Span,
    SpanKind,
    Task,
)


def _running(store: TraceStore, **kw: object) -> tuple[Rollout, str]:
    rollout = store.enqueue_rollout(Rollout(**kw))  # type: ignore[arg-type]
    claimed = store.claim_rollout("w-1")
    assert claimed is not None and claimed[0].rollout_id == rollout.rollout_id
    return claimed[0], claimed[1].attempt_id


def _claim(store: TraceStore) -> tuple[Rollout, str]:
    claimed = store.claim_rollout("w-2")
    assert claimed is not None
    return claimed[0], claimed[1].attempt_id


# --- protocol and idempotency ---------------------------------------------------------------------


def test_implements_protocol(store: TraceStore) -> None:
    assert isinstance(store, TraceStore)


def test_enqueue_is_idempotent_and_forces_queued(store: TraceStore) -> None:
    first = store.enqueue_rollout(Rollout(rollout_id="ro-a", state=RolloutState.running, attempts=5))
    assert first.state is RolloutState.queued and first.attempts == 0
    again = store.enqueue_rollout(Rollout(rollout_id="ro-a", metadata={"changed": True}))
    assert again == first
    assert [r.rollout_id for r in store.list_rollouts()] == ["ro-a"]


def test_add_span_and_reward_are_idempotent(store: TraceStore) -> None:
    ro, _ = _running(store)
    span = store.add_span(Span(span_id="sp-1", rollout_id=ro.rollout_id, name="first"))
    assert store.add_span(Span(span_id="sp-1", rollout_id=ro.rollout_id, name="changed")) == span
    reward = store.add_reward(Reward(reward_id="rw-1", rollout_id=ro.rollout_id, value=1.0))
    assert store.add_reward(Reward(reward_id="rw-1", rollout_id=ro.rollout_id, value=0.0)) == reward
    assert [s.name for s in store.list_spans(rollout_id=ro.rollout_id)] == ["first"]
    assert [r.value for r in store.list_rewards(ro.rollout_id)] == [1.0]


def test_unknown_ids_raise_not_found(store: TraceStore) -> None:
    calls = [
        lambda: store.get_rollout("ro-missing"),
        lambda: store.update_rollout("ro-missing", metadata={}),
        lambda: store.list_attempts("ro-missing"),
        lambda: store.heartbeat("at-missing"),
        lambda: store.finish_attempt("at-missing", AttemptState.succeeded),
        lambda: store.add_span(Span(rollout_id="ro-missing")),
        lambda: store.list_spans(rollout_id="ro-missing"),
        lambda: store.list_spans(attempt_id="at-missing"),
        lambda: store.add_reward(Reward(rollout_id="ro-missing", value=1.0)),
        lambda: store.list_rewards("ro-missing"),
        lambda: store.final_reward("ro-missing"),
        lambda: store.get_resource("missing"),
        lambda: store.activate_resource("missing", 1),
    ]
    for call in calls:
        with pytest.raises(NotFoundError):
            call()
    ro = store.enqueue_rollout(Rollout())
    with pytest.raises(NotFoundError):
        store.add_reward(Reward(rollout_id=ro.rollout_id, span_id="sp-missing", value=1.0))
    store.publish_resource(ResourceVersion(name="p"))
    with pytest.raises(NotFoundError):
        store.get_resource("p", version=7)
    assert store.list_resources("missing") == []


# --- rollout state machine ------------------------------------------------------------------------


def test_happy_path_and_invalid_transitions(store: TraceStore) -> None:
    ro, attempt_id = _running(store, task=Task(input={"q": "2+2"}), agent="math")
    assert ro.state is RolloutState.running and ro.attempts == 1
    assert store.get_rollout(ro.rollout_id).state is RolloutState.running
    (attempt,) = store.list_attempts(ro.rollout_id)
    assert (attempt.number, attempt.worker_id, attempt.state) == (1, "w-1", AttemptState.running)
    done = store.finish_attempt(attempt_id, AttemptState.succeeded)
    assert done.state is RolloutState.succeeded and done.error is None
    # finishing again changes nothing
    assert store.finish_attempt(attempt_id, AttemptState.failed, "late").state is RolloutState.succeeded
    assert store.list_attempts(ro.rollout_id)[0].state is AttemptState.succeeded
    for target in (RolloutState.running, RolloutState.queued, RolloutState.failed):
        with pytest.raises(InvalidTransitionError):
            store.update_rollout(ro.rollout_id, state=target)
    queued = store.enqueue_rollout(Rollout())
    with pytest.raises(InvalidTransitionError):
        store.update_rollout(queued.rollout_id, state=RolloutState.succeeded)
    assert (
        store.update_rollout(queued.rollout_id, state=RolloutState.cancelled).state is RolloutState.cancelled
    )
    with pytest.raises(InvalidTransitionError):
        store.update_rollout(queued.rollout_id, state=RolloutState.queued)
    assert store.claim_rollout("w-2") is None
    with pytest.raises(InvalidTransitionError):
        store.finish_attempt(attempt_id, AttemptState.running)


def test_update_rollout_fields(store: TraceStore) -> None:
    ro = store.enqueue_rollout(Rollout())
    updated = store.update_rollout(ro.rollout_id, metadata={"k": [1, 2]}, resources={"policy": "policy@v2"})
    assert updated.metadata == {"k": [1, 2]} and updated.resources == {"policy": "policy@v2"}
    assert store.get_rollout(ro.rollout_id) == updated
    with pytest.raises(UserError):
        store.update_rollout(ro.rollout_id, attempts=9)
    for bad in (
        {"state": "exploded"},
        {"state": None},
        {"metadata": 5},
        {"metadata": ["k"]},
        {"resources": ["policy"]},
        {"resources": {"policy": 3}},
        {"error": 7},
    ):
        with pytest.raises(UserError, match="update_rollout: "):
            store.update_rollout(ro.rollout_id, **bad)
    assert store.get_rollout(ro.rollout_id) == updated  # nothing of a refused update was applied
    assert store.update_rollout(ro.rollout_id, state="cancelled").state is RolloutState.cancelled


def test_leaving_running_by_update_closes_the_attempt(store: TraceStore) -> None:
    ro, attempt_id = _running(store)
    assert store.update_rollout(ro.rollout_id, state=RolloutState.queued).state is RolloutState.queued
    assert store.list_attempts(ro.rollout_id)[0].state is AttemptState.abandoned
    ro2, attempt2 = _claim(store)
    assert ro2.rollout_id == ro.rollout_id and ro2.attempts == 2 and attempt2 != attempt_id


def test_retries_until_attempts_run_out(store: TraceStore) -> None:
    ro = store.enqueue_rollout(Rollout(max_attempts=2))
    _, a1 = store.claim_rollout("w-1") or (None, None)
    assert a1 is not None
    after1 = store.finish_attempt(a1.attempt_id, AttemptState.failed, "upstream 500")
    assert (after1.state, after1.attempts, after1.error) == (RolloutState.queued, 1, "upstream 500")
    claimed = store.claim_rollout("w-2")
    assert claimed is not None and claimed[1].number == 2 and claimed[0].attempts == 2
    after2 = store.finish_attempt(claimed[1].attempt_id, AttemptState.failed, "upstream 500 again")
    assert (after2.state, after2.attempts, after2.error) == (RolloutState.failed, 2, "upstream 500 again")
    assert [a.state for a in store.list_attempts(ro.rollout_id)] == [AttemptState.failed] * 2
    assert store.claim_rollout("w-3") is None

    once = store.enqueue_rollout(Rollout(max_attempts=1))
    _, a = store.claim_rollout("w-1") or (None, None)
    assert a is not None and a.rollout_id == once.rollout_id
    assert store.finish_attempt(a.attempt_id, AttemptState.timed_out, "600 s").state is RolloutState.timed_out
    # a manual retry of a timed-out rollout is an edge of the table
    assert store.update_rollout(once.rollout_id, state=RolloutState.queued).state is RolloutState.queued


def test_claim_order_and_agent_filter(store: TraceStore) -> None:
    ids = [store.enqueue_rollout(Rollout(agent="a" if i % 2 else "b")).rollout_id for i in range(4)]
    got = store.claim_rollout("w", agent="a")
    assert got is not None and got[0].rollout_id == ids[1]
    got = store.claim_rollout("w")
    assert got is not None and got[0].rollout_id == ids[0]
    assert store.claim_rollout("w", agent="nobody") is None


def test_claim_is_atomic_across_threads(store: TraceStore) -> None:
    ids = {store.enqueue_rollout(Rollout()).rollout_id for _ in range(50)}
    claimed: list[str] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        try:
            start.wait()
            while (got := store.claim_rollout(f"w-{n}")) is not None:
                assert got[1].number == 1
                with lock:
                    claimed.append(got[0].rollout_id)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert Counter(claimed) == Counter(ids)  # each exactly once
    assert all(len(store.list_attempts(rid)) == 1 for rid in ids)
    assert len(store.list_rollouts(state=RolloutState.running)) == 50


def test_requeue_stale(store: TraceStore) -> None:
    stale = store.enqueue_rollout(Rollout(max_attempts=2))
    alive = store.enqueue_rollout(Rollout())
    last = store.enqueue_rollout(Rollout(max_attempts=1))
    claims = {c[0].rollout_id: c[1] for c in (store.claim_rollout("w") for _ in range(3)) if c}
    time.sleep(1.2)  # stale by 1.2 s; the fresh heartbeat below has a 0.8 s margin on a loaded machine
    store.heartbeat(claims[alive.rollout_id].attempt_id)
    affected = store.requeue_stale(0.8)
    assert sorted(affected) == sorted([stale.rollout_id, last.rollout_id])
    assert store.get_rollout(stale.rollout_id).state is RolloutState.queued
    assert store.get_rollout(alive.rollout_id).state is RolloutState.running
    out_of_attempts = store.get_rollout(last.rollout_id)
    assert out_of_attempts.state is RolloutState.failed and "heartbeat" in (out_of_attempts.error or "")
    assert store.list_attempts(stale.rollout_id)[0].state is AttemptState.abandoned
    # the abandoned attempt cannot finish any more; the rollout is unaffected
    assert store.finish_attempt(claims[stale.rollout_id].attempt_id, AttemptState.succeeded).state is (
        RolloutState.queued
    )
    assert store.requeue_stale(0.8) == []
    retry = store.claim_rollout("w-2")
    assert retry is not None and retry[0].rollout_id == stale.rollout_id and retry[1].number == 2


def test_list_rollouts_filters(store: TraceStore) -> None:
    a = store.enqueue_rollout(Rollout(agent="x", group_id="g1", created_at=100.0))
    b = store.enqueue_rollout(Rollout(agent="y", group_id="g1", created_at=200.0))
    c = store.enqueue_rollout(Rollout(agent="x", group_id="g2", created_at=300.0))
    assert [r.rollout_id for r in store.list_rollouts()] == [a.rollout_id, b.rollout_id, c.rollout_id]
    assert [r.rollout_id for r in store.list_rollouts(group_id="g1")] == [a.rollout_id, b.rollout_id]
    assert [r.rollout_id for r in store.list_rollouts(agent="x")] == [a.rollout_id, c.rollout_id]
    assert [r.rollout_id for r in store.list_rollouts(since=150.0)] == [b.rollout_id, c.rollout_id]
    assert [r.rollout_id for r in store.list_rollouts(limit=2)] == [a.rollout_id, b.rollout_id]
    store.claim_rollout("w")
    assert [r.rollout_id for r in store.list_rollouts(state=RolloutState.running)] == [a.rollout_id]
    assert [r.rollout_id for r in store.list_rollouts(after=a.rollout_id)] == [b.rollout_id, c.rollout_id]
    assert [r.rollout_id for r in store.list_rollouts(agent="x", after=a.rollout_id)] == [c.rollout_id]
    assert store.list_rollouts(after=c.rollout_id) == []
    with pytest.raises(NotFoundError):  # a cursor that names no rollout is an error, not an empty page
        store.list_rollouts(after="ro-missing")


def test_page_rollouts_filters_and_keyset_pages(store: TraceStore) -> None:
    rollouts = []
    for i in range(7):
        meta = {"trainer_run": "run-a" if i % 2 == 0 else "run-b", "note": '"trainer_run":"run-a"'}
        pin = {"policy": "policy@v2"} if i == 3 else {}
        rollouts.append(
            store.enqueue_rollout(
                Rollout(agent="x" if i < 5 else "y", created_at=100.0 + i, metadata=meta, resources=pin)
            )
        )
    ids = [r.rollout_id for r in rollouts]
    for i, value in enumerate([0.1, 0.5, None, 0.9, 0.3]):  # rollouts 5 and 6 stay unscored
        store.add_reward(Reward(rollout_id=ids[i], value=value))
    store.add_reward(Reward(rollout_id=ids[4], value=0.7, final=True))  # final wins over a later one
    store.add_reward(Reward(rollout_id=ids[4], value=0.0))
    llm = LLMCall(model="policy", version="policy@v1", prompt_token_ids=[1], completion_token_ids=[2])
    for _ in range(2):
        store.add_span(Span(rollout_id=ids[1], kind=SpanKind.llm, llm=llm))
    store.add_span(Span(rollout_id=ids[1], kind=SpanKind.tool, name="lookup"))

    def page(**kw: object) -> list[str]:
        return [row.rollout.rollout_id for row in store.page_rollouts(RolloutQuery(**kw)).items]  # type: ignore[arg-type]

    assert page() == ids[::-1]  # newest first
    assert page(agent="y") == [ids[6], ids[5]]
    assert page(min_reward=0.3) == [ids[4], ids[3], ids[1]]  # 4's training reward is its final 0.7
    assert page(max_reward=0.3) == [ids[0]]  # the invalid (2) and unscored (5, 6) drop out
    assert page(since=102.0, until=104.0) == [ids[3], ids[2]]
    assert page(trainer_run="run-a") == [ids[6], ids[4], ids[2], ids[0]]  # not matched by the look-alike note
    assert page(version="policy@v1") == [ids[1]] and page(version="policy@v2") == [ids[3]]
    store.claim_rollout("w")
    assert page(state=RolloutState.running) == [ids[0]]
    rows = {row.rollout.rollout_id: row for row in store.page_rollouts(RolloutQuery()).items}
    assert rows[ids[1]].versions == ["policy@v1"] and rows[ids[1]].llm_calls == 2
    assert rows[ids[3]].versions == ["policy@v2"] and rows[ids[3]].llm_calls == 0  # its pin
    assert rows[ids[4]].reward == 0.7 and rows[ids[2]].reward is None and rows[ids[6]].reward is None
    seen, before = [], None
    while True:  # keyset pages of 3 walk every rollout once, newest first
        got = store.page_rollouts(RolloutQuery(limit=3, before=before))
        seen += [row.rollout.rollout_id for row in got.items]
        assert len(got.items) == 3 or got.next is None
        if got.next is None:
            break
        before = got.next
    assert seen == ids[::-1]
    with pytest.raises((UserError, ValueError)):
        RolloutQuery(min_reward=1.0, max_reward=0.0)


# --- spans ----------------------------------------------------------------------------------------


def test_spans_ordering_kinds_and_orphans(store: TraceStore) -> None:
    ro, attempt_id = _running(store)
    llm = LLMCall(
        model="policy",
        version="policy@v1",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.5],
        response_text="hi",
    )
    names = []
    for i in range(6):
        kind = SpanKind.llm if i % 2 == 0 else SpanKind.tool
        store.add_span(
            Span(rollout_id=ro.rollout_id, name=f"s{i}", kind=kind, llm=llm if kind is SpanKind.llm else None)
        )
        names.append(f"s{i}")
    orphan = store.add_span(Span(name="orphan", kind=SpanKind.llm))
    spans = store.list_spans(rollout_id=ro.rollout_id)
    assert [s.name for s in spans] == names
    seqs = [s.sequence for s in spans]
    assert all(isinstance(q, int) for q in seqs) and seqs == sorted(seqs) and len(set(seqs)) == 6
    assert all(s.attempt_id == attempt_id for s in spans)  # stamped with the running attempt
    assert spans[0].llm == llm
    assert [s.name for s in store.list_spans(rollout_id=ro.rollout_id, kind=SpanKind.tool)] == names[1::2]
    assert [s.span_id for s in store.list_spans(orphans=True)] == [orphan.span_id]
    assert orphan.rollout_id is None and orphan.sequence is not None
    assert len(store.list_spans()) == 7
    assert [s.name for s in store.list_spans(attempt_id=attempt_id)] == names
    with pytest.raises(UserError):
        store.list_spans(rollout_id=ro.rollout_id, orphans=True)


def test_span_attempt_must_belong_to_rollout(store: TraceStore) -> None:
    ro1, a1 = _running(store)
    ro2, _ = _running(store)
    with pytest.raises(UserError):
        store.add_span(Span(rollout_id=ro2.rollout_id, attempt_id=a1))
    from_attempt = store.add_span(Span(attempt_id=a1))  # rollout filled in from the attempt
    assert from_attempt.rollout_id == ro1.rollout_id


def test_valid_only_keeps_the_counted_attempt(store: TraceStore) -> None:
    ro, a1 = _running(store, max_attempts=3)
    store.add_span(Span(rollout_id=ro.rollout_id, name="dead-1"))
    store.finish_attempt(a1, AttemptState.failed, "boom")
    _, a2 = _claim(store)
    store.add_span(Span(rollout_id=ro.rollout_id, name="dead-2"))
    store.update_rollout(ro.rollout_id, state=RolloutState.queued)  # worker lost: attempt abandoned
    _, a3 = _claim(store)
    store.add_span(Span(rollout_id=ro.rollout_id, attempt_id=a3, name="live"))
    # while the rollout runs, the latest attempt counts
    assert [s.name for s in store.list_spans(rollout_id=ro.rollout_id, valid_only=True)] == ["live"]
    store.finish_attempt(a3, AttemptState.succeeded)
    assert [s.name for s in store.list_spans(rollout_id=ro.rollout_id, valid_only=True)] == ["live"]
    assert [s.name for s in store.list_spans(rollout_id=ro.rollout_id)] == ["dead-1", "dead-2", "live"]
    assert [s.name for s in store.list_spans(valid_only=True)] == ["live"]

    failed, b1 = _running(store, max_attempts=2)
    store.add_span(Span(rollout_id=failed.rollout_id, name="try-1"))
    store.finish_attempt(b1, AttemptState.failed)
    _, b2 = _claim(store)
    store.add_span(Span(rollout_id=failed.rollout_id, name="try-2"))
    assert store.finish_attempt(b2, AttemptState.failed).state is RolloutState.failed
    assert [s.name for s in store.list_spans(rollout_id=failed.rollout_id, valid_only=True)] == ["try-2"]


def test_late_spans_are_quarantined_and_never_valid(store: TraceStore) -> None:
    ro, a1 = _running(store)
    live = store.add_span(Span(rollout_id=ro.rollout_id, attempt_id=a1, name="live", kind=SpanKind.llm))
    scored = store.add_reward(Reward(rollout_id=ro.rollout_id, value=1.0, final=True))
    store.finish_attempt(a1, AttemptState.succeeded)
    # a late call of the finished attempt, once with and once without the attempt header, and in a batch
    late = store.add_span(Span(rollout_id=ro.rollout_id, name="late", kind=SpanKind.llm, attributes={"k": 1}))
    late_att = store.add_span(
        Span(rollout_id=ro.rollout_id, attempt_id=a1, name="late-att", kind=SpanKind.llm)
    )
    (late_batch,) = store.write_batch(
        [Span(rollout_id=ro.rollout_id, name="late-batch", kind=SpanKind.llm, attributes={"late": 0})]
    )
    note = store.add_span(Span(rollout_id=ro.rollout_id, name="feedback-form", kind=SpanKind.custom))
    assert "late" not in note.attributes  # an annotation after the end is not a call: not late
    for sp in (late, late_att, late_batch):
        assert isinstance(sp, Span) and sp.attributes["late"] is True
        assert "succeeded" in sp.attributes["late_reason"] and ro.rollout_id in sp.attributes["late_reason"]
    assert late.attributes["k"] == 1  # the caller's attributes are kept beside the marks
    assert [s.name for s in store.list_spans(rollout_id=ro.rollout_id)] == [
        "live",
        "late",
        "late-att",
        "late-batch",
        "feedback-form",
    ]
    assert store.list_spans(rollout_id=ro.rollout_id, kind=SpanKind.llm, valid_only=True) == [live]
    assert [s.name for s in store.list_spans(valid_only=True)] == ["live", "feedback-form"]
    assert store.list_spans(rollout_id=ro.rollout_id)[1] == late  # stored as returned
    assert store.add_span(live) == live  # a retried write of a span stored in time stays valid
    final = store.final_reward(ro.rollout_id)
    assert final is not None and final.reward_id == scored.reward_id
    feedback = store.add_reward(Reward(rollout_id=ro.rollout_id, value=0.2, final=True, source="user"))
    assert feedback.valid  # a reward hours later still attaches (DESIGN fact 4); only spans are late

    retried, b1 = _running(store, max_attempts=2)
    store.finish_attempt(b1, AttemptState.failed, "boom")  # back to queued, no attempt running
    between = store.add_span(Span(rollout_id=retried.rollout_id, name="between", kind=SpanKind.llm))
    dead = store.add_span(Span(rollout_id=retried.rollout_id, attempt_id=b1, name="dead", kind=SpanKind.llm))
    assert "no running attempt" in between.attributes["late_reason"]
    assert b1 in dead.attributes["late_reason"] and "failed" in dead.attributes["late_reason"]
    _, b2 = _claim(store)
    fresh = store.add_span(Span(rollout_id=retried.rollout_id, name="fresh", kind=SpanKind.llm))
    assert "late" not in fresh.attributes and fresh.attempt_id == b2
    assert store.list_spans(rollout_id=retried.rollout_id, valid_only=True) == [fresh]

    session = store.enqueue_rollout(Rollout())  # an app's session: running without a claimed attempt
    store.update_rollout(session.rollout_id, state=RolloutState.running)
    turn = store.add_span(Span(rollout_id=session.rollout_id, name="turn", kind=SpanKind.llm))
    store.update_rollout(session.rollout_id, state=RolloutState.succeeded)
    after = store.add_span(Span(rollout_id=session.rollout_id, name="after", kind=SpanKind.llm))
    assert "late" not in turn.attributes and after.attributes["late"] is True
    assert store.list_spans(rollout_id=session.rollout_id, valid_only=True) == [turn]


# --- rewards --------------------------------------------------------------------------------------


def test_reward_attaches_to_the_latest_span_before_it(store: TraceStore) -> None:
    ro, attempt_id = _running(store)
    early = store.add_reward(Reward(rollout_id=ro.rollout_id, value=0.1))
    assert early.span_id is None and early.attempt_id == attempt_id
    llm_span = store.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.llm, name="chat"))
    # inside a node, after the LLM span closed: no span_id given → the LLM span
    in_node = store.add_reward(Reward(rollout_id=ro.rollout_id, name="format", value=0.5))
    final = store.add_reward(Reward(rollout_id=ro.rollout_id, name="correct", value=1.0, final=True))
    assert in_node.span_id == llm_span.span_id and final.span_id == llm_span.span_id
    tool_span = store.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.tool))
    later = store.add_reward(Reward(rollout_id=ro.rollout_id, value=0.0))
    assert later.span_id == tool_span.span_id
    explicit = store.add_reward(Reward(rollout_id=ro.rollout_id, span_id=llm_span.span_id, value=0.7))
    assert explicit.span_id == llm_span.span_id
    rewards = store.list_rewards(ro.rollout_id)
    assert [r.reward_id for r in rewards] == [r.reward_id for r in (early, in_node, final, later, explicit)]
    seqs = [r.sequence for r in rewards]
    assert seqs == sorted(seqs) and llm_span.sequence < in_node.sequence < tool_span.sequence < later.sequence
    best = store.final_reward(ro.rollout_id)
    assert best is not None and best.reward_id == final.reward_id  # final wins over later rewards
    other, _ = _running(store)
    with pytest.raises(UserError):
        store.add_reward(Reward(rollout_id=other.rollout_id, span_id=llm_span.span_id, value=1.0))


def test_final_reward_is_last_by_sequence(store: TraceStore) -> None:
    ro = store.enqueue_rollout(Rollout())
    assert store.final_reward(ro.rollout_id) is None
    for v in (0.2, 0.9, 0.4):
        store.add_reward(Reward(rollout_id=ro.rollout_id, value=v))
    best = store.final_reward(ro.rollout_id)
    assert best is not None and best.value == 0.4
    f1 = store.add_reward(Reward(rollout_id=ro.rollout_id, value=0.6, final=True))
    f2 = store.add_reward(Reward(rollout_id=ro.rollout_id, value=0.8, final=True))
    store.add_reward(Reward(rollout_id=ro.rollout_id, value=0.0))
    best = store.final_reward(ro.rollout_id)
    assert best is not None and best.reward_id == f2.reward_id != f1.reward_id


def test_a_final_reward_after_training_is_kept_but_never_replaces_the_training_reward(
    store: TraceStore,
) -> None:
    """Issue 36: once a step trained on a rollout (``metadata.trained_step``, set by the trainer after the update),
    its training reward is frozen; a late final reward (single or batched) is stored non-final and flagged."""
    ro = store.enqueue_rollout(Rollout())
    trained = store.add_reward(Reward(rollout_id=ro.rollout_id, value=1.0, final=True))
    store.update_rollout(ro.rollout_id, metadata={"note": "x", TRAINED_STEP: 3})
    late = store.add_reward(
        Reward(rollout_id=ro.rollout_id, value=0.0, final=True, metadata={"why": "thumbs"})
    )
    (batched,) = store.write_batch([Reward(rollout_id=ro.rollout_id, value=0.0, final=True)])
    assert isinstance(batched, Reward)
    for r in (late, batched):
        assert not r.final and r.metadata[LATE_FINAL] is True and r.metadata[TRAINED_STEP] == 3, r
    assert late.metadata["why"] == "thumbs" and late.value == 0.0
    best = store.final_reward(ro.rollout_id)
    assert best is not None and best.reward_id == trained.reward_id and best.value == 1.0
    assert [r.reward_id for r in store.list_rewards(ro.rollout_id)] == [
        trained.reward_id,
        late.reward_id,
        batched.reward_id,
    ]  # nothing lost
    assert store.add_reward(late).reward_id == late.reward_id  # idempotent as ever
    other = store.enqueue_rollout(Rollout())  # not trained: the last final reward still wins
    store.add_reward(Reward(rollout_id=other.rollout_id, value=1.0, final=True))
    last = store.add_reward(Reward(rollout_id=other.rollout_id, value=0.0, final=True))
    assert store.final_reward(other.rollout_id).reward_id == last.reward_id  # type: ignore[union-attr]


def test_span_listings_read_in_keyset_pages(store: TraceStore) -> None:
    """``after_sequence`` / ``limit``: one page of the sequence order, here and through every backend."""
    ro = store.enqueue_rollout(Rollout())
    spans = [
        store.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.custom, name=f"s{i}")) for i in range(5)
    ]
    every = store.list_spans(rollout_id=ro.rollout_id)
    assert [s.span_id for s in every] == [s.span_id for s in spans]
    page = store.list_spans(rollout_id=ro.rollout_id, limit=2)
    assert [s.span_id for s in page] == [s.span_id for s in spans[:2]]
    rest = store.list_spans(rollout_id=ro.rollout_id, after_sequence=page[-1].sequence)
    assert [s.span_id for s in rest] == [s.span_id for s in spans[2:]]
    assert store.list_spans(rollout_id=ro.rollout_id, after_sequence=spans[-1].sequence) == []
    unscoped = store.list_spans(after_sequence=spans[1].sequence, limit=2)
    assert [s.span_id for s in unscoped] == [s.span_id for s in spans[2:4]]


def test_none_and_nan_rewards_are_stored_invalid(store: TraceStore) -> None:
    ro = store.enqueue_rollout(Rollout())
    none = store.add_reward(Reward(rollout_id=ro.rollout_id, value=None))
    nan = store.add_reward(Reward(rollout_id=ro.rollout_id, value=float("nan"), final=True))
    for r in (none, nan, *store.list_rewards(ro.rollout_id)):
        assert r.value is None and not r.valid
    assert len(store.list_rewards(ro.rollout_id)) == 2
    best = store.final_reward(ro.rollout_id)
    assert best is not None and best.reward_id == nan.reward_id and best.value is None  # not turned into 0
    for value in (math.inf, -math.inf):  # refused: an infinite reward would swamp every advantage
        with pytest.raises(UserError, match="finite"):
            store.add_reward(Reward(rollout_id=ro.rollout_id, value=value))
        (refused,) = store.write_batch([Reward(rollout_id=ro.rollout_id, value=value)])
        assert isinstance(refused, UserError) and "finite" in str(refused)
    assert len(store.list_rewards(ro.rollout_id)) == 2


# --- resources ------------------------------------------------------------------------------------


def test_resource_versions_publish_activate_rollback(store: TraceStore, tmp_path: Path) -> None:
    v1 = store.publish_resource(ResourceVersion(name="prompt:sys", kind="prompt", payload={"template": "A"}))
    v2 = store.publish_resource(ResourceVersion(name="prompt:sys", kind="prompt", payload={"template": "B"}))
    assert (v1.version, v2.version, v2.ref) == (1, 2, "prompt:sys@v2")
    assert store.get_resource("prompt:sys").payload == {"template": "B"}
    v3 = store.publish_resource(ResourceVersion(name="prompt:sys", payload={"template": "C"}), activate=False)
    assert v3.version == 3 and not v3.active and store.get_resource("prompt:sys").version == 2
    rolled_back = store.activate_resource("prompt:sys", 1)
    assert rolled_back.active and store.get_resource("prompt:sys").payload == {"template": "A"}
    assert store.get_resource("prompt:sys", version=3).payload == {"template": "C"}
    adapter = adapter_root(tmp_path) / "a"  # the store server takes adapters from its adapter root only
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    path = os.path.realpath(adapter)
    stored = store.publish_resource(ResourceVersion(name="policy", kind="adapter", payload={"path": path}))
    assert stored.payload == {"path": path} and store.get_resource("policy").payload == {"path": path}
    listed = store.list_resources()
    assert [(r.name, r.version, r.active) for r in listed] == [
        ("policy", 1, True),
        ("prompt:sys", 1, True),
        ("prompt:sys", 2, False),
        ("prompt:sys", 3, False),
    ]
    assert [r.version for r in store.list_resources("prompt:sys")] == [1, 2, 3]


# --- text and size ----------------------------------------------------------------------------------


def _mixed_text(size: int) -> str:
    pieces = [
        "family 👩‍👩‍👧 ",
        "flag 🏳️‍🌈 ",
        "skin 👍🏽 ",
        "中文字符与日本語のテキスト ",
        "한국어 ",
        "“curly” ‘quotes’ — dash … ",
        "e\u0301 combining ",
        "tab\tnl\n",
        "nul\x00byte ",
        "lone \ud800 high ",
        "lone \udfff low ",
        "bom \ufeff ",
        "rtl \u202e ",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ",
        "\\u0000 literal backslash ",
    ]
    block = "".join(pieces)
    return (block * (size // len(block) + 1))[:size]


def test_huge_mixed_unicode_payloads_round_trip_exactly(store: TraceStore) -> None:
    text = _mixed_text(2_000_000)
    ro = store.enqueue_rollout(Rollout(task=Task(input={"doc": text}), metadata={"m": text[:1000]}))
    assert store.get_rollout(ro.rollout_id).task.input["doc"] == text
    span = store.add_span(
        Span(
            rollout_id=ro.rollout_id,
            attributes={"text": text, "nested": [{"k": text[:5000]}], "nan": math.nan, "inf": math.inf},
            llm=LLMCall(
                response_text=text[:100_000], request={"messages": [{"role": "user", "content": text[:2000]}]}
            ),
        )
    )
    (got,) = store.list_spans(rollout_id=ro.rollout_id)
    assert got.attributes["text"] == text and got.attributes["nested"] == [{"k": text[:5000]}]
    assert math.isnan(got.attributes["nan"]) and got.attributes["inf"] == math.inf
    assert got.llm == span.llm and got.llm is not None and got.llm.response_text == text[:100_000]
    store.add_reward(Reward(rollout_id=ro.rollout_id, value=1.0, metadata={"why": text[:10_000]}))
    assert store.list_rewards(ro.rollout_id)[0].metadata == {"why": text[:10_000]}
    store.publish_resource(ResourceVersion(name="prompt:big", payload={"template": text}))
    assert store.get_resource("prompt:big").payload["template"] == text
    assert got.attributes["text"].encode("utf-8", "surrogatepass") == text.encode("utf-8", "surrogatepass")


def test_unstorable_scalar_text_is_rejected_clearly(store: TraceStore) -> None:
    ro = store.enqueue_rollout(Rollout())
    for bad in ("lone \ud800", "nul \x00"):
        with pytest.raises(UserError, match="attributes/metadata"):
            store.add_span(Span(rollout_id=ro.rollout_id, name=bad))
        with pytest.raises(UserError, match="attributes/metadata"):
            store.enqueue_rollout(Rollout(error=bad))
    with pytest.raises(
        ValidationError, match="agent"
    ):  # a control character in an agent name: refused earlier
        Rollout(agent="nul \x00")
    assert store.list_spans(rollout_id=ro.rollout_id) == []
    assert len(store.list_rollouts()) == 1
    fine = store.add_span(Span(rollout_id=ro.rollout_id, name="emoji 👩‍👩‍👧 中文 “ok”"))
    assert store.list_spans(rollout_id=ro.rollout_id)[0].name == fine.name


def test_ids_must_fit_a_url_path_segment(store: TraceStore) -> None:
    for bad in ("a/b", "../x", "with space", "", "x" * 201, "q?x", "h#x", "p%2Fx", "-leading", "é"):
        with pytest.raises(UserError, match="not a valid id"):
            store.enqueue_rollout(Rollout(rollout_id=bad))
    ro, _ = _running(store, rollout_id="ro_ok.1:x@y~z+w=v-" + "x" * 180)
    for item in (
        Span(span_id="sp/1", rollout_id=ro.rollout_id),
        Reward(reward_id="rw/1", rollout_id=ro.rollout_id),
    ):
        (refused,) = store.write_batch([item])
        assert isinstance(refused, UserError) and "not a valid id" in str(refused)
    assert store.list_rollouts() == [store.get_rollout(ro.rollout_id)]
    assert store.list_spans() == [] and store.list_rewards(ro.rollout_id) == []


def test_close_is_safe_twice(store: TraceStore) -> None:
    store.enqueue_rollout(Rollout())
    store.close()
    store.close()


def test_write_batch_keeps_order_isolates_bad_items_and_dedupes(store: TraceStore) -> None:
    rollout, attempt_id = _running(store)
    other = store.enqueue_rollout(Rollout())
    known = store.add_span(Span(rollout_id=rollout.rollout_id, name="before"))
    first = Span(
        rollout_id=rollout.rollout_id,
        name="first",
        attributes={"x": math.inf, "t": "é\x00"},
        llm=LLMCall(logprobs=[-math.inf, -0.5], latency_s=math.nan, completion_token_ids=[1, 2]),
    )
    items: list[Span | Reward] = [
        first,
        Span(rollout_id="nope", name="unknown rollout"),
        Span(rollout_id=rollout.rollout_id, name="bad\x00name"),
        Span(rollout_id=other.rollout_id, attempt_id=attempt_id, name="foreign attempt"),
        Reward(rollout_id=rollout.rollout_id, value=0.5),  # follows `first`, written just before it
        first,  # the same id again in the same batch
        known,  # an id already stored
        Span(attempt_id=attempt_id, name="rollout from attempt"),
        Reward(rollout_id="nope", value=1.0),
    ]
    results = store.write_batch(items)
    assert len(results) == len(items)
    stored, unknown, bad_text, foreign, reward, again, old, from_attempt, bad_reward = results
    assert isinstance(stored, Span) and stored.attempt_id == attempt_id and stored.sequence is not None
    assert isinstance(unknown, NotFoundError) and isinstance(bad_reward, NotFoundError)
    assert isinstance(bad_text, UserError) and isinstance(foreign, UserError)
    assert isinstance(reward, Reward) and reward.span_id == first.span_id and reward.attempt_id == attempt_id
    assert isinstance(again, Span) and again.sequence == stored.sequence
    assert isinstance(old, Span) and old.sequence == known.sequence and old.name == "before"
    assert isinstance(from_attempt, Span) and from_attempt.rollout_id == rollout.rollout_id
    spans = store.list_spans(rollout_id=rollout.rollout_id)
    assert [s.name for s in spans] == ["before", "first", "rollout from attempt"]
    assert spans[1].attributes["x"] == math.inf and spans[1].attributes["t"] == "é\x00"
    assert spans[1].llm is not None and spans[1].llm.logprobs == [-math.inf, -0.5]  # not null
    assert math.isnan(spans[1].llm.latency_s)
    assert reward.sequence is not None and spans[1].sequence < reward.sequence < spans[2].sequence  # type: ignore[operator]
    assert store.list_spans(rollout_id=other.rollout_id) == []


def test_concurrent_add_span_calls_share_commits_and_lose_nothing(store: TraceStore) -> None:
    rollout, _ = _running(store)
    spans = [Span(rollout_id=rollout.rollout_id, name=f"s{i}") for i in range(200)]
    futures = [store.submit(s) for s in spans]  # queued at once: the writer takes them in batches
    results = [f.result(timeout=60) for f in futures]
    assert [r.span_id for r in results] == [s.span_id for s in spans]
    sequences = [r.sequence for r in results]
    assert sequences == sorted(sequences) and len(set(sequences)) == 200  # submission order kept
    errors: list[BaseException] = []

    def write(chunk: list[Span]) -> None:
        try:
            for span in chunk:
                store.add_span(span)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    more = [Span(rollout_id=rollout.rollout_id, name=f"t{i}") for i in range(160)]
    threads = [threading.Thread(target=write, args=(more[i::16],)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    names = Counter(s.name for s in store.list_spans(rollout_id=rollout.rollout_id))
    assert len(names) == 360 and set(names.values()) == {1}


def test_submit_many_acknowledges_a_flush_once_all_is_committed(store: TraceStore) -> None:
    submit_many = getattr(store, "submit_many", None)
    if submit_many is None:
        pytest.skip("this store has no submit_many (optional)")
    rollout, _ = _running(store)
    spans = [Span(rollout_id=rollout.rollout_id, name=f"m{i}") for i in range(300)]
    bad = Span(rollout_id="ro-missing-many", name="orphan of nothing")
    nul = Span(rollout_id=rollout.rollout_id, name="bad\x00name")  # unstorable scalar text: fails alone
    outcomes = submit_many([*spans[:150], bad, *spans[150:], nul, spans[0]]).result(timeout=60)
    assert isinstance(outcomes[150], NotFoundError) and isinstance(outcomes[-2], UserError)
    stored = [o for o in outcomes if isinstance(o, Span)]
    assert [o.span_id for o in stored] == [s.span_id for s in [*spans, spans[0]]]
    sequences = [o.sequence for o in stored[:-1]]
    assert sequences == sorted(sequences) and len(set(sequences)) == 300  # order kept
    assert stored[-1].sequence == stored[0].sequence  # the repeated id: the stored span, not a second one
    listed = store.list_spans(rollout_id=rollout.rollout_id)
    assert [sp.span_id for sp in listed] == [s.span_id for s in spans]
    assert listed == stored[:-1]


# --- tenants --------------------------------------------------------------------------------------


def test_tenant_is_stored_and_scopes_rollout_and_span_queries(store: TraceStore) -> None:
    a = store.enqueue_rollout(Rollout(rollout_id="ro-ta", tenant="acme"))
    store.enqueue_rollout(Rollout(rollout_id="ro-tb", tenant="bolt"))
    store.enqueue_rollout(Rollout(rollout_id="ro-tn"))
    assert a.tenant == "acme" and store.get_rollout("ro-tb").tenant == "bolt"
    assert [r.rollout_id for r in store.list_rollouts(tenant="acme")] == ["ro-ta"]
    assert [r.rollout_id for r in store.list_rollouts()] == ["ro-ta", "ro-tb", "ro-tn"]
    span = store.add_span(Span(span_id="sp-ta", rollout_id="ro-ta", tenant="acme"))
    store.add_span(Span(span_id="sp-tb", rollout_id="ro-tb", tenant="bolt"))
    store.add_span(Span(span_id="sp-to", tenant="bolt"))  # an orphan call of tenant bolt
    assert span.tenant == "acme"
    assert [s.span_id for s in store.list_spans(tenant="bolt")] == ["sp-tb", "sp-to"]
    assert [s.span_id for s in store.list_spans(orphans=True, tenant="acme")] == []
    reward = store.add_reward(Reward(reward_id="rw-ta", rollout_id="ro-ta", value=1.0, tenant="acme"))
    assert reward.tenant == "acme" and store.list_rewards("ro-ta")[0].tenant == "acme"
    with pytest.raises(UserError, match="tenant"):
        store.enqueue_rollout(Rollout(tenant="Not/A@Tenant"))
