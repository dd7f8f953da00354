"""Settings a new domain needs, reachable and described on the command line."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from agentforge.cli import app


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "300", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return re.sub(r"[\s│]+", " ", result.output)


def test_max_completion_length_says_what_it_counts() -> None:
    text = _help("train")
    assert "--max-completion-length" in text
    assert "sampled tokens plus the tool outputs and user turns" in text and "truncates nothing" in text


def test_serve_has_the_context_length() -> None:
    text = _help("serve")
    assert "--max-model-len" in text and "tool schemas" in text
