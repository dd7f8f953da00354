"""The triage job's final table (examples/triage_job.py) fits an 80-column terminal, names whole."""

from __future__ import annotations

import io

import pytest
from example_app import load_example
from rich.console import Console

pytestmark = pytest.mark.slow  # importing the example loads torch through the front door (~15 s here)


@pytest.fixture(scope="module")
def triage_job():  # type: ignore[no-untyped-def]
    return load_example("triage_job.py", "triage_job_example")


@pytest.mark.parametrize("alias", ["policy", "customer-service", "customer-service-bot"])
def test_the_final_table_fits_80_columns_and_never_cuts_a_version_name(triage_job, alias: str) -> None:
    results = [
        {
            "seed": seed,
            "version": f"{alias}@v{120 + seed}",
            "steps": 120,
            "train_s": 2563.0 + seed,
            "after": after,
            "top_answer": "cancellation_fee 31%",
        }
        for seed, after in [(0, 0.4733), (1, 0.46)]
    ]
    console = Console(file=io.StringIO(), width=80, record=True, color_system=None)
    console.print(triage_job.results_table(0.1867, f"{alias}@v0", "account 62%", results))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    for version in (f"{alias}@v0", f"{alias}@v120", f"{alias}@v121"):
        assert any(version in line.split() for line in lines), (version, text)  # whole, on one line
    assert "…" not in text
    rows = {
        words[0]: words for words in map(str.split, lines) if words and words[0] in {"base", "0", "1", "mean"}
    }
    assert rows["base"][1:5] == [f"{alias}@v0", "0", "-", "0.187"]
    assert rows["0"][1:6] == [f"{alias}@v120", "120", "21.4", "0.473", "+0.287"]
    assert rows["mean"][1:] == ["0.467", "+0.280"]
    assert "0.467 ± 0.009 (mean ± sd over 2 seeds)" in " ".join(text.split())
