"""Benchmark scripts run (at a tiny size on CPU) and print what they promise."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_train_throughput_tiny_reports_tokens_per_second_and_mfu() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--tiny"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    result = json.loads(out[: out.rindex("}") + 1])
    assert result["tokens_per_s"] > 0 and result["matmul_peak_tflops"] > 0
    assert 0 < result["mfu"] < 1.5, result  # measured against a peak from the same run
    assert "MFU" in out.splitlines()[-1]


@pytest.mark.slow
def test_gateway_benchmark_reports_ratio_cpu_and_sent_equals_stored() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gateway.py"), "--clients", "1", "4", "--seconds", "0.5", "--rounds", "2",
         "--json"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    phases = json.loads(out.strip().splitlines()[-1])
    # direct, direct with the gateway's capture options, gateway, and the byte-copying relay (the floor);
    # 1 and 4 clients; 2 rounds of plain and streamed
    assert len(phases) == 32
    assert [ph["round"] for ph in phases[:16]] == [1] * 8 + [2] * 8  # rounds alternate within a client count
    for direct, captured, gateway, relay in zip(*(phases[i::4] for i in range(4)), strict=True):
        targets = (direct["target"], captured["target"], gateway["target"], relay["target"])
        assert targets == ("direct", "direct+capture", "gateway", "relay")
        for ph in (direct, captured, gateway, relay):
            assert ph["errors"] == 0 and ph["req_per_s"] > 0 and ph["engine_cpu_ms_per_req"] > 0, ph
        assert gateway["answered"] == gateway["spans_stored"] > 0  # every answered call left its span
        assert gateway["cpu_ms_per_req"] > 0 and relay["cpu_ms_per_req"] > 0
    assert "median over rounds:" in out
    assert "floor at 4 clients, plain: a byte-copying relay reaches " in out
    assert "streaming/non-streaming CPU cost at 4 clients" in out and "(median; rounds: " in out
    assert (
        "the same ratio of the byte-copying relay: " in out
        and ", of the engine answering direct+capture: " in out
    )


@pytest.mark.slow
def test_store_benchmark_loses_nothing_on_every_backend_mode() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "store.py"), "--writers", "3", "--spans", "4", "--json"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
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
    names = ("gateway", "_spine")
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield importlib.import_module("gateway"), importlib.import_module("_spine")
    for name in names:  # not left behind for other tests, pass or fail
        sys.modules.pop(name, None)


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
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "otlp_export.py"), "--clients", "1", "--seconds", "0.5",
         "--rounds", "1"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    assert "CPU ms/req off" in out
    got = [line for line in out.splitlines() if line.startswith("receiver got ")]
    assert len(got) == 1, out
    spans, answered = (int(w) for w in got[0].split() if w.isdigit())
    assert spans == answered > 0, got
    assert 'agentforge_otlp_dropped_total{reason="export_failed"} 0' in out
