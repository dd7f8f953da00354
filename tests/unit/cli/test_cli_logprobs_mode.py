"""``agentforge serve --logprobs-mode`` reaches the engine (issue 15, item 4: the mode is chosen and recorded).

No engine starts: ``VLLMServer.start`` records the command it would run and stops there. Guards against the
option being dropped on its way to vLLM's ``--logprobs-mode`` (spans would then carry a mode the engine does
not use) and against a value vLLM would reject, or whose values are not log-probabilities, being accepted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures_cli import STOPPED, serve_vllm

from agentforge.errors import ConfigError, UserError
from agentforge.serving.embedded import EmbeddedServer
from agentforge.serving.vllm import VLLMServer


def test_serve_passes_the_logprobs_mode_to_vllm(tmp_path: Path, starts: list[list[str]]) -> None:
    assert STOPPED in serve_vllm(tmp_path).output
    assert STOPPED in serve_vllm(tmp_path, "--logprobs-mode", "processed_logprobs").output
    modes = [command[command.index("--logprobs-mode") + 1] for command in starts]
    assert modes == ["raw_logprobs", "processed_logprobs"]


def test_a_mode_that_is_not_log_probabilities_is_refused(tmp_path: Path, starts: list[list[str]]) -> None:
    result = serve_vllm(tmp_path, "--logprobs-mode", "raw_logits")
    assert result.exit_code == 2 and "--logprobs-mode" in result.output and starts == []
    with pytest.raises(ConfigError, match="processed_logprobs"):
        VLLMServer(python=Path(sys.executable), logprobs_mode="processed_logits")
    with pytest.raises(UserError, match="processed_logprobs"):
        EmbeddedServer(logprobs_mode="logits")
