"""The span writer's SQL spellings (agentforge.stores.sql_cursor): SQLite inserts in one statement per power of
two of the row count (so a handful of statement texts, each prepared once), lookups by one JSON array of ids
(rows packed into one result row) or, without SQLite's JSON functions, by ``IN`` lists; and the span table
without an ``attempt_id`` index, whose attempt lookups go through the rollout."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from agentforge.stores import sql_cursor
from agentforge.stores.sql import SQLStore
from agentforge.stores.sql_cursor import BatchCursor
from agentforge.types import LLMCall, Rollout, Span, SpanKind, Task


def _cursor(conn: sqlite3.Connection) -> BatchCursor:
    return BatchCursor(conn, create_engine("sqlite://").dialect)


@pytest.fixture
def conn() -> Iterator[sqlite3.Connection]:
    with closing(sqlite3.connect(":memory:", isolation_level=None)) as connection:
        yield connection


@pytest.mark.parametrize("rows", [1, 3, 700, 1500])
def test_sqlite_inserts_one_statement_per_power_of_two_in_order(rows: int, conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE t (seq INTEGER PRIMARY KEY, name TEXT, value REAL)")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    values = [v for i in range(rows) for v in (i + 1, f"n{i}", i / 4)]
    _cursor(conn).insert_rows("t", "seq, name, value", 3, values)
    inserts = [sql.count("), (") + 1 for sql in statements if sql.startswith("INSERT")]  # values expanded
    assert sum(inserts) == rows
    assert all(n & (n - 1) == 0 and n <= sql_cursor._SQLITE_MAX_ROWS for n in inserts)  # powers of two
    assert (
        len(inserts)
        == bin(rows % sql_cursor._SQLITE_MAX_ROWS).count("1") + rows // sql_cursor._SQLITE_MAX_ROWS
    )
    stored = conn.execute("SELECT seq, name, value FROM t ORDER BY rowid").fetchall()
    assert stored == [(i + 1, f"n{i}", i / 4) for i in range(rows)]


@pytest.mark.parametrize("json_functions", [True, False])
def test_sqlite_lookups_with_and_without_the_json_functions(
    json_functions: bool, conn: sqlite3.Connection
) -> None:
    conn.execute("CREATE TABLE a (id TEXT PRIMARY KEY, owner TEXT, n INTEGER)")
    conn.executemany(
        "INSERT INTO a VALUES (?, ?, ?)", [(f"id{i}", None if i % 3 else f"o{i}", i) for i in range(1200)]
    )
    cur = _cursor(conn)
    cur._json = json_functions
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    ids = [f"id{i}" for i in range(0, 1200, 2)] + ["id-missing"]
    expected = {(f"id{i}", None if i % 3 else f"o{i}", i) for i in range(0, 1200, 2)}
    for packed in (False, True):
        statements.clear()
        rows = list(cur.rows_in("id, owner, n", "FROM a WHERE id {in_ids}", ids, packed=packed))
        assert sorted(rows) == sorted(expected) and len(rows) == len(expected)
        # with the JSON functions: one statement whatever the number of ids; without: IN lists of 500 ids
        assert len(statements) == (1 if json_functions else 2)
    assert list(cur.rows_in("id", "FROM a WHERE id {in_ids}", [])) == []


def test_spans_are_written_and_found_the_same_without_the_json_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_cursor, "_sqlite_json", lambda: False)
    with SQLStore(f"sqlite:///{tmp_path / 'nojson.db'}") as store:
        rollout = store.enqueue_rollout(Rollout(task=Task(input={"q": 1}), agent="a"))
        claimed = store.claim_rollout("w", agent="a")
        assert claimed is not None
        spans = [Span(rollout_id=rollout.rollout_id, kind=SpanKind.llm, name=f"s{i}") for i in range(30)]
        first = store.submit_many(spans).result(30)
        again = store.submit_many(spans[:3]).result(30)
        assert [s.attempt_id for s in first] == [claimed[1].attempt_id] * 30  # type: ignore[union-attr]
        assert [s.sequence for s in again] == [s.sequence for s in first[:3]]  # type: ignore[union-attr]
        assert [s.name for s in store.list_spans(attempt_id=claimed[1].attempt_id)] == [
            f"s{i}" for i in range(30)
        ]


def test_a_new_span_table_has_no_attempt_index_and_finds_an_attempts_spans(tmp_path: Path) -> None:
    path = tmp_path / "idx.db"
    with SQLStore(f"sqlite:///{path}") as store:
        rollouts = [store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="a")) for i in range(2)]
        attempts = {}
        for _ in rollouts:
            claimed = store.claim_rollout("w", agent="a")
            assert claimed is not None
            attempts[claimed[0].rollout_id] = claimed[1].attempt_id
        for r in rollouts:
            store.submit_many(
                [Span(rollout_id=r.rollout_id, name=f"{r.rollout_id}-{i}") for i in range(3)]
            ).result(30)
        for r in rollouts:
            listed = store.list_spans(attempt_id=attempts[r.rollout_id])
            assert [s.name for s in listed] == [f"{r.rollout_id}-{i}" for i in range(3)]
        other = attempts[rollouts[1].rollout_id]
        assert store.list_spans(rollout_id=rollouts[0].rollout_id, attempt_id=other) == []
    with closing(sqlite3.connect(path)) as conn:
        names = [row[1] for row in conn.execute("PRAGMA index_list(af_spans)")]
        indexed = {row[2] for name in names for row in conn.execute(f"PRAGMA index_info({name})")}
    assert indexed == {"span_id", "rollout_id"}


def test_json_columns_prepared_as_utf8_bytes_are_stored_as_the_same_text(tmp_path: Path) -> None:
    path = tmp_path / "utf8.db"
    texts = ["plain", "emoji ✨ and CJK 漢字", "nul \x00 inside", "lone \ud800 surrogate", 'quote " and \\']
    spans = [
        Span(
            kind=SpanKind.llm,
            name=f"s{i}",
            llm=LLMCall(model="m", response_text=text, prompt_token_ids=[1, 2], logprobs=[-0.5]),
            attributes={"note": text, "nan": math.nan},
        )
        for i, text in enumerate(texts)
    ]
    with SQLStore(f"sqlite:///{path}") as store:
        assert store.submit_many(spans, stored=False).result(30) == [None] * len(spans)
        listed = store.list_spans(orphans=True)
    assert [s.llm.response_text for s in listed] == texts  # type: ignore[union-attr]
    assert [s.attributes["note"] for s in listed] == texts
    assert all(math.isnan(s.attributes["nan"]) for s in listed)
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT typeof(llm_json), typeof(attributes_json), llm_json FROM af_spans"
        ).fetchall()
    assert {(a, b) for a, b, _ in rows} == {("text", "text")}  # text, not blobs, for every reader
    assert [LLMCall.model_validate(json.loads(text)).response_text for *_, text in rows] == texts


def test_a_span_batch_looks_everything_up_in_one_statement_and_numbers_continue(tmp_path: Path) -> None:
    from agentforge.stores.sql_batch import write_spans
    from agentforge.types import Reward

    path = tmp_path / "lookups.db"
    with SQLStore(f"sqlite:///{path}") as store:
        rollouts = [store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="a")) for i in range(3)]
        claimed = store.claim_rollout("w", agent="a")
        assert claimed is not None
        first = store.add_span(Span(rollout_id=rollouts[1].rollout_id, name="before"))
    by_attempt = Span(attempt_id=claimed[1].attempt_id, name="by attempt")  # its rollout found through it
    named = [Span(rollout_id=r.rollout_id, name=f"n{i}") for i, r in enumerate(rollouts[1:])]
    spans = [*named, by_attempt, first]
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        conn.execute("BEGIN IMMEDIATE")
        results = write_spans(conn, create_engine("sqlite://").dialect, spans)
        conn.execute("COMMIT")
    selects = [s for s in statements if s.startswith("SELECT")]
    # one lookup for the batch, the stored span's row (it was written before), the rollout named by its attempt
    assert len(selects) == 3 and not any("RETURNING" in s for s in statements)
    assert [r.sequence for r in results] == [first.sequence + k for k in (1, 2, 3)] + [first.sequence]  # type: ignore[union-attr, operator]
    assert results[2].rollout_id == claimed[0].rollout_id == rollouts[0].rollout_id  # type: ignore[union-attr]
    assert results[-1] == first
    with SQLStore(f"sqlite:///{path}") as store:  # the counter moved: the next number follows the batch's
        reward = store.add_reward(Reward(rollout_id=rollouts[1].rollout_id, value=1.0))
        assert reward.sequence == first.sequence + 4  # type: ignore[operator]
