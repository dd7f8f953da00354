"""The group-commit writer (agentforge.stores.writer): order, per-item failures, whole-batch failures and the
asyncio path (submit_async), where a cancelled caller's item is still written."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from agentforge.errors import NotFoundError, StoreError, UserError
from agentforge.stores.writer import GroupCommitWriter


class _Log:
    """A write_batch that records batches; items named "bad" fail alone, "boom" fails the whole batch."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.batches: list[list[str]] = []
        self.gate = gate

    def __call__(self, items: Sequence[str]) -> list[str | BaseException]:
        if self.gate is not None:
            self.gate.wait(5)
        if "boom" in items:
            raise StoreError("database unreachable")
        self.batches.append(list(items))
        return [NotFoundError(f"no {i}") if i == "bad" else i.upper() for i in items]


def test_sync_and_async_callers_share_batches_in_order() -> None:
    gate = threading.Event()
    log = _Log(gate)
    writer: GroupCommitWriter[str, str] = GroupCommitWriter(log, "test-writer")

    async def main() -> list[object]:
        first = writer.submit("a")  # the writer thread takes it and waits at the gate
        await asyncio.sleep(0.05)
        futures = [writer.submit_async(x) for x in ("b", "bad", "c")]
        sync = writer.submit("d")
        gate.set()
        out: list[object] = [first.result(5)]
        for f in futures:
            try:
                out.append(await f)
            except NotFoundError as exc:
                out.append(exc)
        out.append(sync.result(5))
        return out

    out = asyncio.run(main())
    assert out[0] == "A" and out[1] == "B" and isinstance(out[2], NotFoundError) and out[3:] == ["C", "D"]
    assert [i for b in log.batches for i in b] == ["a", "b", "bad", "c", "d"]
    assert log.batches[1] == ["b", "bad", "c", "d"]  # group commit: everything queued meanwhile
    writer.close()


def test_cancelled_async_caller_is_still_written_and_batch_failure_reaches_every_caller() -> None:
    gate = threading.Event()
    log = _Log(gate)
    writer: GroupCommitWriter[str, str] = GroupCommitWriter(log, "test-writer")

    async def main() -> None:
        left = writer.submit_async("x")
        left.cancel()  # the caller left before the commit
        gate.set()
        ok = await writer.submit_async("y")
        assert ok == "Y"
        log.gate = hold = threading.Event()
        held = writer.submit_async("hold")  # the writer waits at the new gate with this one
        await asyncio.sleep(0.05)
        boom = [writer.submit_async("boom"), writer.submit_async("z")]  # queued together: one batch
        hold.set()
        assert await held == "HOLD"
        for f in boom:
            with pytest.raises(StoreError):
                await f

    asyncio.run(main())
    assert ["x"] in log.batches or any("x" in b for b in log.batches)
    writer.close()
    with pytest.raises(UserError):
        writer.submit("late")


def test_submit_many_one_future_across_batches_in_order_with_per_item_outcomes() -> None:
    gate = threading.Event()
    log = _Log(gate)
    writer: GroupCommitWriter[str, str] = GroupCommitWriter(log, "test-writer", max_batch=3)
    first = writer.submit("a")  # held at the gate, so the rest queues behind it
    time.sleep(0.05)
    many = writer.submit_many(["b", "bad", "c", "d", "e"])
    last = writer.submit("f")
    assert not many.done()
    gate.set()
    outcomes = many.result(5)
    assert first.result(5) == "A" and last.result(5) == "F"
    assert outcomes[0] == "B" and isinstance(outcomes[1], NotFoundError) and outcomes[2:] == ["C", "D", "E"]
    assert [i for b in log.batches for i in b] == ["a", "b", "bad", "c", "d", "e", "f"]
    assert max(len(b) for b in log.batches) <= 3  # split across batches, still one future
    assert writer.submit_many([]).result(5) == []
    writer.close()


def test_submit_many_whole_batch_failure_and_cancel_before_taken() -> None:
    gate = threading.Event()
    log = _Log(gate)
    writer: GroupCommitWriter[str, str] = GroupCommitWriter(log, "test-writer")
    first = writer.submit("a")
    time.sleep(0.05)  # the writer thread takes "a" alone and waits at the gate
    skipped = writer.submit_many(["x", "y"])
    failed = writer.submit_many(["p", "boom"])
    assert skipped.cancel()  # not taken yet: none of its items is written
    gate.set()
    assert first.result(5) == "A"
    outcomes = failed.result(5)
    assert all(isinstance(o, StoreError) for o in outcomes)  # the batch failed as a whole
    assert "x" not in [i for b in log.batches for i in b]
    writer.close()
    with pytest.raises(UserError):
        writer.submit_many(["z"])


def test_commit_delay_only_after_a_large_batch_without_a_backlog_and_the_next_batch_fills_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import agentforge.stores.writer as writer_module

    delays: list[float] = []
    real_sleep = time.sleep

    def sleep(seconds: float) -> None:  # the writer's commit delay: recorded, and long enough to queue behind
        delays.append(seconds)
        real_sleep(0.2)

    monkeypatch.setattr(writer_module, "_sleep", sleep)
    log = _Log()
    writer: GroupCommitWriter[str, str] = GroupCommitWriter(
        log, "test-writer", commit_delay_s=0.25, commit_siblings=3
    )
    assert [writer.submit(x).result(5) for x in ("a", "b")] == ["A", "B"]
    assert delays == []  # a lone caller's batches (1 item) never make the next one wait
    log.gate = hold = threading.Event()
    held = writer.submit("h")  # the writer waits at the gate with this one
    real_sleep(0.05)
    siblings = [writer.submit(x) for x in ("x1", "x2", "x3")]  # queued together: the next batch, 3 items
    log.gate = hold2 = threading.Event()  # ... which waits at a second gate
    hold.set()
    assert held.result(5) == "H"
    real_sleep(0.05)
    backlog = [writer.submit(x) for x in ("w1", "w2", "w3")]  # 3 queued when the 3-item batch commits
    hold2.set()
    assert [f.result(5) for f in siblings + backlog] == ["X1", "X2", "X3", "W1", "W2", "W3"]
    late = [writer.submit(x) for x in ("y1", "y2")]  # sent while the writer waits after the w batch
    assert [f.result(5) for f in late] == ["Y1", "Y2"]
    assert writer.submit("z").result(5) == "Z"
    # once: after the w batch (nothing queued behind it); not after x (a backlog of 3), nor after y (2 items)
    assert delays == [0.25]
    assert log.batches == [["a"], ["b"], ["h"], ["x1", "x2", "x3"], ["w1", "w2", "w3"], ["y1", "y2"], ["z"]]
    writer.close()


def test_commit_delay_arguments_are_checked() -> None:
    with pytest.raises(UserError, match="commit_delay_s"):
        GroupCommitWriter(_Log(), "w", commit_delay_s=-0.001)
    with pytest.raises(UserError, match="commit_siblings"):
        GroupCommitWriter(_Log(), "w", commit_siblings=0)


def test_sqlite_store_writer_waits_by_default_and_can_be_told_not_to() -> None:
    from agentforge.stores.sql import DEFAULT_COMMIT_DELAY_S, SQLStore

    with SQLStore("sqlite://") as store, SQLStore("sqlite://", commit_delay_s=0) as eager:
        assert store._writer.commit_delay_s == DEFAULT_COMMIT_DELAY_S > 0
        assert eager._writer.commit_delay_s == 0


def test_a_lone_caller_handing_over_many_items_at_once_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tracer flushing 10 spans at a time, one flush after another: each batch serves one caller."""
    import agentforge.stores.writer as writer_module

    delays: list[float] = []
    monkeypatch.setattr(writer_module, "_sleep", delays.append)
    log = _Log()
    writer: GroupCommitWriter[str, str] = GroupCommitWriter(log, "test-writer", commit_delay_s=0.25)
    for k in range(5):
        assert writer.submit_many([f"{k}-{i}" for i in range(10)]).result(5) == [
            f"{k}-{i}".upper() for i in range(10)
        ]
    assert delays == [] and [len(b) for b in log.batches] == [10] * 5
    writer.close()
