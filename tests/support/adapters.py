"""Tiny LoRA adapters for serving tests, trained once and cached.

``letter_adapter("B")`` trains a rank-8 LoRA on the prepared default model so that, for the chat prompt
:data:`LETTER_PROMPT`, greedy decoding answers exactly ``"B"``. ``rank_adapter(32)`` and
``rank_adapter(8, rank_pattern={"q_proj": 64})`` save untrained (initialised) adapters whose rank is
above a server maximum of 16. Everything is cached under ``$AGENTFORGE_HOME/test-adapters/`` keyed by a
hash of the recipe, so only the first test session pays the training (a few seconds per adapter on CPU).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from cache_lock import cache_lock

from agentforge.config import default_model_dir, home_dir
from agentforge.model import prepare_default_model

__all__ = [
    "LETTER_PROMPT",
    "LETTER_MESSAGES",
    "letter_adapter",
    "rank_adapter",
    "foreign_adapter",
    "misfit_adapter",
]

#: The fixed user prompt the letter adapters answer.
LETTER_PROMPT = "Answer with one letter."
LETTER_MESSAGES = [{"role": "user", "content": LETTER_PROMPT}]
_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
_RECIPE_VERSION = 1


def _cache_dir(recipe: dict[str, Any]) -> Path:
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]
    return home_dir() / "test-adapters" / f"{recipe['kind']}-{key}"


def _base() -> Path:
    return prepare_default_model(default_model_dir())


def _save_atomically(model: Any, target: Path) -> Path:
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def letter_adapter(letter: str, *, steps: int = 30, lr: float = 3e-3, r: int = 8) -> Path:
    """A LoRA adapter whose greedy answer to :data:`LETTER_MESSAGES` is exactly ``letter``.

    Args:
        letter: the answer to teach (one character).
        steps: optimiser steps on the single example (full batch, AdamW).
        lr: learning rate.
        r: LoRA rank (alpha = 2r, all linear projections).

    Returns:
        The adapter directory (cached).

    Raises:
        RuntimeError: the trained adapter does not answer ``letter`` greedily.
    """
    base = _base()
    recipe = {
        "kind": f"letter-{letter}",
        "letter": letter,
        "steps": steps,
        "lr": lr,
        "r": r,
        "prompt": LETTER_PROMPT,
        "base": str(base),
        "v": _RECIPE_VERSION,
    }
    target = _cache_dir(recipe)
    with cache_lock("test-adapters"):
        if (target / "adapter_config.json").exists():
            return target
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        model = get_peft_model(
            model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=_TARGETS, lora_dropout=0.0)
        )
        prompt = tokenizer.apply_chat_template(LETTER_MESSAGES, add_generation_prompt=True, tokenize=False)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(letter, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        ids = torch.tensor([prompt_ids + answer_ids])
        labels = torch.tensor([[-100] * len(prompt_ids) + answer_ids])
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        model.train()
        for _ in range(steps):
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([prompt_ids]), max_new_tokens=4, do_sample=False)
        text = tokenizer.decode(out[0, len(prompt_ids) :], skip_special_tokens=True)
        if text != letter:
            raise RuntimeError(
                f"letter adapter {letter!r} answers {text!r} after {steps} steps (loss {loss:.3f})"
            )
        return _save_atomically(model, target)


def rank_adapter(r: int, *, rank_pattern: dict[str, int] | None = None) -> Path:
    """An untrained LoRA adapter of rank ``r`` (plus ``rank_pattern`` overrides) on the default model.

    Args:
        r: the default LoRA rank.
        rank_pattern: per-module rank overrides, e.g. ``{"q_proj": 64}``.

    Returns:
        The adapter directory (cached).
    """
    base = _base()
    recipe = {
        "kind": f"rank-{r}",
        "r": r,
        "rank_pattern": rank_pattern or {},
        "base": str(base),
        "v": _RECIPE_VERSION,
    }
    target = _cache_dir(recipe)
    with cache_lock("test-adapters"):
        if (target / "adapter_config.json").exists():
            return target
        import torch
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        config = LoraConfig(
            r=r, lora_alpha=r, target_modules=["q_proj", "v_proj"], rank_pattern=rank_pattern or {}
        )
        return _save_atomically(get_peft_model(model, config), target)


def foreign_adapter() -> Path:
    """A copy of the rank-8 letter-``A`` adapter whose config names another base model."""
    source = letter_adapter("A")
    target = home_dir() / "test-adapters" / "foreign-base"
    with cache_lock("test-adapters"):
        if not (target / "adapter_config.json").exists():
            tmp = target.with_name(target.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(source, tmp)
            config = json.loads((tmp / "adapter_config.json").read_text())
            config["base_model_name_or_path"] = "meta-llama/Llama-3.2-1B-Instruct"
            (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
            tmp.rename(target)
    return target


def misfit_adapter(kind: str) -> Path:
    """A LoRA adapter whose config names the served base model but whose tensors do not fit it.

    Args:
        kind: ``"gpt2"`` — non-zero rank-8 tensors for GPT-2's ``transformer.h.N.attn.c_attn`` and
            ``c_proj`` (config ``target_modules=["c_attn", "c_proj"]``); ``"partial"`` — the letter-``A``
            adapter's config (``q_proj``, ``v_proj``) with only its ``q_proj`` tensors kept.

    Returns:
        The adapter directory (cached under ``$AGENTFORGE_HOME/test-adapters/misfit-KIND``).
    """
    import numpy as np
    from safetensors.numpy import load_file, save_file

    source = letter_adapter("A")
    target = home_dir() / "test-adapters" / f"misfit-{kind}-v{_RECIPE_VERSION}"
    with cache_lock("test-adapters"):
        if (target / "adapter_config.json").exists():
            return target
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp)
        config = json.loads((tmp / "adapter_config.json").read_text())
        tensors = load_file(str(tmp / "adapter_model.safetensors"))
        if kind == "gpt2":
            rng = np.random.default_rng(0)
            config["target_modules"] = ["c_attn", "c_proj"]
            tensors = {}
            for layer in range(4):
                for module, out in (("attn.c_attn", 3 * 576), ("attn.c_proj", 576)):
                    key = f"base_model.model.transformer.h.{layer}.{module}"
                    tensors[f"{key}.lora_A.weight"] = rng.normal(size=(8, 576)).astype(np.float32)
                    tensors[f"{key}.lora_B.weight"] = rng.normal(size=(out, 8)).astype(np.float32)
        elif kind == "partial":
            tensors = {k: v for k, v in tensors.items() if "v_proj" not in k}
        else:
            raise ValueError(f"unknown misfit kind {kind!r}")
        save_file(tensors, str(tmp / "adapter_model.safetensors"))
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2))
        tmp.rename(target)
    return target


def assert_only_lora_moved(before: dict[str, Any], model: Any) -> None:
    """Training changed some LoRA B matrix (zero at init) and left every base weight as it was and frozen.

    Args:
        before: ``{name: tensor.clone()}`` of ``model.named_parameters()`` taken before training.
        model: the trained PEFT model (in memory, as the optimizer saw it).
    """
    import torch

    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    lora_b = [k for k in after if "lora_B" in k]
    assert lora_b and any(not torch.equal(before[k], after[k]) for k in lora_b)
    base = [k for k in after if "lora_" not in k]
    assert base and all(not after[k].requires_grad for k in base)
    assert all(torch.equal(before[k], after[k]) for k in base)
