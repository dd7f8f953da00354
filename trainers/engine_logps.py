"""Recompute each span's log-probabilities under the temperature its stored ones were computed at.

TRL's ``GRPOTrainer`` computes every log-probability (the old policy's for the importance-sampling ratio,
the policy's in the loss, the reference's) at one temperature, its config's ``temperature``, and compares
them with the engine's stored ones (TRL ``vllm_importance_sampling_correction``). Agents sample at their own
temperatures, so a span drawn at 0.7 by an engine that returns processed log-probabilities would be compared
with a temperature-1.0 recomputation: a ratio far from 1 that says nothing about the weights, which TRL then
caps, i.e. silently down-weights. :class:`SpanTemperatures` recomputes each completion token at the
temperature :func:`~agentforge.trainers.logprob_match.stored_logprob_temperature` gives its span (the
sample sources send it as the ``temperature`` column); tokens without one (masked samples, tokens the policy
did not sample) use the configured temperature. Following TRL's convention (which samples and trains at one
temperature), the loss and the reference pass use the same per-token temperatures.

**How.** TRL's fused LM head divides the logits by the configured temperature ``T``. For a head without bias
or soft-capping, ``(h · Wᵀ) / τ = ((h · T/τ) · Wᵀ) / T``, so scaling the backbone's last hidden state at the
position that predicts each token by ``T / τ`` makes the fused head compute that token at ``τ``, values and
gradients alike (a forward hook on the backbone, active only during these passes).

**Metrics.** Before any cap, the raw per-token ratio ``exp(old − stored)`` over the tokens the policy sampled:
``sampling/raw_importance_ratio/mean``, ``/min``, ``/max``, ``/p01`` and ``/p99`` (its 1st and 99th
percentiles) and ``/outside_share`` (the share of those tokens whose ratio is outside :data:`RATIO_BAND`,
``[0.5, 2]``: the trainer and the engine disagree on them by more than a factor of 2), logged with TRL's
metrics each step (computed on the main process's share of the batch).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agentforge.errors import UserError

__all__ = ["RATIO_BAND", "RAW_RATIO_PREFIX", "SpanTemperatures", "raw_ratio_metrics"]

#: The metric name prefix of the raw (uncapped) importance-sampling ratio statistics.
RAW_RATIO_PREFIX = "sampling/raw_importance_ratio"
#: ``(low, high)``: a raw ratio outside it counts in ``/outside_share``.
RATIO_BAND = (0.5, 2.0)


def raw_ratio_metrics(old: torch.Tensor, stored: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean and tails of the raw importance ratio ``exp(old − stored)`` over the masked tokens.

    Args:
        old: the trainer's recomputed log-probabilities, ``(B, C)``.
        stored: the engine's stored log-probabilities, ``(B, C)`` (NaN where the engine gave none).
        mask: 1 on tokens the policy sampled, ``(B, C)``.

    Returns:
        ``{"<prefix>/mean", "/min", "/max", "/p01", "/p99", "/outside_share"}`` (``outside_share``: the
        fraction of the counted tokens whose ratio is outside :data:`RATIO_BAND`); empty when no token counts.
    """
    keep = mask.bool() & ~torch.isnan(stored)
    if not bool(keep.any()):
        return {}
    ratio = torch.exp((old - stored)[keep].double())
    q = torch.quantile(ratio, torch.tensor([0.01, 0.99], dtype=ratio.dtype))
    return {
        f"{RAW_RATIO_PREFIX}/mean": float(ratio.mean()),
        f"{RAW_RATIO_PREFIX}/min": float(ratio.min()),
        f"{RAW_RATIO_PREFIX}/max": float(ratio.max()),
        f"{RAW_RATIO_PREFIX}/p01": float(q[0]),
        f"{RAW_RATIO_PREFIX}/p99": float(q[1]),
        f"{RAW_RATIO_PREFIX}/outside_share": float(
            ((ratio < RATIO_BAND[0]) | (ratio > RATIO_BAND[1])).double().mean()
        ),
    }


class SpanTemperatures:
    """Mixin for ``trl.GRPOTrainer``: per-token temperatures in every log-probability pass (module docstring).

    The sample source's ``temperature`` column reaches it through :meth:`set_sample_temperatures` (the
    lightning trainer's ``rollout_func`` wrapper); it travels with each micro-batch as ``token_temperature``.
    """

    _sample_temperatures: list[list[float | None]] | None = None
    _pass_temperatures: torch.Tensor | None = None

    def set_sample_temperatures(self, temperatures: Sequence[Sequence[float | None]] | None) -> None:
        """The next generation batch's per-token temperatures, one list per sample (``None``: configured)."""
        self._sample_temperatures = None if temperatures is None else [list(t) for t in temperatures]

    def _temperature_table(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        configured = float(self.temperature)  # type: ignore[attr-defined]
        table = torch.full((rows, width), configured, dtype=torch.float32, device=device)
        if self._sample_temperatures is not None and len(self._sample_temperatures) == rows:
            for row, temps in enumerate(self._sample_temperatures):
                values = [configured if t is None else float(t) for t in temps[:width]]
                if values:
                    table[row, : len(values)] = torch.tensor(values, dtype=torch.float32, device=device)
        return table

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        try:
            out = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
            ids = out["completion_ids"]
            out["token_temperature"] = self._temperature_table(ids.size(0), ids.size(1), ids.device)
        finally:
            self._sample_temperatures = None
        old, stored = out.get("old_per_token_logps"), out.get("sampling_per_token_logps")
        if old is not None and stored is not None:
            mask = out["completion_mask"] * out["tool_mask"] if "tool_mask" in out else out["completion_mask"]
            mode = "train" if self.model.training else "eval"  # type: ignore[attr-defined]
            for key, value in raw_ratio_metrics(old, stored, mask).items():
                self._metrics[mode][key].append(value)  # type: ignore[attr-defined]
        return out

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Any:
        self._pass_temperatures = inputs.get("token_temperature")
        try:
            return super()._compute_loss(model, inputs)  # type: ignore[misc]
        finally:
            self._pass_temperatures = None

    def _get_per_token_logps_and_entropies(  # noqa: D401 - TRL's signature
        self,
        model: Any,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        base = super()._get_per_token_logps_and_entropies  # type: ignore[misc]
        rows = input_ids.size(0)
        temps = self._pass_temperatures
        if temps is None or temps.size(0) != rows:
            temps = self._temperature_table(rows, logits_to_keep, input_ids.device)
        scale = float(self.temperature) / temps[:, :logits_to_keep].to(input_ids.device)  # type: ignore[attr-defined]
        if bool((scale == 1.0).all()):
            return base(model, input_ids, attention_mask, logits_to_keep, batch_size, *args, **kwargs)
        chunk = batch_size or rows
        parts: list[tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]] = []
        for start in range(0, rows, chunk):
            end = min(start + chunk, rows)
            with _scaled_last_hidden(model, scale[start:end], input_ids.size(1)):
                parts.append(
                    base(
                        model,
                        input_ids[start:end],
                        attention_mask[start:end],
                        logits_to_keep,
                        end - start,
                        *args,
                        **kwargs,
                    )
                )
        logps = torch.cat([p[0] for p in parts])
        entropies = None if parts[0][1] is None else torch.cat([p[1] for p in parts if p[1] is not None])
        aux = None if parts[0][2] is None else torch.stack([p[2] for p in parts if p[2] is not None]).mean()
        return logps, entropies, aux


def _backbone(model: Any) -> torch.nn.Module:
    """The module whose output's ``last_hidden_state`` TRL's fused head projects (``model.base_model``)."""
    inner = getattr(model, "module", model)  # DDP / accelerate wrappers
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    head = inner.get_output_embeddings()
    softcap = getattr(getattr(inner, "config", None), "final_logit_softcapping", None)
    if getattr(head, "bias", None) is not None or softcap:
        raise UserError(
            "per-span temperatures need an LM head without bias or logit soft-capping; this model has "
            f"{'a bias' if getattr(head, 'bias', None) is not None else 'soft-capping'}: sample at the trainer's "
            "temperature, or set the trainer's temperature to the agents'"
        )
    return inner.base_model


@contextlib.contextmanager
def _scaled_last_hidden(model: Any, scale: torch.Tensor, total_len: int) -> Iterator[None]:
    """Scale the hidden states that predict the completion tokens by ``scale`` ``(b, C)`` meanwhile.

    TRL's per-row pass runs ``prompt + completion`` (length ``total_len``): the state at position ``i``
    predicts token ``i + 1``, so completion token ``j`` is predicted at ``total_len − C − 1 + j``. The shared
    prompt pass (:mod:`~agentforge.trainers.prefix`) runs ``C`` steps whose state ``j`` predicts token ``j``;
    its prompt-only pass (another batch size) is left alone.
    """
    rows, width = scale.shape

    def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
        hidden = output["last_hidden_state"] if isinstance(output, dict) else output[0]
        if hidden.size(0) != rows:
            return None
        if hidden.size(1) == total_len:
            start = total_len - width - 1
        elif hidden.size(1) == width:
            start = 0
        else:
            return None
        factor = torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
        factor[:, start : start + width] = scale.to(hidden.dtype)
        output["last_hidden_state"] = hidden * factor[..., None]
        return output

    handle = _backbone(model).register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
