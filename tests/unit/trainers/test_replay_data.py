"""Trace replay data layer: selection with filters, JSONL export/import round trip, HF dataset export."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentforge.errors import NotFoundError, UserError
from agentforge.stores.sql import SQLStore
from agentforge.testing import fake_token_ids, memory_store
from agentforge.trainers.replay import (
    EmptySelectionError,
    TraceFilter,
    TraceFormatError,
    export_hf,
    export_jsonl,
    import_jsonl,
    select_traces,
    to_hf_dataset,
)
from agentforge.trainers.replay.jsonl import FORMAT
from agentforge.types import (
    AttemptState,
    LLMCall,
    Reward,
    Rollout,
    RolloutState,
    Span,
    SpanKind,
    Task,
    ToolCall,
)

ODD = "emoji 😀👩‍👩‍👧 CJK 漢字 RTL עברית combining é ZWJ\u200d BOM\ufeff curly “q” NUL\x00 lone\ud800 line\u2028sep"


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], SQLStore]]:
    """Factory of empty stores of one backend (in-memory, or a SQLite file per call)."""
    opened: list[SQLStore] = []

    def make() -> SQLStore:
        if request.param == "memory":
            s = memory_store()
        else:
            s = SQLStore(f"sqlite:///{tmp_path / f'store{len(opened)}.db'}")
        opened.append(s)
        return s

    yield make
    for s in opened:
        s.close()


def _llm_span(
    prompt: list[int], completion: list[int], *, version: str, rng: random.Random, **kw: Any
) -> Span:
    logprobs = [-rng.random() * 10 ** -rng.randint(0, 300) for _ in completion]
    return Span(
        kind=SpanKind.llm,
        name="chat",
        llm=LLMCall(
            model="policy",
            version=version,
            request={"messages": [{"role": "user", "content": ODD}], "temperature": 0.7},
            prompt_token_ids=prompt,
            completion_token_ids=completion,
            logprobs=logprobs,
            response_text=ODD,
            tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"q": "ü😀"}', parsed={"q": "ü😀"})],
            finish_reason="tool_calls",
            latency_s=0.123456789,
        ),
        **kw,
    )


def add_trace(
    store: SQLStore,
    *,
    reward: float | None = 1.0,
    agent: str = "triage",
    version: str = "policy@v3",
    span_versions: tuple[str, ...] | None = None,
    group_id: str | None = None,
    task_id: str | None = None,
    created_at: float | None = None,
    tokens: bool = True,
    llm: bool = True,
    retry: bool = False,
    fail: bool = False,
    huge: bool = False,
    seed: int = 0,
) -> Rollout:
    """One finished rollout: two continuing LLM calls (real token ids) around a tool span, then rewards."""
    rng = random.Random(seed)
    extra = {} if created_at is None else {"created_at": created_at, "updated_at": created_at + 1.5}
    ro = store.enqueue_rollout(
        Rollout(
            task=Task(task_id=task_id or f"task-{seed}", input={"question": ODD}),
            agent=agent,
            group_id=group_id,
            resources={"policy": version, "prompt:triage": "2"} if version else {},
            metadata={"odd": ODD, "nan": math.nan, "big": 2**70},
            **extra,
        )
    )
    claimed = store.claim_rollout("worker-1", agent=agent)
    assert claimed is not None and claimed[0].rollout_id == ro.rollout_id
    _, att = claimed
    if retry:  # a first attempt that failed after one span: its spans must not count
        store.add_span(
            Span(rollout_id=ro.rollout_id, attempt_id=att.attempt_id, name="dead", kind=SpanKind.tool)
        )
        store.finish_attempt(att.attempt_id, AttemptState.failed, error="boom ✗")
        _, att = store.claim_rollout("worker-2", agent=agent)  # type: ignore[misc]
    versions = span_versions or (version, version)
    prompt = [1, *fake_token_ids(f"system {seed}"), 2, *fake_token_ids(ODD)]
    first = [rng.randrange(50_000) for _ in range(7)]
    if llm:
        span = _llm_span(prompt, first, version=versions[0], rng=rng, rollout_id=ro.rollout_id)
        if not tokens:
            span.llm.prompt_token_ids = span.llm.completion_token_ids = span.llm.logprobs = None  # type: ignore[union-attr]
        store.add_span(span)
    payload = "x" * 1_000_000 + ODD if huge else ODD
    store.add_span(
        Span(
            rollout_id=ro.rollout_id,
            kind=SpanKind.tool,
            name="lookup",
            attributes={"result": payload, "inf": math.inf, "nan": math.nan, "nested": [1, 2.5, None, True]},
            ended_at=1.7e9 + 0.1,
        )
    )
    if llm:
        prompt2 = prompt + first + [4, *fake_token_ids("tool result")]
        second = [rng.randrange(50_000) for _ in range(5)]
        store.add_span(_llm_span(prompt2, second, version=versions[-1], rng=rng, rollout_id=ro.rollout_id))
    store.finish_attempt(att.attempt_id, AttemptState.failed if fail else AttemptState.succeeded)
    if fail:  # retries left: drive it to a terminal failure
        store.update_rollout(ro.rollout_id, state=RolloutState.cancelled)
    if reward is not None or seed % 2:
        store.add_reward(Reward(rollout_id=ro.rollout_id, name="partial", value=0.1 + seed / 3))
    store.add_reward(Reward(rollout_id=ro.rollout_id, value=reward, final=True, metadata={"why": ODD}))
    return store.get_rollout(ro.rollout_id)


# --- selection --------------------------------------------------------------------------------------


def test_select_filters_and_skip_counts() -> None:
    store = memory_store()
    a = add_trace(store, reward=0.9, created_at=100.0, group_id="g1", task_id="t1", seed=1)
    b = add_trace(store, reward=0.2, created_at=200.0, group_id="g1", task_id="t1", seed=2)
    c = add_trace(store, reward=1.0, created_at=300.0, agent="other", version="policy@v4", seed=3)
    add_trace(store, reward=None, created_at=400.0, seed=4)
    add_trace(store, reward=1.0, created_at=500.0, tokens=False, seed=5)
    add_trace(store, reward=1.0, created_at=600.0, llm=False, seed=6)

    sel = select_traces(store)
    assert [r.rollout_id for r in sel.records] == [a.rollout_id, b.rollout_id, c.rollout_id]
    assert sel.considered == 6
    assert sel.skipped == {"no reward": 1, "no token ids": 1, "no llm spans": 1}
    rec = sel.records[0]
    assert rec.reward == 0.9 and rec.policy_version == "policy@v3"
    assert len(rec.trajectories) == 1 and rec.trajectories[0].env_mask.count(0) > 0  # tool result merged
    assert [s.kind for s in rec.spans] == [SpanKind.llm, SpanKind.tool, SpanKind.llm]

    ids = lambda flt: [r.rollout_id for r in select_traces(store, flt, allow_empty=True).records]  # noqa: E731
    assert ids(TraceFilter(min_reward=0.5)) == [a.rollout_id, c.rollout_id]
    assert ids(TraceFilter(max_reward=0.5)) == [b.rollout_id]
    assert ids(TraceFilter(since=200.0, until=300.0)) == [b.rollout_id]
    assert ids(TraceFilter(agent="other")) == [c.rollout_id]
    assert ids(TraceFilter(task_ids=("t1",))) == [a.rollout_id, b.rollout_id]
    assert ids(TraceFilter(group_id="g1", limit=1)) == [a.rollout_id]
    assert ids(TraceFilter(resources={"policy": "policy@v4"})) == [c.rollout_id]
    assert ids(TraceFilter(resources={"prompt:triage": "2", "policy": "policy@v3"})) == [
        a.rollout_id,
        b.rollout_id,
    ]
    assert ids(TraceFilter(resources={"prompt:triage": "3"})) == []
    kept = select_traces(store, TraceFilter(require_reward=False, require_tokens=False))
    assert len(kept.records) == 6 and not kept.skipped
    assert {r.reward for r in kept.records if not r.trajectories} == {1.0}
    sel = select_traces(store, TraceFilter(min_reward=0.5, until=350.0), allow_empty=True)
    assert sel.skipped == {"reward below threshold": 1, "after until": 3}
    capped = select_traces(store, TraceFilter(max_per_task=1), allow_empty=True)
    assert [r.rollout_id for r in capped.records] == [a.rollout_id, c.rollout_id]  # t1's oldest only
    assert capped.skipped["over per-task cap"] == 1
    with pytest.raises(UserError, match="max_per_task must be >= 1"):
        TraceFilter(max_per_task=0)


def test_select_states_retries_and_groups() -> None:
    store = memory_store()
    ok = add_trace(store, retry=True, group_id="g", seed=1)
    add_trace(store, group_id="g", seed=2)
    failed = add_trace(store, fail=True, seed=3)
    add_trace(store, seed=4)
    sel = select_traces(store)
    assert sel.skipped == {"state": 1}
    retried = sel.records[0]
    assert retried.rollout_id == ok.rollout_id and "dead" not in [s.name for s in retried.spans]
    groups = sel.groups()
    assert [len(v) for v in groups.values()] == [2, 1] and list(groups)[0] == "g"
    both = select_traces(store, TraceFilter(states=(RolloutState.succeeded, RolloutState.cancelled)))
    assert failed.rollout_id in [r.rollout_id for r in both.records]


def test_policy_filter_checks_versions_recorded_on_spans() -> None:
    store = memory_store()
    mixed = add_trace(store, version="policy@v3", span_versions=("policy@v2", "policy@v3"), seed=1)
    unpinned = add_trace(store, version="", span_versions=("policy@v3", "policy@v3"), seed=2)
    sel = select_traces(store, TraceFilter(resources={"policy": "policy@v3"}))
    assert [r.rollout_id for r in sel.records] == [unpinned.rollout_id]
    assert sel.skipped == {"resource mismatch": 1}
    assert mixed.rollout_id not in [r.rollout_id for r in sel.records]


def test_empty_selection_error_names_filter_counts_and_fix() -> None:
    store = memory_store()
    add_trace(store, reward=0.1, seed=1)
    add_trace(store, tokens=False, seed=2)
    with pytest.raises(EmptySelectionError) as err:
        select_traces(store, TraceFilter(min_reward=0.5))
    msg = str(err.value)
    assert "min_reward=0.5" in msg and "0 of 2 rollouts kept" in msg
    assert "reward below threshold: 1" in msg and "no token ids: 1" in msg
    assert "lower min_reward" in msg and "require_tokens=False" in msg
    assert isinstance(err.value, UserError) and err.value.selection.considered == 2
    with pytest.raises(EmptySelectionError, match="check the store URL"):
        select_traces(memory_store(), TraceFilter(agent="nobody"))
    with pytest.raises(UserError, match="min_reward"):
        TraceFilter(min_reward=1.0, max_reward=0.0)


# --- JSONL round trip -------------------------------------------------------------------------------


def _fill(store: SQLStore) -> list[Rollout]:
    out = [add_trace(store, seed=i, group_id=f"g{i % 2}", retry=i == 1, huge=i == 2) for i in range(4)]
    out.append(add_trace(store, reward=None, seed=5))
    store.add_span(Span(name="orphan", attributes={"x": ODD}))  # no rollout: never exported
    return out


def test_jsonl_round_trip_is_byte_exact(make_store: Callable[[], SQLStore], tmp_path: Path) -> None:
    a, b = make_store(), make_store()
    _fill(a)
    flt = TraceFilter(require_reward=False)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    report = export_jsonl(a, first, flt)
    assert report.records == 5 and report.bytes == first.stat().st_size
    raw = first.read_bytes()
    assert raw.isascii() and raw.count(b"\n") == 5 and b"orphan" not in raw

    imported = import_jsonl(b, first)
    assert (imported.imported, imported.already_present, imported.skipped, imported.failed) == (5, 0, [], [])
    export_jsonl(b, second, flt)
    assert second.read_bytes() == raw

    for ra in a.list_rollouts():
        rb = b.get_rollout(ra.rollout_id)
        assert rb == ra and b.list_attempts(rb.rollout_id) == a.list_attempts(ra.rollout_id)
        sa, sb = a.list_spans(rollout_id=ra.rollout_id), b.list_spans(rollout_id=ra.rollout_id)
        assert [s.model_dump(exclude={"sequence", "attributes"}) for s in sa] == [
            s.model_dump(exclude={"sequence", "attributes"}) for s in sb
        ]
        assert json.dumps([s.attributes for s in sa]) == json.dumps([s.attributes for s in sb])  # NaN-safe
        for x, y in zip(sa, sb, strict=True):
            if x.llm:
                assert x.llm.logprobs == y.llm.logprobs and x.llm.prompt_token_ids == y.llm.prompt_token_ids
        rwa, rwb = a.list_rewards(ra.rollout_id), b.list_rewards(ra.rollout_id)
        assert [r.model_dump(exclude={"sequence"}) for r in rwa] == [
            r.model_dump(exclude={"sequence"}) for r in rwb
        ]
        # The training reward is the same reward (only its store-assigned sequence differs).
        fa, fb = a.final_reward(ra.rollout_id), b.final_reward(ra.rollout_id)
        assert fa is not None and fb is not None, ra.rollout_id
        assert fb.model_dump(exclude={"sequence"}) == fa.model_dump(exclude={"sequence"})
        assert b.list_spans(rollout_id=ra.rollout_id, valid_only=True) != [] and [
            s.span_id for s in a.list_spans(rollout_id=ra.rollout_id, valid_only=True)
        ] == [s.span_id for s in b.list_spans(rollout_id=ra.rollout_id, valid_only=True)]
    huge = next(s for s in b.list_spans() if len(json.dumps(s.attributes)) > 1_000_000)
    assert huge.attributes["result"].endswith(ODD)
    sel_a, sel_b = select_traces(a, flt), select_traces(b, flt)
    assert [r.trajectories for r in sel_a.records] == [r.trajectories for r in sel_b.records]

    again = import_jsonl(b, first)  # idempotent: nothing stored twice
    assert (again.imported, again.already_present) == (0, 5)
    assert len(b.list_spans()) == len(a.list_spans()) - 1  # all but the orphan
    assert not list(tmp_path.glob(".*tmp"))


def test_export_empty_selection_creates_no_file(tmp_path: Path) -> None:
    store = memory_store()
    add_trace(store, reward=0.0)
    with pytest.raises(EmptySelectionError, match="reward below threshold"):
        export_jsonl(store, tmp_path / "out.jsonl", TraceFilter(min_reward=1.0))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UserError, match="does not exist"):
        export_jsonl(store, tmp_path / "missing" / "out.jsonl")


def test_export_failure_leaves_target_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = memory_store()
    for i in range(3):
        add_trace(store, seed=i)
    target = tmp_path / "out.jsonl"
    target.write_bytes(b"previous\n")
    calls = {"n": 0}
    real = store.list_rewards

    def flaky(rollout_id: str) -> list[Reward]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("store went away")
        return real(rollout_id)

    monkeypatch.setattr(store, "list_rewards", flaky)
    with pytest.raises(RuntimeError, match="went away"):
        export_jsonl(store, target)
    assert target.read_bytes() == b"previous\n" and [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]
    monkeypatch.setattr(store, "list_rewards", real)
    assert export_jsonl(store, target, progress=True).records == 3 and target.read_bytes().count(b"\n") == 3


# --- bad input ----------------------------------------------------------------------------------------


def _bad_file(tmp_path: Path) -> tuple[Path, list[bytes]]:
    src = memory_store()
    for i in range(3):
        add_trace(src, seed=i)
    good = tmp_path / "good.jsonl"
    export_jsonl(src, good)
    lines = good.read_bytes().splitlines(keepends=True)
    obj = json.loads(lines[1])
    wrong_tag = json.dumps({**obj, "format": "agentforge.trace/9"}).encode() + b"\n"
    missing = json.dumps({k: v for k, v in obj.items() if k != "spans"}).encode() + b"\n"
    bad_state = json.dumps({**obj, "rollout": {**obj["rollout"], "state": "exploded"}}).encode() + b"\n"
    spans = [{**obj["spans"][0], "rollout_id": "ro-other"}, *obj["spans"][1:]]
    foreign = json.dumps({**obj, "spans": spans}).encode() + b"\n"
    nul_id = json.dumps({**obj, "rollout": {**obj["rollout"], "error": "a\x00b"}}).encode() + b"\n"
    bad = tmp_path / "bad.jsonl"
    content = [
        lines[0],  # 1 ok
        lines[1][: len(lines[1]) // 2] + b"\n",  # 2 truncated JSON
        wrong_tag,  # 3
        missing,  # 4
        b"\xff\xfe not utf-8 \x80\n",  # 5
        b"\n",  # 6 blank: ignored
        bad_state,  # 7
        foreign,  # 8
        b"[1, 2]\n",  # 9
        nul_id,  # 10
        lines[0],  # 11 duplicate of line 1
        lines[2],  # 12 ok
    ]
    bad.write_bytes(b"".join(content))
    return bad, lines


def test_import_skips_bad_lines_with_line_numbers(tmp_path: Path) -> None:
    bad, lines = _bad_file(tmp_path)
    dst = memory_store()
    report = import_jsonl(dst, bad)
    assert report.imported == 2 and report.lines == 11 and report.failed == []
    got = {p.line: p.reason for p in report.skipped}
    assert got == {
        2: "invalid json",
        3: "wrong format",
        4: "missing fields",
        5: "not utf-8",
        7: "invalid record",
        8: "inconsistent record",
        9: "invalid json",
        10: "inconsistent record",
        11: "duplicate",
    }
    assert "spans" in next(p.detail for p in report.skipped if p.line == 4)
    assert "NUL" in next(p.detail for p in report.skipped if p.line == 10)
    assert report.skip_counts["inconsistent record"] == 2
    ids = {json.loads(lines[i])["rollout"]["rollout_id"] for i in (0, 2)}
    assert {r.rollout_id for r in dst.list_rollouts()} == ids
    assert {s.rollout_id for s in dst.list_spans()} == ids  # nothing of a skipped line was written


def test_import_raise_mode_validates_everything_first(tmp_path: Path) -> None:
    bad, _ = _bad_file(tmp_path)
    dst = memory_store()
    with pytest.raises(TraceFormatError, match=r"9 invalid line\(s\).*line 2: invalid json"):
        import_jsonl(dst, bad, on_error="raise")
    assert dst.list_rollouts() == [] and dst.list_spans() == []
    with pytest.raises(UserError, match="does not exist"):
        import_jsonl(dst, tmp_path / "nope.jsonl")
    with pytest.raises(UserError, match="on_error"):
        import_jsonl(dst, bad, on_error="ignore")  # type: ignore[arg-type]


def test_import_store_write_failure_is_reported_and_atomic(tmp_path: Path) -> None:
    src = memory_store()
    first, second = add_trace(src, seed=1), add_trace(src, seed=2)
    path = tmp_path / "t.jsonl"
    export_jsonl(src, path)
    dst = memory_store()
    clash = src.list_spans(rollout_id=second.rollout_id)[-1]
    squatter = dst.enqueue_rollout(Rollout())
    dst.add_span(clash.model_copy(update={"rollout_id": squatter.rollout_id, "attempt_id": None}))
    report = import_jsonl(dst, path)
    assert report.imported == 1 and [(p.line, p.reason) for p in report.failed] == [(2, "store write failed")]
    assert "already exists" in report.failed[0].detail
    with pytest.raises(NotFoundError):  # nothing of the failed record was written
        dst.get_rollout(second.rollout_id)
    assert dst.list_rewards(first.rollout_id)
    with pytest.raises(UserError, match=r"line 2 of .*\(1 earlier imported; re-run to resume\)"):
        import_jsonl(memory_store_with(clash), path, on_error="raise")


def memory_store_with(span: Span) -> SQLStore:
    store = memory_store()
    holder = store.enqueue_rollout(Rollout())
    store.add_span(span.model_copy(update={"rollout_id": holder.rollout_id, "attempt_id": None}))
    return store


def test_import_needs_a_store_that_can_import(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    src = memory_store()
    add_trace(src)
    export_jsonl(src, path)

    class ReadOnly:
        pass

    with pytest.raises(UserError, match="cannot import traces"):
        import_jsonl(ReadOnly(), path)  # type: ignore[arg-type]
    assert json.loads(path.read_bytes())["format"] == FORMAT


# --- Hugging Face datasets ------------------------------------------------------------------------------


def test_hf_dataset_columns_and_save_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    store = memory_store()
    for i in range(3):
        add_trace(store, reward=i / 2, group_id="g", seed=i)
    sel = select_traces(store)
    ds = to_hf_dataset(sel)
    assert len(ds) == 3
    for col in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "rollout_id", "group_id"):
        assert col in ds.column_names
    for col in ("task_id", "agent", "policy_version", "created_at"):
        assert col in ds.column_names
    for row, rec in zip(ds, sel.records, strict=True):
        traj = rec.trajectories[0]
        assert row["prompt_ids"] == traj.prompt_ids and row["completion_ids"] == traj.completion_ids
        assert len(row["logprobs"]) == len(row["env_mask"]) == len(row["completion_ids"])
        assert row["logprobs"] == traj.logprobs  # float64: bit-exact
        assert row["reward"] == rec.reward and row["policy_version"] == "policy@v3"
        assert row["created_at"] == rec.rollout.created_at and row["group_id"] == "g"
    out = tmp_path / "ds"
    report = export_hf(store, out)
    assert (report.records, report.rows) == (3, 3)
    loaded = datasets.load_from_disk(str(out))
    assert loaded.column_names == ds.column_names and loaded["completion_ids"] == ds["completion_ids"]
    export_hf(store, out, TraceFilter(limit=1))  # replaces the directory
    assert len(datasets.load_from_disk(str(out))) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    with pytest.raises(EmptySelectionError):
        export_hf(store, tmp_path / "none", TraceFilter(min_reward=5.0))
    assert not (tmp_path / "none").exists()
    assert len(to_hf_dataset([])) == 0
