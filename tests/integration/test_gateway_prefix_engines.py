"""One conversation, one trajectory, on real engines: a 4-turn tool conversation (tool answers and user turns
between the calls, the third call streamed) through the real gateway at temperature 1 merges into ONE
trajectory whose ids are the ones the engine saw, with the tool answers at ``env_mask`` 0, and its step-1
importance-sampling ratio on the unchanged model is 1 ± 0.05. The conversation and the checks are those of
``benchmarks/one_trajectory.py`` (which also runs the ordinary path side by side)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from agentforge.config import default_model_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import one_trajectory  # noqa: E402


@pytest.fixture(scope="module")
def reference() -> tuple[Any, Any]:
    """The default model in float32 and its tokenizer (the trainer's side of the ratio)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32)
    return model.eval(), transformers.AutoTokenizer.from_pretrained(default_model_dir())


def _check(summary: dict[str, Any]) -> None:
    (row,) = summary["rows"]
    assert row["calls"] == 4 and row["continued"] == 3 and not row["breaks"], row
    assert summary["one_trajectory_share"] == 1.0 and summary["extra_trajectories"] == 0
    assert row["ids_match"] and row["tool_masked"], row
    assert abs(row["token_ratio"] - 1.0) <= 0.05, row


@pytest.mark.slow
def test_embedded_engine_conversation_is_one_trajectory(reference: tuple[Any, Any]) -> None:
    from agentforge.serving.embedded import EmbeddedServer

    with EmbeddedServer() as engine:  # tool_choice="required" first: the guided path (it forces nothing here)
        summary = one_trajectory.run_mode(engine, True, 1, True, *reference)
    _check(summary)
    assert summary["rows"][0]["guided"] == ["guided_logprobs_recomputed"], summary
    assert abs(summary["sequence_ratio_mean"] - 1.0) <= 0.05, summary  # same weights, same dtype


@pytest.mark.vllm
def test_vllm_conversation_is_one_trajectory(vllm_tool_server: Any, reference: tuple[Any, Any]) -> None:
    summary = one_trajectory.run_mode(vllm_tool_server, True, 1, True, *reference)
    _check(summary)  # the forced first call's logprobs are the policy's (else its ratio would be ~0.001)
    assert summary["rows"][0]["guided"] == ["guided_logprobs_recomputed"], summary


@pytest.mark.vllm
@pytest.mark.parametrize("dialect", ["anthropic", "responses"])
def test_vllm_conversation_in_another_dialect_is_one_trajectory(
    vllm_tool_server: Any, reference: tuple[Any, Any], dialect: str
) -> None:
    """The same conversation spoken with the anthropic SDK (Messages API) or the openai SDK's Responses API
    (issue 38): one trajectory too."""
    summary = one_trajectory.run_mode(vllm_tool_server, True, 1, True, *reference, dialect=dialect)
    _check(summary)
    assert summary["rows"][0]["guided"] == ["guided_logprobs_recomputed"], summary


@pytest.mark.vllm
@pytest.mark.postgres
def test_vllm_conversation_over_two_gateway_replicas_is_one_trajectory(
    vllm_tool_server: Any, reference: tuple[Any, Any], pg_url: str
) -> None:
    """Issue 39: the same conversation, its calls sent in turn to two gateway replicas, each on its own
    connection to one PostgreSQL store. A replica that did not answer the rollout's last call rebuilds its
    continuation from the stored spans: still one trajectory, the same ids, every follow-up continued."""
    summary = one_trajectory.run_mode(
        vllm_tool_server, True, 1, True, *reference, replicas=2, store_url=pg_url
    )
    _check(summary)
