"""Benchmark scripts run (at a tiny size on CPU) and print what they promise."""

from __future__ import annotations

import importlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from types import ModuleType

import httpx
import pytest
from prerequisites import need_haproxy

ROOT = Path(__file__).resolve().parents[3]


def run_benchmark(script: str, *args: str, timeout_s: float = 300) -> str:
    """``python benchmarks/<script> <args>``: its stdout (a non-zero exit fails the test)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout_s,
    )
    return done.stdout


@pytest.mark.slow  # a real training run in a subprocess (~30 s on 2 busy cores)
def test_train_throughput_tiny_reports_tokens_per_second_and_mfu() -> None:
    out = run_benchmark("train_throughput.py", "--tiny")
    result = json.loads(out[: out.rindex("}") + 1])
    assert result["tokens_per_s"] > 0 and result["matmul_peak_tflops"] > 0
    assert 0 < result["mfu"] < 1.5, result  # measured against a peak from the same run
    assert "MFU" in out.splitlines()[-1]


@pytest.mark.slow  # a real training run in a subprocess (~30 s on 2 busy cores)
def test_update_memory_tiny_prints_peak_and_micro_batches_per_arm() -> None:
    """``benchmarks/update_memory.py`` on the tiny model: 4 and 16 rollouts (group 4), the new arm split into
    micro-batches of at most 8 rows, the old arm in one, and skipped where its estimate passes the cap."""
    from tiny_model import tiny_model

    out = run_benchmark(
        "update_memory.py",
        "--model",
        str(tiny_model()),
        "--rollouts",
        "4",
        "16",
        "--group-size",
        "4",
        "--prompt-tokens",
        "24",
        "--tail-tokens",
        "6",
        "--completion-tokens",
        "9",
        "--old-cap-gb",
        "0.001",
        timeout_s=600,
    )
    lines = out.strip().splitlines()
    assert "24 prompt + 9 completion tokens" in lines[-4] and "peak GB" in lines[-3]
    four, sixteen = (line.split("|") for line in lines[-2:])
    assert four[0].strip() == "4" and sixteen[0].strip() == "16"
    new4, new16, old4 = (cell.split() for cell in (four[1], sixteen[1], four[2]))
    assert (new4[0], new16[0], old4[0]) == ("1", "2", "1"), "micro-batches: 4 rows in one, 16 in two of 8"
    assert all(
        float(cells[1]) > 0.1 and cells[2] == "GB" and float(cells[3]) > 0 for cells in (new4, new16, old4)
    )
    assert "skipped: would exceed 0.001 GB (est." in sixteen[2]


@pytest.mark.slow
def test_gateway_benchmark_reports_ratio_cpu_and_sent_equals_stored() -> None:
    """One run of ``benchmarks/gateway.py`` with every phase it has (``--lean``, ``--dialects``) at one client
    count, two rounds, the gateway in mask mode on new personal data every call (the serving default, and
    the figure issue 36 sets a target for): each phase answers without error, and every answered gateway
    call left its span."""
    out = run_benchmark(
        "gateway.py",
        "--clients",
        "2",
        "--seconds",
        "0.5",
        "--warmup-s",
        "0.2",
        "--rounds",
        "2",
        "--lean",
        "--dialects",
        "--privacy",
        "mask",
        "--unique",
        "--pii",
        "--json",
    )
    phases = json.loads(out.strip().splitlines()[-1])
    # direct, direct with the gateway's capture options, gateway, the byte-copying relay (the floor) and the
    # leanest capture proxy; 2 rounds of plain and streamed; then the dialect phases
    chat, others = phases[:20], phases[20:]
    assert [ph["round"] for ph in chat] == [1] * 10 + [2] * 10  # rounds alternate within a client count
    engine_cpu: dict[str, float] = {}
    for direct, captured, gateway, relay, lean in zip(*(chat[i::5] for i in range(5)), strict=True):
        targets = tuple(ph["target"] for ph in (direct, captured, gateway, relay, lean))
        assert targets == ("direct", "direct+capture", "gateway", "relay", "lean")
        for ph in (direct, captured, gateway, relay):
            assert ph["errors"] == 0 and ph["req_per_s"] > 0 and ph["engine_cpu_ms_per_req"] >= 0, ph
            engine_cpu[ph["target"]] = engine_cpu.get(ph["target"], 0.0) + ph["engine_cpu_ms_per_req"]
        assert gateway["answered"] == gateway["spans_stored"] > 0  # every answered call left its span
        assert gateway["cpu_ms_per_req"] > 0 and relay["cpu_ms_per_req"] > 0
        assert lean["errors"] == 0 and lean["req_per_s"] > 0 and lean["cpu_ms_per_req"] > 0, lean
        assert lean["answered"] == lean["spans_stored"] > 0  # every answered call left its row
    # the engine's CPU is read in clock ticks (10 ms): one phase of 2 calls on a busy host may read 0, all four not
    assert len(engine_cpu) == 4 and all(v > 0 for v in engine_cpu.values()), engine_cpu
    assert "median over rounds:" in out
    assert "floor at 2 clients, plain: a byte-copying relay reaches " in out
    assert "streaming/non-streaming CPU cost at 2 clients" in out and "(median; rounds: " in out
    assert (
        "the same ratio of the byte-copying relay: " in out
        and ", of the engine answering direct+capture: " in out
    )
    for mode in ("plain", "streamed"):
        assert f"lean capture at 2 clients, {mode}: the leanest capture proxy reaches " in out
    assert ", of the leanest capture proxy: " in out and " errors; the gateway reaches " in out
    assert sorted((ph["target"], ph["stream"], ph["round"]) for ph in others) == sorted(
        (f"gateway-{d}", s, r) for d in ("responses", "messages") for s in (False, True) for r in (1, 2)
    )
    for ph in others:  # every call through a dialect route answered and left its span
        assert ph["errors"] == 0 and ph["cpu_ms_per_req"] > 0 and ph["answered"] == ph["spans_stored"] > 0, ph
    assert "gateway-responses" in out and "gateway-messages" in out and "CPU ratio (rounds)" in out


@pytest.mark.slow
def test_store_benchmark_loses_nothing_on_every_backend_mode() -> None:
    out = run_benchmark("store.py", "--writers", "3", "--spans", "4", "--json")
    rows = json.loads(out.strip().splitlines()[-1])
    assert {(r["backend"], r["mode"]) for r in rows} >= {
        (b, m) for b in ("sqlite", "http-sqlite") for m in ("baseline", "batched", "pipelined")
    }
    for r in rows:
        assert r["spans"] == 12 and r["lost"] == r["duplicates"] == r["errors"] == 0, r
        assert r["spans_per_s"] > 0


@pytest.fixture
def gateway_bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    """``benchmarks/gateway.py`` and ``benchmarks/_spine.py`` imported fresh, and dropped after the test."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    names = ("gateway", "_spine", "lean_capture")
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield importlib.import_module("gateway"), importlib.import_module("_spine")
    for name in names:  # not left behind for other tests, pass or fail
        sys.modules.pop(name, None)


@pytest.mark.slow
def test_gateway_benchmark_workers_puts_replicas_behind_haproxy_and_stores_every_call() -> None:
    """``--workers 2``: two gateway replicas on one SQLite store behind HAProxy, beside direct calls; each row
    answers without error and every call the replicas answered left its span."""
    need_haproxy()
    args = ["--workers", "2", "--clients", "2", "--seconds", "0.3", "--warmup-s", "0.1", "--rounds", "1"]
    out = run_benchmark("gateway.py", *args, "--json")
    rows = json.loads(out.strip().splitlines()[-1])
    assert [(r["workers"], r["stream"]) for r in rows] == [(2, False), (2, True)]
    for row in rows:
        assert row["err"] == 0 and row["sent"] > 0 and row["spans"] == row["sent"], row
        assert row["via"] > 0 and row["cpu"] > 0 and row["haproxy_cpu"] >= 0, row
    assert "median over rounds:" in out


def test_gateway_benchmark_prompt_tokens_sets_the_prompt_the_engine_answers_with(
    gateway_bench: tuple[ModuleType, ModuleType],
) -> None:
    """``--prompt-tokens N``: every request carries an N-rule system message and the fake engine returns
    N prompt ids with every answer, as an engine does for an agent's long prompt."""
    bench, spine = gateway_bench

    asks_ids = {"capture": True}  # the gateway's capture options: the engine returns the prompt's ids
    body = json.loads(next(bench._bodies("base", False, False, False, prompt_tokens=300, **asks_ids)))
    system = body["messages"][0]["content"]
    assert system.count(" rule") == 300 and system.endswith(" rule299.")
    short = json.loads(next(bench._bodies("base", False, False, False, **asks_ids)))
    assert " rule" not in short["messages"][0]["content"]
    for prompt_tokens in (300, 0):
        engine = spine.ChildServer(
            bench.engine_script(prompt_tokens=prompt_tokens), spine.free_port(), "/v1/models"
        )
        try:
            answer = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=30).json()
        finally:
            engine.stop()
        if prompt_tokens:
            assert answer["prompt_token_ids"] == list(range(1000, 1300))
        else:  # the engine's own fake ids of the request's text
            assert answer["prompt_token_ids"] and len(answer["prompt_token_ids"]) != 300


@pytest.mark.slow
def test_otlp_export_benchmark_exports_a_span_per_answered_call() -> None:
    out = run_benchmark("otlp_export.py", "--clients", "1", "--seconds", "0.5", "--rounds", "1")
    assert "CPU ms/req off" in out
    got = [line for line in out.splitlines() if line.startswith("receiver got ")]
    assert len(got) == 1, out
    spans, answered = (int(w) for w in got[0].split() if w.isdigit())
    assert spans == answered > 0, got
    assert 'agentforge_otlp_dropped_total{reason="export_failed"} 0' in out


@contextmanager
def _lean_proxy(bench: ModuleType, spine: ModuleType, engine_code: str, db: str) -> Iterator[str]:
    """A fake engine running ``engine_code`` and the leanest capture proxy in front of it, storing into
    ``db``: yields the proxy's chat URL; both are stopped after."""
    engine = spine.ChildServer(engine_code, spine.free_port(), "/v1/models")
    try:
        proxy = spine.ChildServer(
            bench._LEAN.format(bench=str(ROOT / "benchmarks"), engine=str(engine.port), db=db),
            spine.free_port(),
            "/v1/models",
        )
        try:
            yield f"{proxy.url}/rollouts/r1/v1/chat/completions"
        finally:
            proxy.stop()
    finally:
        engine.stop()


def test_lean_capture_proxy_captures_strips_and_commits_each_call(
    gateway_bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """The leanest capture proxy does the work it stands for: the engine is asked for ids and log-probs, the
    client gets the answer without them (stream events too, ending with ``[DONE]``), and every call's ids,
    log-probs and text are committed before it is answered."""
    bench, spine = gateway_bench
    lean_mod = importlib.import_module("lean_capture")
    db = str(tmp_path / "lean.db")
    with _lean_proxy(bench, spine, bench.engine_script(answer="Thanks!"), db) as url:
        body = {**bench.BODY, "stream": False}
        plain = httpx.post(url, json=body, timeout=30).json()
        assert lean_mod.stored_rows(db) == 1  # committed before the answer
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=30) as r:
            assert r.headers["content-type"] == "text/event-stream"
            events = [line for line in r.iter_lines() if line]
        with closing(sqlite3.connect(db)) as conn:
            rows = [json.loads(row) for (row,) in conn.execute("select record from calls order by seq")]
    choice = plain["choices"][0]
    assert plain["model"] == "policy@v1" and choice["message"]["content"] == "Thanks!"
    assert "token_ids" not in choice and choice["logprobs"] is None and "prompt_token_ids" not in plain
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Thanks!"
    for c in chunks:  # no capture field, and no usage chunk the client did not ask for
        assert c["choices"] and "token_ids" not in c["choices"][0] and c["choices"][0]["logprobs"] is None
        assert "prompt_token_ids" not in c and c["model"] == "policy@v1"
    assert len(rows) == 2
    for row in rows:
        assert row["text"] == "Thanks!" and len(row["ids"]) == len(row["logprobs"]) == 2
        assert row["prompt_ids"] and row["request"]["return_token_ids"] is True
        assert row["usage"]["completion_tokens"] == 2
    assert rows[1]["request"]["stream_options"] == {"include_usage": True}


_FAILING_ENGINE = """
import sys, uvicorn
from agentforge.testing import ScriptedError, ScriptedTurn, ScriptedUpstream
up = ScriptedUpstream([ScriptedTurn("x", error=ScriptedError(status=400))], cycle=True)
uvicorn.run(up.app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


@pytest.mark.parametrize("stream", [False, True])
def test_lean_capture_proxy_stores_nothing_for_an_engine_error(
    gateway_bench: tuple[ModuleType, ModuleType], tmp_path: Path, stream: bool
) -> None:
    """An engine's error answer is no captured call: the proxy closes the client's connection (an error in the
    benchmark's count) and stores no row, plain or streamed."""
    bench, spine = gateway_bench
    lean_mod = importlib.import_module("lean_capture")
    db = str(tmp_path / "lean.db")
    with _lean_proxy(bench, spine, _FAILING_ENGINE, db) as url:
        for _ in range(2):  # the engine's connection is kept and reused after an error
            with pytest.raises(httpx.RemoteProtocolError):
                httpx.post(url, json={**bench.BODY, "stream": stream}, timeout=30).read()
    assert lean_mod.stored_rows(db) == 0


def test_learning_capture_arm_keys_and_first_samples_of_each_group() -> None:
    """``--capture-arms ...:group_size=k`` cuts each captured group to its first ``k`` samples (queue order,
    ``main_job.split_by_reward``) and re-splits them: a group whose spread lay only in its later samples no
    longer trains; bad keys are refused."""
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "benchmarks" / "learning.py")
    assert spec is not None and spec.loader is not None
    learning = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(learning)

    def group(*rewards: float | None) -> list[SimpleNamespace]:  # queued in reverse: the cut must sort
        made = [
            SimpleNamespace(rollout=SimpleNamespace(created_at=k), reward=r) for k, r in enumerate(rewards)
        ]
        return made[::-1]

    groups = {"late-spread": group(0, 0, 1, 0), "early": group(1, 0, 0, 0), "solved": group(1, 1, 0, 1)}
    spread, solved = learning._main_job().split_by_reward(groups, first=2)
    assert sorted(spread) == ["early"] and sorted(solved) == ["solved"]
    assert [r.rollout.created_at for r in spread["early"]] == [0, 1]
    assert learning.parse_capture_keys("group_size=8,success_bonus=1,part_credit=1") == {
        "negative_advantage_scale": 1.0,
        "success_bonus": 1.0,
        "group_size": 8.0,
        "part_credit": 1.0,
    }
    for bad in ("group_size=1", "group_size=2.5", "temperature=1", "success_bonus=-1"):
        with pytest.raises(ValueError):
            learning.parse_capture_keys(bad)
