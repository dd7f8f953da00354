"""The TRL internals agentforge relies on, in one place, each guarded by the TRL range the tests ran on.

The trainers reach TRL through its documented extension points wherever TRL allows it: ``rollout_func``
(samples from the trace store), ``reward_funcs`` (the stored rewards) and ``transformers.TrainerCallback``
(step timing, metrics, and publishing the adapter after an optimizer step). TRL 1.16 offers no public way
to do these things, so these reach into it, and only through this module:

1. **Importance sampling against an engine TRL did not start.** ``trl.GRPOTrainer`` corrects for the
   train/serve mismatch with the engine's logprobs (``vllm_importance_sampling_correction``) only while
   ``trainer.use_vllm`` is true, but ``GRPOConfig(use_vllm=True)`` makes TRL start or connect to a vLLM of
   its own. :func:`use_engine_logprobs` sets the flag after construction and fills TRL's generation
   backend slot (``vllm_generation``, whose ``sync_weights()`` TRL calls before a generation that follows
   an optimizer step) with an object that syncs nothing: publishing is a callback's job, and the
   ``rollout_func`` brings the samples with their logprobs.
2. **Adding metrics to TRL's logged averages** (``trainer._metrics``): :func:`log_step_metrics`.
3. **Sharing each group's prompt in the log-probability passes**: ``SharedPrefixGRPOTrainer``
   (:mod:`agentforge.trainers.prefix`) overrides ``GRPOTrainer._get_per_token_logps_and_entropies``.
4. **The importance ratio from the training forward** when the old policy is the trained one:
   ``TrainingForwardRatio`` (:mod:`agentforge.trainers.onpolicy_ratio`) skips TRL's old-logprob pass.

Each calls :func:`check_trl_version` first, so another TRL raises one clear error (with the ``pip`` line to
run) instead of training wrongly; ``pyproject.toml`` pins the same range (:data:`TRL_RANGE`).
"""

from __future__ import annotations

from functools import lru_cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed_version
from typing import Any

from agentforge.errors import MissingExtraError, UserError

__all__ = ["TRL_RANGE", "TESTED_TRL_MINOR", "check_trl_version", "use_engine_logprobs", "log_step_metrics"]

#: The ``(major, minor)`` TRL release the trainers' tests ran on; patch releases are accepted.
TESTED_TRL_MINOR = (1, 16)
#: The requirement ``pyproject.toml`` pins for ``trl`` (the ``train`` extra), derived from the same numbers.
TRL_RANGE = f">={TESTED_TRL_MINOR[0]}.{TESTED_TRL_MINOR[1]},<{TESTED_TRL_MINOR[0]}.{TESTED_TRL_MINOR[1] + 1}"


def check_trl_version(what: str, installed: str | None = None) -> None:
    """Refuse to reach into TRL's internals on a TRL release they were not tested with.

    Args:
        what: the private TRL piece about to be used, for the message (e.g. ``"GRPOTrainer.use_vllm"``).
        installed: the TRL version to check (default: the installed distribution's).

    Raises:
        MissingExtraError: TRL is not installed.
        UserError: the installed TRL is outside :data:`TRL_RANGE`; the message names the ``pip install``
            that fixes it.
    """
    installed = installed or _installed_trl()
    from packaging.version import InvalidVersion, Version

    try:
        minor = Version(installed).release[:2]
    except InvalidVersion:
        minor = ()
    if minor != TESTED_TRL_MINOR:
        raise UserError(
            f"agentforge uses TRL's private {what}, tested with trl{TRL_RANGE}, but trl {installed} is "
            f'installed; run: pip install "trl{TRL_RANGE}"'
        )


@lru_cache(maxsize=1)
def _installed_trl() -> str:
    try:
        return installed_version("trl")
    except PackageNotFoundError:
        raise MissingExtraError("trl", "train", "the GRPO trainer") from None


class _NoEngineSync:
    """Fills TRL's generation-backend slot: TRL calls ``sync_weights`` there, publishing is done elsewhere."""

    def sync_weights(self) -> None:
        """Nothing to sync: the trainer's publish callback hands adapters to the serving engine."""


def use_engine_logprobs(trainer: Any) -> None:
    """Make ``trainer`` (a ``trl.GRPOTrainer``) correct with the serving engine's logprobs (item 1 above).

    The samples come from ``rollout_func`` with the engine's ``logprobs``; with this TRL computes the
    importance-sampling ratio against them (TRL ``vllm_importance_sampling_correction``, on by default).

    Args:
        trainer: a ``trl.GRPOTrainer`` built with ``use_vllm=False`` and a ``rollout_func``.

    Raises:
        UserError: the installed TRL is not the tested one (:func:`check_trl_version`).
    """
    check_trl_version("GRPOTrainer.use_vllm / vllm_generation slot")
    trainer.use_vllm = True
    trainer.vllm_generation = _NoEngineSync()
    trainer._last_loaded_step = 0  # TRL sets it only when it starts its own vLLM; it reads it before syncing


def log_step_metrics(trainer: Any, metrics: dict[str, float]) -> None:
    """Add one optimizer step's values to TRL's metric buffer, which TRL averages into its next log.

    Args:
        trainer: a ``trl.GRPOTrainer``.
        metrics: name → value for this step (e.g. ``{"train/step_s": 21.3}``).

    Raises:
        UserError: the installed TRL is not the tested one (:func:`check_trl_version`).
    """
    check_trl_version("GRPOTrainer._metrics")
    for key, value in metrics.items():
        trainer._metrics["train"][key].append(value)
