"""`replay import` does not trust the file (issue 16, medium 5): crafted rollouts never become work for
runners, out-of-vocabulary or negative token ids and non-finite or absurd rewards are refused with their line
numbers, and a deeply nested line is one bad line, not an aborted import.

Real components: a SQLite store, ``import_jsonl`` and the ``agentforge replay import`` command.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentforge.errors import UserError
from agentforge.stores.sql import SQLStore
from agentforge.trainers.replay import TraceFormatError, export_jsonl, import_jsonl
from agentforge.types import AttemptState, LLMCall, Reward, Rollout, RolloutState, Span, SpanKind, Task

VOCAB = 49152  # SmolLM2's vocabulary


def _exported(tmp_path: Path) -> dict[str, Any]:
    """One honest succeeded rollout (LLM span, final reward 1.0), as a decoded line of an export."""
    with SQLStore(f"sqlite:///{tmp_path / 'src.db'}") as src:
        ro = src.enqueue_rollout(Rollout(task=Task(input={"q": "2+2"})))
        claimed = src.claim_rollout("w-1")
        assert claimed is not None
        call = LLMCall(prompt_token_ids=[1, 2, 3], completion_token_ids=[40, 41], logprobs=[-0.1, -0.2])
        src.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.llm, llm=call))
        src.add_reward(Reward(rollout_id=ro.rollout_id, value=1.0, final=True))
        src.finish_attempt(claimed[1].attempt_id, AttemptState.succeeded)
        export_jsonl(src, tmp_path / "honest.jsonl")
    return json.loads((tmp_path / "honest.jsonl").read_bytes())


def _variant(obj: dict[str, Any], rollout_id: str, **changes: Any) -> dict[str, Any]:
    """``obj`` under a new rollout id (every id renamed), with top-level ``changes`` applied after."""
    text = json.dumps(obj)
    ids = [obj["rollout"]["rollout_id"], *(r[k] for key, k in _IDS for r in obj[key])]
    for old in ids:
        text = text.replace(old, f"{old}-{rollout_id}" if old != ids[0] else rollout_id)
    return {**json.loads(text), **changes}


_IDS = (("attempts", "attempt_id"), ("spans", "span_id"), ("rewards", "reward_id"))


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, allow_nan=True).encode() + b"\n"


def _crafted_file(tmp_path: Path) -> tuple[Path, dict[int, str]]:
    """A trace file of honest and crafted lines; returns it and the expected reason per bad line number."""
    obj = _exported(tmp_path)
    ro, (span,), (reward,) = obj["rollout"], obj["spans"], obj["rewards"]

    def with_llm(rid: str, **llm: Any) -> dict[str, Any]:
        v = _variant(obj, rid)
        v["spans"][0]["llm"] = {**v["spans"][0]["llm"], **llm}
        return v

    def with_reward(rid: str, value: float) -> dict[str, Any]:
        v = _variant(obj, rid)
        v["rewards"][0]["value"] = value
        return v

    stale = {"state": "running", "heartbeat_at": 1.0, "ended_at": None}  # a worker long gone
    queued = _variant(obj, "ro-queued", rollout={**ro, "rollout_id": "ro-queued", "state": "queued"})
    queued["attempts"], queued["spans"], queued["rewards"] = [], [], []
    running = _variant(obj, "ro-running")
    running["rollout"]["state"] = "running"
    running["attempts"] = [{**running["attempts"][0], **stale}]
    ended_but_running = _variant(obj, "ro-half")
    ended_but_running["attempts"] = [{**ended_but_running["attempts"][0], **stale}]
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    nested = _variant(obj, "ro-nested")
    nested["rollout"]["task"]["input"] = {"deep": deep}
    lines: list[tuple[bytes, str | None]] = [
        (_line(obj), None),  # 1: the honest line
        (_line(queued), "unfinished rollout"),  # 2
        (_line(running), "unfinished rollout"),  # 3
        (_line(ended_but_running), "unfinished rollout"),  # 4
        (_line(with_llm("ro-neg", completion_token_ids=[40, -7])), "bad token ids"),  # 5
        (_line(with_llm("ro-oov", prompt_token_ids=[1, VOCAB + 10, 3])), "bad token ids"),  # 6
        (_line(with_llm("ro-lp", logprobs=[-0.1, 3.5])), "bad token ids"),  # 7
        (_line(with_reward("ro-huge", 1e308)), "bad reward"),  # 8
        (_line(with_reward("ro-inf", float("inf"))), "bad reward"),  # 9
        (_line(with_reward("ro-minf", float("-inf"))), "bad reward"),  # 10
        (
            b'{"format": "agentforge.trace/1", "rollout": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n",
            "too deeply nested",
        ),
        (_line(nested), "too deeply nested"),  # 12
        (_line(_variant(obj, "ro-ok-2")), None),  # 13: honest lines after the bad ones still import
    ]
    path = tmp_path / "crafted.jsonl"
    path.write_bytes(b"".join(raw for raw, _ in lines))
    assert span["llm"]["completion_token_ids"] == [40, 41] and reward["value"] == 1.0
    return path, {n: why for n, (_, why) in enumerate(lines, start=1) if why is not None}


def test_crafted_lines_are_refused_with_their_line_numbers_and_nothing_becomes_work(tmp_path: Path) -> None:
    path, expected = _crafted_file(tmp_path)
    with SQLStore(f"sqlite:///{tmp_path / 'dst.db'}") as dst:
        report = import_jsonl(dst, path, vocab_size=VOCAB)
        assert {p.line: p.reason for p in report.skipped} == expected
        assert report.imported == 2 and report.failed == [] and report.lines == 13
        details = {p.line: p.detail for p in report.skipped}
        assert "queued" in details[2] and "-7" in details[5] and str(VOCAB + 10) in details[6]
        assert "1e+308" in details[8] and "inf" in details[9]
        imported = dst.list_rollouts()
        assert len(imported) == 2 and all(r.state is RolloutState.succeeded for r in imported)
        assert dst.list_rollouts(state=RolloutState.queued) == []
        assert dst.claim_rollout("runner-1") is None  # no imported line is work for a runner
        assert dst.requeue_stale(0.0) == []  # and no imported attempt runs with a stale heartbeat
        assert {r.value for ro in imported for r in dst.list_rewards(ro.rollout_id)} == {1.0}

        with pytest.raises(TraceFormatError, match=r"11 invalid line\(s\).*line 2: unfinished rollout"):
            import_jsonl(SQLStore("sqlite://"), path, vocab_size=VOCAB, on_error="raise")
        with pytest.raises(UserError, match="vocab_size"):
            import_jsonl(dst, path, vocab_size=0)


def test_the_store_refuses_to_import_unfinished_rollouts(tmp_path: Path) -> None:
    with SQLStore("sqlite://") as store:
        with pytest.raises(UserError, match="it is queued; import finished rollouts"):
            store.import_trace(Rollout(rollout_id="ro-q"), [], [])
        assert store.list_rollouts() == []


def test_replay_import_command_checks_ids_against_the_model_vocabulary(tmp_path: Path) -> None:
    path, expected = _crafted_file(tmp_path)
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    cli = [sys.executable, "-m", "agentforge.cli", "replay", "import", str(path), "--store-url", url]
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": VOCAB}))
    out = subprocess.run([*cli, "--model", str(model)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["imported"] == 2 and report["skipped"]["bad token ids"] == 3
    assert "line 6: bad token ids" in out.stderr and "line 11: too deeply nested" in out.stderr
    missing = subprocess.run(
        [*cli, "--model", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 2 and "--vocab-size" in missing.stderr
    # --vocab-size wins over the model: with 41 tokens the honest lines' id 41 is out of range too
    cli[-1] = f"sqlite:///{tmp_path / 'small.db'}"
    small = subprocess.run([*cli, "--vocab-size", "41"], capture_output=True, text=True, timeout=120)
    assert small.returncode == 2 and "holds no valid trace line" in small.stderr, small.stderr
    assert "line 1: bad token ids" in small.stderr and "line 2: unfinished rollout" in small.stderr
    assert len(expected) == 11
