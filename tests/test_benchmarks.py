"""Benchmark scripts run (at a tiny size on CPU) and print what they promise."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_train_throughput_tiny_reports_tokens_per_second_and_mfu() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--tiny"],
        capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    result = json.loads(out[: out.rindex("}") + 1])
    assert result["tokens_per_s"] > 0 and result["matmul_peak_tflops"] > 0
    assert 0 < result["mfu"] < 1.5, result  # measured against a peak from the same run
    assert "MFU" in out.splitlines()[-1]
