"""``submit_many(items, stored=False)`` on every backend: a flush that only checks for errors gets ``None`` for
each stored span (no stored copy is built), errors as usual, and the spans are stored all the same."""

from __future__ import annotations

from agentforge.errors import NotFoundError, UserError
from agentforge.stores.base import TraceStore
from agentforge.types import Rollout, Span, Task


def test_a_flush_without_stored_copies_writes_everything_and_reports_errors(store: TraceStore) -> None:
    rollout = store.enqueue_rollout(Rollout(task=Task(input={"q": 1}), agent="flush"))
    claimed = store.claim_rollout("w", agent="flush")
    assert claimed is not None
    earlier = store.add_span(Span(rollout_id=rollout.rollout_id, name="earlier"))
    spans = [Span(rollout_id=rollout.rollout_id, name=f"f{i}") for i in range(40)]
    bad = Span(rollout_id="ro-missing-flush", name="orphan of nothing")
    nul = Span(rollout_id=rollout.rollout_id, name="bad\x00name")
    items = [*spans[:20], bad, *spans[20:], nul, spans[0], earlier]
    outcomes = store.submit_many(items, stored=False).result(timeout=60)  # type: ignore[attr-defined]
    assert isinstance(outcomes[20], NotFoundError) and isinstance(outcomes[-3], UserError)
    assert outcomes[:20] + outcomes[21:41] == [None] * 40
    assert outcomes[-2] is None  # the repeated id within the flush: written once
    assert outcomes[-1] is None  # stored before: no copy either
    listed = store.list_spans(rollout_id=rollout.rollout_id)
    assert [sp.span_id for sp in listed] == [earlier.span_id, *[s.span_id for s in spans]]
    assert {sp.attempt_id for sp in listed} == {claimed[1].attempt_id}
