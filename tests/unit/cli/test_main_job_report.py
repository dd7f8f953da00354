"""The main job's report (examples/main_job.py, `make demo`): per seed and per reward part, the promotion log per
seed, the reward curve PNG and results.json, from the numbers a run produced."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow  # importing the example loads torch through the front door (~15 s here)


def _summary(version: str, tool: float, success: float, chosen: dict[str, int]) -> dict:
    gold = {"get_order_status": 10, "cancel_order": 10, "modify_order": 10}
    return {
        "version": version,
        "parts": {"tool": tool, "arguments": 1.0, "reply": 0.9, "success": success},
        "tools_chosen": chosen,
        "tools_gold": gold,
        "collapse_ratio": max(chosen.values()) / 10,
    }


def test_report_has_each_seed_each_part_and_each_decision(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("main_job_example", ROOT / "examples" / "main_job.py")
    assert spec is not None and spec.loader is not None
    main_job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(main_job)
    args = main_job.parse_args(["--out", str(tmp_path), "--seeds", "0", "1"])
    before = _summary("policy@v0", 0.6, 0.5, {"get_order_status": 21, "cancel_order": 9})
    decisions = [
        {
            "phase": "warm start",
            "step": 0,
            "stage": "eval",
            "outcome": "passed",
            "candidate": "policy@v1",
            "live": "policy@v0",
            "reason": "",
            "live_mean": 0.5,
            "candidate_mean": 0.75,
            "p": 0.03,
        },
        {
            "phase": "warm start",
            "step": 0,
            "stage": "promote",
            "outcome": "promoted",
            "candidate": "policy@v1",
            "live": "policy@v0",
            "reason": "",
            "live_mean": None,
            "candidate_mean": None,
            "p": None,
        },
        {
            "phase": "grpo",
            "step": 2,
            "stage": "eval",
            "outcome": "refused",
            "candidate": "policy@v2",
            "live": "policy@v1",
            "reason": "",
            "live_mean": 0.75,
            "candidate_mean": 0.7,
            "p": 0.8,
        },
    ]
    results = [
        {
            "seed": seed,
            "served": "policy@v1",
            "steps": 2,
            "train_s": 60.0,
            "promotions": decisions,
            "warm": {"examples": 15, "version": "policy@v1", "promoted": True},
            "history": [
                {"step": 1, "batch/reward_mean": 0.5, "batch/part/tool": 0.75},
                {"step": 2, "batch/reward_mean": 0.6, "batch/part/tool": 0.8},
            ],
            "after": _summary(
                "policy@v1", 0.9, after, {"get_order_status": 10, "cancel_order": 10, "modify_order": 10}
            ),
        }
        for seed, after in ((0, 0.8), (1, 0.7))
    ]
    held = {
        "policy@v0": before,
        "policy@v1": results[0]["after"],
        "policy@v2": _summary("policy@v2", 0.8, 0.72, {"get_order_status": 12, "cancel_order": 9}),
    }
    for r in results:
        r["lineage"] = main_job.lineage(decisions, held)
    wall = {"minutes": 19.5, "loadavg_start": (2.0, 2.0, 2.0), "loadavg_end": (2.1, 2.0, 2.0)}
    captured = {"n": 48, "parts": {"success": 0.3}, "successes_by_gold_tool": {"modify_order": 6}}
    main_job.report(args, before, results, wall, captured)
    report = (tmp_path / "report.md").read_text()
    assert "| seed 0 policy@v1 | 0.900 | 1.000 | 0.900 | 0.800 | +0.300 |" in report
    assert "| seed 1 policy@v1 | 0.900 | 1.000 | 0.900 | 0.700 | +0.200 |" in report
    assert "| mean | 0.900 | 1.000 | 0.900 | 0.750 | +0.250 |" in report
    assert "19.5 min" in report and "step 2: tool 0.800" in report
    assert "successes by gold tool {'modify_order': 6}" in report
    # every candidate beside its parent on held-out, the refused GRPO one included
    assert (
        "| 0 | warm start | 0 | policy@v1 | policy@v0 | 0.500 → 0.750 (-) | promoted | 0.500 → 0.800 | +0.300 |"
        in report
    )
    assert (
        "| 1 | grpo | 0 | policy@v2 | policy@v1 | 0.750 → 0.700 (-) | refused | 0.800 → 0.720 | -0.080 |"
        in report
    )
    assert "all GRPO candidates: mean -0.080 over 2" in report and "promoted GRPO versions" not in report
    log = (tmp_path / "promotions.md").read_text()
    assert (
        log.count("## seed") == 2
        and "| grpo | 2 | eval | refused | policy@v2 | policy@v1 | 0.750 | 0.700 | 0.800 |" in log
    )
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "lineage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "lineage.png" in (tmp_path / "report.md").read_text()
    saved = json.loads((tmp_path / "results.json").read_text())
    assert [r["after"]["parts"]["success"] for r in saved["results"]] == [0.8, 0.7] and saved["wall"][
        "minutes"
    ] == 19.5
