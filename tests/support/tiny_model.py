"""A tiny random Llama with SmolLM2's tokenizer, built offline once and cached, for trainer contract tests.

``tiny_model()`` saves a 2-layer, 32-wide ``LlamaForCausalLM`` (random weights from a fixed seed, tied
embeddings over SmolLM2's 49 152-token vocabulary) next to the prepared default model's tokenizer, so ids,
special tokens (``bos`` ``<|im_start|>`` = 1, ``eos`` = ``pad`` = ``<|im_end|>`` = 2) and the chat template
are the real ones while a forward + backward takes milliseconds. ``chat_template=`` saves a copy whose
tokenizer carries another template. Cached under ``$AGENTFORGE_HOME/test-models/`` keyed by the recipe.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from cache_lock import cache_lock

from agentforge.config import default_model_dir, home_dir
from agentforge.model import prepare_default_model
from agentforge.ports import TraceStore
from agentforge.types import LLMCall, Reward, Rollout, RolloutState, Span, SpanKind, Task

__all__ = ["BOS_TEMPLATE", "BOS_TEMPLATE_BOS", "PROMPT", "scored_rollout", "tiny_model"]

#: A chat template that begins with ``{{ bos_token }}`` (as Llama 3's and Gemma's do), then renders every turn
#: (tool turns included) in SmolLM2's ``<|im_start|>role`` format. Saved by ``tiny_model(BOS_TEMPLATE)``
#: with a tokenizer whose BOS is ``<|endoftext|>`` (id 0) and which adds it when asked to
#: (``add_special_tokens=True``): rendering to text and tokenising that again doubles the BOS.
BOS_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: The BOS that ``tiny_model(BOS_TEMPLATE)``'s tokenizer adds and its template renders.
BOS_TEMPLATE_BOS = "<|endoftext|>"
_RECIPE_VERSION = 2

#: A chat prompt in the tiny model's (SmolLM2's) ids: ``<|im_start|>user\nhi<|im_end|>\n`` + the assistant header.
PROMPT = [1, 4093, 198, 6004, 2, 198, 1, 520, 9531, 198]


def scored_rollout(store: TraceStore, agent: str, group: str, completion: list[int], reward: float) -> None:
    """Store one finished rollout of ``agent`` in GRPO group ``group``: one trainable LLM span (``PROMPT`` →
    ``completion``, logprob -1 per token, served by ``policy@v0``) and its final ``reward``."""
    rollout = store.enqueue_rollout(Rollout(agent=agent, group_id=group, task=Task(task_id=group, input={})))
    store.update_rollout(rollout.rollout_id, state=RolloutState.running)
    call = LLMCall(
        version="policy@v0",
        prompt_token_ids=PROMPT,
        completion_token_ids=completion,
        logprobs=[-1.0] * len(completion),
        finish_reason="stop",
    )
    store.add_span(Span(kind=SpanKind.llm, rollout_id=rollout.rollout_id, name="llm", llm=call))
    store.add_reward(Reward(rollout_id=rollout.rollout_id, value=reward, final=True))
    store.update_rollout(rollout.rollout_id, state=RolloutState.succeeded)


def tiny_model(chat_template: str | None = None) -> Path:
    """The directory of the tiny random Llama (weights + SmolLM2 tokenizer), built on first use.

    Args:
        chat_template: a Jinja chat template to save with the tokenizer (default: SmolLM2's own);
            :data:`BOS_TEMPLATE` also makes ``<|endoftext|>`` the BOS the tokenizer adds.

    Returns:
        A checkpoint directory ``AutoModelForCausalLM`` / ``AutoTokenizer`` load offline.
    """
    recipe = {"v": _RECIPE_VERSION, "template": chat_template}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    target = home_dir() / "test-models" / f"tiny-llama-{key}"
    with cache_lock("test-models"):
        if (target / "config.json").exists():
            return target
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        extra = (
            {"bos_token": BOS_TEMPLATE_BOS, "add_bos_token": True} if chat_template == BOS_TEMPLATE else {}
        )
        tokenizer = AutoTokenizer.from_pretrained(prepare_default_model(default_model_dir()), **extra)
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        return target
