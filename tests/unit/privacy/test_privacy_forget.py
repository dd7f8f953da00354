"""agentforge forget and retention on SQLite and PostgreSQL: a user's rows go (file bytes grepped after the
vacuum), other users' stay, a second run is harmless, the log holds no data, earlier exports are listed,
exports refuse spans that must stay, retention keeps aggregates."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from fixtures_store import PG_ENV
from typer.testing import CliRunner

from agentforge.cli import app
from agentforge.errors import NotFoundError
from agentforge.privacy.ledger import DELETIONS, EXPORTS
from agentforge.stores.forget import RETAINED_METRICS, ForgetReport, apply_retention, forget
from agentforge.stores.sql import SQLStore
from agentforge.trainers.replay import TraceFilter, export_jsonl
from agentforge.types import AttemptState, LLMCall, Reward, Rollout, Span, SpanKind, Task


def _rollout(
    store: SQLStore, user: str, marker: str, attributes: dict | None = None, **fields: object
) -> str:
    """A succeeded rollout of ``user`` with one attempt, one LLM span holding ``marker`` and a final reward."""
    rid = store.enqueue_rollout(Rollout(user_id=user, task=Task(input={"note": marker}), **fields)).rollout_id
    claimed = store.claim_rollout("w1")
    assert claimed is not None and claimed[0].rollout_id == rid
    llm = LLMCall(
        request={"messages": [{"role": "user", "content": f"my address is {marker}"}]},
        response_text=marker,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.1],
    )
    span = Span(
        rollout_id=rid,
        attempt_id=claimed[1].attempt_id,
        kind=SpanKind.llm,
        llm=llm,
        attributes=attributes or {},
    )
    store.add_span(span)
    store.add_reward(Reward(rollout_id=rid, value=1.0, final=True))
    store.finish_attempt(claimed[1].attempt_id, AttemptState.succeeded)
    return rid


def _files(url: str) -> bytes:
    path = Path(url.removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'traces.db'}"
    if not __import__("os").environ.get(PG_ENV):
        pytest.skip(f"needs {PG_ENV}")
    return request.getfixturevalue("pg_url")


def test_forget_a_user_everywhere_and_only_them(store_url: str, tmp_path: Path) -> None:
    with SQLStore(store_url) as store:
        alice = [_rollout(store, "alice_17", f"77 Alice Lane #{i} zq9") for i in range(2)]
        bob = _rollout(store, "bob_42", "12 Bob Street kw3")
        export_jsonl(store, tmp_path / "before.jsonl", TraceFilter(require_tokens=False))
        report = forget(store, users=["alice_17"])
        assert sorted(report.rollout_ids) == sorted(alice)
        assert report.deleted == {"spans": 2, "rewards": 2, "attempts": 2, "rollouts": 2}
        assert [e["path"] for e in report.exports_before] == [str(tmp_path / "before.jsonl")]
        assert [s.rollout_id for s in store.list_spans(rollout_id=bob)] == [bob]
        assert store.get_rollout(bob).user_id == "bob_42"
        again = forget(store, users=["alice_17"])  # idempotent
        assert again.rollout_ids == [] and again.deleted == {
            "spans": 0,
            "rewards": 0,
            "attempts": 0,
            "rollouts": 0,
        }
        log = [v.payload for v in store.list_resources(DELETIONS)]
        assert len(log) == 2 and log[0]["subject"] == "user" and "alice" not in json.dumps(log)
        assert len(store.list_resources(EXPORTS)) == 1
    if store_url.startswith("sqlite"):
        data = _files(store_url)
        assert b"Alice Lane" not in data and b"alice_17" not in data
        assert b"12 Bob Street kw3" in data


def _as_postgres(url: str, sql: str) -> str:
    """Run ``sql`` as the cluster's superuser through ``su postgres`` (the local cluster of
    ``scripts/start_postgres.sh``); skips the test where that is not possible (not root, not local)."""
    import os
    import shutil
    import subprocess

    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if os.geteuid() != 0 or parsed.host not in ("127.0.0.1", "localhost") or shutil.which("su") is None:
        pytest.skip(
            "reading PostgreSQL's table files needs root and the local cluster of scripts/start_postgres.sh"
        )
    command = f'psql -p {parsed.port or 5432} -d {parsed.database} -tAc "{sql}"'
    done = subprocess.run(
        ["su", "postgres", "-s", "/bin/bash", "-c", command], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _table_files(url: str) -> bytes:
    """The bytes of every file of the store's tables, their TOAST tables and their indexes, after a checkpoint
    (the shared buffers written out)."""
    _as_postgres(url, "CHECKPOINT")
    root = Path(_as_postgres(url, "SHOW data_directory"))
    relations = _as_postgres(
        url,
        "SELECT pg_relation_filepath(c.oid) FROM pg_class c WHERE c.relname LIKE 'af\\_%' "
        "OR c.oid IN (SELECT reltoastrelid FROM pg_class WHERE relname LIKE 'af\\_%') "
        "OR c.oid IN (SELECT indexrelid FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid "
        "WHERE t.relname LIKE 'af\\_%' OR t.oid IN (SELECT reltoastrelid FROM pg_class WHERE relname LIKE 'af\\_%'))",
    ).split()
    assert any("/" in r for r in relations), relations
    data = b""
    for relation in relations:
        for path in root.glob(f"{relation}*"):  # the main fork, its segments, free-space and visibility maps
            data += path.read_bytes()
    return data


@pytest.mark.postgres
@pytest.mark.parametrize("full", [True, False])
def test_forget_on_postgresql_leaves_no_text_in_the_table_files(pg_url: str, full: bool) -> None:
    """Issue 36, Medium: on PostgreSQL the default ``forget`` (``VACUUM FULL``, then a checkpoint) leaves none of
    the subject's text in the table, TOAST or index files (grepped as bytes, as the SQLite test greps its file);
    ``--no-full`` (a plain ``VACUUM``) leaves it there until the space is reused, as docs/privacy.md says: the
    check sees what it looks for."""
    with SQLStore(pg_url) as store:
        # long and incompressible, so PostgreSQL moves it to the TOAST table as written (not pglz-compressed)
        _rollout(store, "alice_17", "77 Alice Lane pgmark-a1 " + secrets.token_hex(2000))
        _rollout(store, "alice_17", "77 Alice Lane pgmark-a2")
        _rollout(store, "bob_42", "12 Bob Street pgmark-b2")
        before = _table_files(pg_url)
        assert b"pgmark-a1" in before and b"pgmark-a2" in before
        forget(store, users=["alice_17"], full=full)
        after = _table_files(pg_url)
    assert b"pgmark-b2" in after  # the other user's rows were written out and are read
    left = [m for m in (b"pgmark-a1", b"pgmark-a2", b"alice_17") if m in after]
    assert (left == []) is full, left


def _planner_statistics(store: SQLStore) -> str:
    """Every sampled value the planner keeps for the store's tables (``pg_stats``: what ``pg_statistic`` holds
    and the table's owner may read), as one text."""
    with store._tx.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT tablename, attname, most_common_vals::text, histogram_bounds::text FROM pg_stats "
            "WHERE schemaname = current_schema() AND starts_with(tablename, 'af_')"
        ).all()
    return repr(rows)


@pytest.mark.postgres
def test_forget_on_postgresql_leaves_no_value_in_the_planner_statistics(pg_url: str) -> None:
    """Issue 36, Medium (M6): ``ANALYZE`` copies sampled column values (most common values, histogram bounds) into
    ``pg_statistic``; after ``forget`` the subject's identity is in none of them, also once a table is left empty
    (where ``ANALYZE`` alone would keep the old values)."""
    with SQLStore(pg_url) as store:
        for i in range(12):
            _rollout(store, "alice_17", f"note {i}", session_id="sess-alice-9")
        for i in range(3):
            _rollout(store, f"bob_{i}", f"note b{i}")
        with store._tx.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for table in ("af_spans", "af_rewards", "af_attempts", "af_rollouts"):
                conn.exec_driver_sql(f"ANALYZE {table}")
        assert "alice_17" in _planner_statistics(store) and "sess-alice-9" in _planner_statistics(store)
        forget(store, users=["alice_17"])
        left = _planner_statistics(store)
        assert "alice_17" not in left and "sess-alice-9" not in left, left
        assert "bob_0" in left  # the statistics are there, drawn from the rows that stay
        forget(store, users=["bob_0", "bob_1", "bob_2"])  # every table empty now
        assert "bob_" not in _planner_statistics(store)


def test_exports_refuse_spans_that_must_stay_and_retention_keeps_aggregates(
    store_url: str, tmp_path: Path
) -> None:
    """Retention on SQLite and PostgreSQL: old rollouts and old orphan spans (calls that named no rollout)
    go, their text is in none of the store's files afterwards (SQLite's file and WAL; PostgreSQL's table,
    TOAST and index files, where the local cluster can be read), a fresh orphan and the aggregates stay."""
    url = store_url
    with SQLStore(url) as store:
        kept = _rollout(store, "u1", "ok text")
        held = _rollout(store, "u2", "held text", {"privacy": {"mode": "redact", "exportable": False}})
        old_orphan = store.add_span(Span(kind=SpanKind.llm, attributes={"prompt": "orphan text qv7"}))
        now_ = store.get_rollout(kept).created_at + 2 * 86400
        new_orphan = store.add_span(
            Span(attributes={"prompt": "fresh orphan"}, started_at=now_, ended_at=now_)
        )
        report = export_jsonl(store, tmp_path / "out.jsonl", TraceFilter(require_tokens=False))
        assert report.skipped == {"privacy: must not leave the store": 1}
        assert b"held text" not in (tmp_path / "out.jsonl").read_bytes()
        gone = apply_retention(store, 1, at=now_)
        assert sorted(gone.rollout_ids) == sorted([kept, held])
        assert (
            [s.span_id for s in store.list_spans(orphans=True)]
            == [new_orphan.span_id]
            != [old_orphan.span_id]
        )
        assert gone.deleted["orphan_spans"] == 1
        (metrics,) = store.list_resources(RETAINED_METRICS)
        (row,) = metrics.payload["aggregates"]
        assert (row["rollouts"], row["rewarded"], row["reward_mean"], row["state"]) == (
            2,
            2,
            1.0,
            "succeeded",
        )
    data = _files(url) if url.startswith("sqlite") else _table_files(url)
    assert b"fresh orphan" in data  # what stays is read: the check sees what it looks for
    assert b"held text" not in data and b"orphan text qv7" not in data


def test_forget_command(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'traces.db'}"
    with SQLStore(url) as store:
        rid = _rollout(store, "carol", "5 Carol Court")
    runner = CliRunner()
    result = runner.invoke(app, ["forget", "--rollout", rid, "--store-url", url])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["deleted"]["spans"] == 1
    bad = runner.invoke(app, ["forget", "--store-url", url])
    assert bad.exit_code == 2 and "--older-than-days" in bad.output


def test_serve_refuses_a_bad_privacy_policy_before_starting_anything() -> None:
    runner = CliRunner()
    bad_mode = runner.invoke(app, ["serve", "--privacy", "hide"])
    assert bad_mode.exit_code == 2 and "unknown privacy mode 'hide'" in bad_mode.output
    bad_pattern = runner.invoke(app, ["serve", "--privacy-pattern", "ACCOUNT=ACME-("])
    assert bad_pattern.exit_code == 2 and "not a valid regex" in bad_pattern.output


def test_forget_follows_the_identity_the_application_set_not_client_metadata(store_url: str) -> None:
    """Issue 36, High 3: mallory put alice's session and user ids in her own rollout's metadata and task.
    ``forget --session/--user`` deletes alice's rollout and spans (found by the rollout's session_id / user_id,
    set by the application), keeps mallory's and reports it as named only in client-written fields."""
    with SQLStore(store_url) as store:
        alice = _rollout(store, "alice_17", "77 Alice Lane zq9", session_id="s-alice")
        mallory = store.enqueue_rollout(
            Rollout(
                user_id="mallory",
                session_id="s-mallory",
                metadata={"session_id": "s-alice", "user": "alice_17"},
                task=Task(input={"user_id": "alice_17"}),
            )
        ).rollout_id
        report = forget(store, sessions=["s-alice"], vacuum=False)
        assert report.rollout_ids == [alice] and report.deleted["spans"] == 1
        assert report.named_in_metadata == [mallory]
        assert store.get_rollout(mallory).user_id == "mallory"
        with pytest.raises(NotFoundError):
            store.get_rollout(alice)
        again = forget(store, users=["alice_17"], vacuum=False)
        assert again.rollout_ids == [] and again.named_in_metadata == [mallory]
        assert again.residue and "not erased" in again.residue[0]  # --no-vacuum says what it leaves
    result = CliRunner().invoke(app, ["forget", "--user", "alice_17", "--store-url", store_url])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout.strip().splitlines()[-1])
    assert printed["named_in_metadata"] == [mallory]
    if store_url.startswith("sqlite"):  # VACUUM and a truncated WAL leave nothing
        assert printed["residue"] == []
    else:  # the cluster's WAL settings (the test cluster recycles segments): said, each with its setting
        assert printed["residue"] and all(r.startswith("WAL: ") for r in printed["residue"])


def test_a_store_file_made_before_the_subject_columns_gets_them(tmp_path: Path) -> None:
    """Opening a store file whose rollouts table lacks ``user_id`` / ``session_id`` adds them (rows keep NULL)."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'old.db'}"
    with SQLStore(url) as store:
        old = store.enqueue_rollout(Rollout()).rollout_id
    conn = sqlite3.connect(tmp_path / "old.db")
    for column in ("user_id", "session_id"):
        conn.execute(f"DROP INDEX ix_af_rollouts_{column}")
        conn.execute(f"ALTER TABLE af_rollouts DROP COLUMN {column}")
    conn.commit()
    conn.close()
    with SQLStore(url) as store:
        assert store.get_rollout(old).user_id is None
        new = store.enqueue_rollout(Rollout(user_id="u-1", session_id="s-1")).rollout_id
        assert forget(store, users=["u-1"], vacuum=False).rollout_ids == [new]


def _wal_files(url: str) -> bytes:
    """The bytes of every file in the cluster's ``pg_wal`` directory (recycled segments included)."""
    root = Path(_as_postgres(url, "SHOW data_directory")) / "pg_wal"
    return b"".join(p.read_bytes() for p in root.iterdir() if p.is_file())


def _forget_one(url: str) -> tuple[ForgetReport, bool]:
    """Store a rollout with a fresh marker, forget its user; returns the report and whether the marker is still
    in a WAL file."""
    with SQLStore(url) as store:
        marker = "walmark-" + secrets.token_hex(8)
        _rollout(store, "alice_17", f"77 Alice Lane {marker}")
        _rollout(store, "bob_42", "12 Bob Street")
        assert marker.encode() in _wal_files(
            url
        )  # the insert is in the WAL: the check sees what it looks for
        report = forget(store, users=["alice_17"])
    return report, marker.encode() in _wal_files(url)


@pytest.mark.postgres
def test_forget_on_postgresql_removes_the_wal_segments_that_hold_the_text(pg_url: str) -> None:
    """Issue 36, Medium (M6): the WAL holds a deleted row's text (as inserted, and in the full-page images the
    delete writes). A role without the rights to checkpoint and switch segments leaves it there, and the report
    names both grants. With them and ``wal_recycle = off``, ``forget`` leaves it in no file of ``pg_wal`` and
    reports nothing; with ``wal_recycle = on`` the old segments are renamed for reuse with their bytes, and the
    report names that setting. (One test: the grants and the setting are the cluster's.)"""
    from sqlalchemy.engine import make_url

    role = make_url(pg_url).username
    grants = (f"pg_checkpoint TO {role}", f"EXECUTE ON FUNCTION pg_switch_wal() TO {role}")
    try:
        for grant in grants:
            _as_postgres(pg_url, f"GRANT {grant}")
        for recycle in ("off", "on"):
            _as_postgres(pg_url, f"ALTER SYSTEM SET wal_recycle = {recycle}")
            _as_postgres(pg_url, "SELECT pg_reload_conf()")
            report, left = _forget_one(pg_url)
            if recycle == "off":
                assert not left
                assert report.residue == [], report.residue
            else:
                assert left and len(report.residue) == 1 and "wal_recycle" in report.residue[0], (
                    report.residue
                )

        for grant in grants:
            _as_postgres(pg_url, f"REVOKE {grant.replace(' TO ', ' FROM ')}")
        report, _ = _forget_one(pg_url)
        (rights,) = [r for r in report.residue if "may not checkpoint" in r]
        assert f"GRANT pg_checkpoint TO {role}" in rights and f"pg_switch_wal() TO {role}" in rights
    finally:
        for grant in grants:
            _as_postgres(pg_url, f"GRANT {grant}")
        _as_postgres(pg_url, "ALTER SYSTEM RESET wal_recycle")
        _as_postgres(pg_url, "SELECT pg_reload_conf()")
