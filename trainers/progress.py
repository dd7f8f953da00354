"""What a training run shows and keeps per step: one console line a person can read, a ``metrics.jsonl`` row.

transformers' ``Trainer`` prints every logged metric dictionary (its ``ProgressCallback`` writes them under
a tqdm bar, or its ``PrinterCallback`` prints them when ``disable_tqdm``): dozens of TRL numbers per step.
:func:`show_progress` swaps those for two documented ``transformers.TrainerCallback`` s:

* :class:`StepConsole` prints one ``rich`` line per logged step with the few numbers that matter: the step,
  the batch reward (GRPO) or the loss (SFT), the held-out score when a run measured one (logged under
  :data:`HELD_OUT_KEY`), seconds per step, the time left and the served version::

      step  3/20  reward 0.375 ±0.48  held-out 0.470  7.3 s/step  eta 2m04s  policy@v2

* :class:`MetricsFile` appends every logged step, all of its numbers, to ``{output_dir}/metrics.jsonl``
  (one JSON object per line, non-finite values as ``null``).

Every number still goes through TRL's logs, so ``report_to="tensorboard"`` (or wandb, …; the integration's
package must be installed) records the same metrics for TensorBoard.

:func:`quiet` runs a TRL/transformers call with the library noise a user cannot act on filtered, each by
its category and message, only while the call runs (see :data:`LIBRARY_WARNINGS`): the warnings raised
by the libraries' own internals, DeepSpeed's "Setting accelerator to CPU" log line (printed on stdout when
``accelerate`` imports an installed DeepSpeed on a machine without a GPU), and the weight-loading and
dataset-mapping progress bars of a 135M-parameter model. :func:`adopt_activation_checkpointing` resolves
the one deprecation a config would otherwise raise on every construction.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from agentforge.errors import MissingExtraError

try:
    from rich.console import Console
    from rich.text import Text
    from transformers import PrinterCallback, ProgressCallback, TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError(exc.name or "transformers", "train", "the training console") from exc

__all__ = [
    "HELD_OUT_KEY",
    "LIBRARY_WARNINGS",
    "MetricsFile",
    "StepConsole",
    "adopt_activation_checkpointing",
    "format_seconds",
    "library_noise_filtered",
    "no_signal_warning",
    "quiet",
    "show_progress",
    "write_metrics_row",
]

logger = logging.getLogger("agentforge.trainers")

#: The log key under which a run reports a held-out score measured during training (accuracy or mean
#: reward, as the run defines it), e.g. ``trainer.trainer.log({HELD_OUT_KEY: 0.47})``; the console shows it.
HELD_OUT_KEY = "eval/held_out"

#: ``(category, message regex, module regex)`` of the library warnings filtered while :func:`quiet` runs.
#: All come from code the user does not call and cannot change: transformers 5 renamed
#: ``is_gradient_checkpointing`` and ``gradient_checkpointing_enable`` / ``_disable`` (to ``activation_…``) and
#: PEFT / TRL 1.16 still call the old names from inside their trainers; TRL warns that ``rollout_func``
#: is experimental, which is the extension point the lightning trainer is built on (TRL's version is pinned,
#: see ``trl_private``).
LIBRARY_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (
        FutureWarning,
        r"`(is_gradient_checkpointing|gradient_checkpointing_enable|gradient_checkpointing_disable)` is deprecated",
        r"transformers\.modeling_utils",
    ),
    (UserWarning, r"You are using 'rollout_func', which is an experimental feature", r""),
)

_DEEPSPEED_LOGGER = "DeepSpeed"
_DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"
_TRAIN_KEYS = ("loss", "reward", HELD_OUT_KEY)  # a logged row with none of these is no training step

T = TypeVar("T")


class _DropDeepSpeedCpuNotice(logging.Filter):
    """Drops DeepSpeed's notice that it found no GPU (a CPU run is what the user asked for)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_DEEPSPEED_CPU_NOTICE)


@contextlib.contextmanager
def library_noise_filtered() -> Iterator[None]:
    """Filter :data:`LIBRARY_WARNINGS`, DeepSpeed's CPU notice and the libraries' progress bars meanwhile.

    The warning filters are scoped with ``warnings.catch_warnings`` (the filter list as it was is restored on
    exit, so filters another thread added meanwhile are dropped too, as with any ``catch_warnings``); every
    other warning, the user's own included, is shown as before. The transformers and ``datasets`` progress
    bars are turned back on at exit if they were on.

    Yields:
        Nothing; the block runs with the filters in place.
    """
    from transformers.utils import logging as hf_logging

    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets comes with the train extra
        datasets = None
    bars_on = hf_logging.is_progress_bar_enabled()
    dataset_bars_on = datasets is not None and not datasets.utils.are_progress_bars_disabled()
    notice = _DropDeepSpeedCpuNotice()
    deepspeed_logger = logging.getLogger(_DEEPSPEED_LOGGER)  # DeepSpeed configures this logger on import
    deepspeed_logger.addFilter(notice)
    with warnings.catch_warnings():
        for category, message, module in LIBRARY_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)
        hf_logging.disable_progress_bar()
        if dataset_bars_on and datasets is not None:
            datasets.utils.disable_progress_bars()
        try:
            yield
        finally:
            deepspeed_logger.removeFilter(notice)
            if bars_on:
                hf_logging.enable_progress_bar()
            if dataset_bars_on and datasets is not None:
                datasets.utils.enable_progress_bars()


def quiet(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` wrapped to run inside :func:`library_noise_filtered`: ``quiet(GRPOTrainer)(model=..., ...)``.

    Args:
        fn: a TRL / transformers callable (a trainer class, ``trainer.train``).

    Returns:
        A callable with ``fn``'s arguments and return value.
    """

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        with library_noise_filtered():
            return fn(*args, **kwargs)

    return run


def adopt_activation_checkpointing(config: Any) -> None:
    """Carry TRL's ``gradient_checkpointing`` to transformers' new name before the config is checked.

    transformers 5 renamed ``gradient_checkpointing`` to ``activation_checkpointing`` and warns whenever only
    the old one is set; TRL 1.16's configs set the old one by default (to ``True``), so every TRL config
    warned, whatever the user passed. Call this first in a TRL config subclass's ``__post_init__``: the value
    (TRL's default or the user's) is kept, and transformers mirrors the old name back. No-op on a
    transformers without the new name or when the new name is already set.

    Args:
        config: a ``transformers.TrainingArguments`` (a TRL config) whose ``__post_init__`` has not run.
    """
    if getattr(config, "activation_checkpointing", False) is None:
        old = getattr(config, "gradient_checkpointing", None)
        if old is not None:
            config.activation_checkpointing = old


def format_seconds(seconds: float) -> str:
    """A short duration for the console: ``"45s"``, ``"2m04s"``, ``"1h03m"``.

    Args:
        seconds: a non-negative duration, seconds (rounded to the second).
    """
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _number(logs: Mapping[str, Any], key: str) -> float | None:
    value = logs.get(key)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _is_step_row(logs: Mapping[str, Any] | None) -> bool:
    return bool(logs) and any(key in logs for key in _TRAIN_KEYS)


class StepConsole(TrainerCallback):
    """Prints one ``rich`` line per logged training step (the module docstring shows one).

    The line holds: ``step i/N``; ``reward mean ± std`` (TRL's ``reward`` / ``reward_std``, the batch's
    mean over its rollouts) or, for a run without rewards, ``loss``; ``held-out`` when the row carries
    :data:`HELD_OUT_KEY`; seconds per step (``train/step_s`` when the trainer logs it, rollout wait and
    publish included, else the callback's own step timing); ``eta`` from this run's average step time; and
    the served version when ``version`` is given. Rows without a loss, reward or held-out score (transformers'
    end-of-training summary) print nothing. Only the main process prints.

    Args:
        console: where to print (default: a ``rich`` console on stderr, so stdout stays for results).
        version: returns the version serving now, e.g. ``publisher.current`` (``None``: not shown).
        open_ended: the run has no planned end (it trains until stopped, like the continual trainer):
            show ``step i`` without a total or an ``eta``.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        version: Callable[[], str] | None = None,
        open_ended: bool = False,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.version, self.open_ended = version, open_ended
        self._t0 = self._started = time.monotonic()
        self._first_step = 0
        self._step_s: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._started, self._first_step = time.monotonic(), int(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._t0 = time.monotonic()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._step_s = time.monotonic() - self._t0

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if not state.is_world_process_zero or not _is_step_row(logs):
            return
        step, max_steps = int(state.global_step), 0 if self.open_ended else int(state.max_steps)
        done = step - self._first_step
        eta = (time.monotonic() - self._started) / done * (max_steps - step) if done > 0 else None
        version = self.version() if self.version is not None else None
        line = self.render(step, max_steps, logs or {}, eta_s=eta, version=version, width=self.console.width)
        self.console.print(line)
        if _number(logs or {}, "frac_reward_zero_std") == 1.0:  # TRL's share of groups with equal rewards
            self.console.print(no_signal_warning(step), style="yellow", overflow="fold")
            logger.warning("%s", no_signal_warning(step))
        split = _number(logs or {}, "batch/split_share")
        if split:  # conversations split into several trajectories: only each one's last piece trained
            self.console.print(split_warning(step, split), style="yellow", overflow="fold")
            logger.warning("%s", split_warning(step, split))

    def render(
        self,
        step: int,
        max_steps: int,
        logs: Mapping[str, Any],
        *,
        eta_s: float | None = None,
        version: str | None = None,
        width: int | None = None,
    ) -> Text:
        """The console line for one logged step.

        Args:
            step: optimizer steps done (``state.global_step``).
            max_steps: steps this run will take (``state.max_steps``; ``<= 0``: unknown, shown as ``step i``).
            logs: the step's logged metrics (TRL's names: ``reward``, ``reward_std``, ``loss``, …).
            eta_s: estimated seconds left (``None``: not shown).
            version: the served version (``None``: not shown).
            width: the console's columns: a longer line drops the ``eta``, then the reward's spread, to fit
                (the numbers that matter and the version name are never cut). ``None``: no limit.

        Returns:
            A ``rich.text.Text`` of one line (about 70 characters with a short version name).
        """
        digits = len(str(max_steps)) if max_steps > 0 else 1
        head = f"step {step:>{digits}}/{max_steps}" if max_steps > 0 else f"step {step}"
        parts: list[tuple[str, Text]] = [("step", Text(head, style="bold"))]
        reward, loss = _number(logs, "reward"), _number(logs, "loss")
        if reward is not None:
            parts.append(("reward", Text("reward ").append(f"{reward:.3f}", style="bold green")))
            spread = _number(logs, "reward_std")
            if spread is not None:
                parts.append(("spread", Text(f"±{spread:.2f}", style="green")))
        elif loss is not None:
            parts.append(("loss", Text("loss ").append(f"{loss:.4g}", style="bold green")))
        held_out = _number(logs, HELD_OUT_KEY)
        if held_out is not None:
            parts.append(("held_out", Text("held-out ").append(f"{held_out:.3f}", style="bold cyan")))
        step_s = _number(logs, "train/step_s")
        step_s = step_s if step_s is not None else self._step_s
        if step_s is not None:
            parts.append(("step_s", Text(f"{step_s:.1f} s/step", style="dim")))
        if eta_s is not None and step < max_steps:
            parts.append(("eta", Text(f"eta {format_seconds(eta_s)}", style="dim")))
        if version:
            parts.append(("version", Text(version, style="magenta")))
        line = _join(parts)
        for optional in ("eta", "spread"):  # what goes first when the line is too wide
            if width is not None and line.cell_len > width:
                parts = [(key, text) for key, text in parts if key != optional]
                line = _join(parts)
        return line


def no_signal_warning(step: int) -> str:
    """The warning for a step in which every group's rewards were equal (TRL's ``frac_reward_zero_std`` is
    1): each GRPO advantage is 0, so the step changes nothing however long training runs."""
    return (
        f"step {step}: no learning signal - every group's rewards were equal, so every advantage is 0 and "
        "this step changed nothing; give partial credit, raise the group size or the temperature, or start "
        "from a policy that sometimes succeeds (e.g. replay SFT on its successful traces)"
    )


def split_warning(step: int, share: float) -> str:
    """The warning for a step whose batch had conversations split into several trajectories (the trainer's
    ``batch/split_share``, a fraction of the batch): each trained only on its last piece."""
    return (
        f"step {step}: {share:.0%} of the batch's rollouts split into several trajectories, so only their last "
        "call trained; `agentforge traces show <rollout>` names each break (prefix_break:<reason> flags); serve "
        "through the stack's engines (token-in continuations) and keep each rollout's messages linear"
    )


def _join(parts: list[tuple[str, Text]]) -> Text:
    """The parts of a step line, two spaces apart (one before the reward's spread)."""
    line = Text()
    for i, (key, text) in enumerate(parts):
        if i:
            line.append(" " if key == "spread" else "  ")
        line.append_text(text)
    return line


def write_metrics_row(path: str | Path, row: Mapping[str, Any]) -> dict[str, Any]:
    """Append one row to a JSON-lines metrics file (parent folders are created).

    Args:
        path: the file, e.g. ``{output_dir}/metrics.jsonl``.
        row: the step's values; non-finite floats (NaN, ±inf: a step without a valid reward) become ``null``.

    Returns:
        The row as written (non-finite floats replaced by ``None``).
    """
    clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in row.items()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(clean) + "\n")
    return clean


class MetricsFile(TrainerCallback):
    """Appends each logged training step to a JSON-lines file: ``{"step", "version"?, <every number>}``.

    Rows without a loss, reward or held-out score (the end-of-training summary) are skipped; only the main
    process writes. The lightning trainer writes its own rows (with the store span); this callback serves the
    trainers that have no other record, such as replay SFT.

    Args:
        path: the file (``{output_dir}/metrics.jsonl``); appended to, so a resumed run continues it.
        version: returns the version serving now (``None``: no ``version`` key).
    """

    def __init__(self, path: str | Path, *, version: Callable[[], str] | None = None) -> None:
        self.path, self.version = Path(path), version

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        if not state.is_world_process_zero or not _is_step_row(logs):
            return
        row: dict[str, Any] = {"step": int(state.global_step)}
        if self.version is not None:
            row["version"] = self.version()
        row.update({k: float(v) for k, v in (logs or {}).items() if isinstance(v, int | float)})
        write_metrics_row(self.path, row)


def show_progress(
    trainer: Any,
    *,
    version: Callable[[], str] | None = None,
    console: Console | None = None,
    metrics_path: str | Path | None = None,
    open_ended: bool = False,
) -> StepConsole:
    """Replace transformers' metric-dictionary lines with a :class:`StepConsole` (+ a :class:`MetricsFile`).

    Removes the trainer's ``ProgressCallback`` and ``PrinterCallback`` (transformers adds one of them to every
    ``Trainer``) and any console or metrics file a previous call added, through the documented
    ``Trainer.remove_callback`` / ``add_callback``. Logging itself is unchanged: ``report_to`` integrations
    and other callbacks see every metric.

    Args:
        trainer: a ``transformers.Trainer`` (TRL's ``GRPOTrainer``, ``SFTTrainer``, …).
        version: returns the version serving now (shown on each line and written to the metrics file).
        console: where the lines go (default: stderr).
        metrics_path: also append each step to this JSON-lines file (``None``: no file).
        open_ended: the run trains until stopped: lines show no total and no ``eta`` (:class:`StepConsole`).

    Returns:
        The :class:`StepConsole` added.
    """
    for cls in (ProgressCallback, PrinterCallback, StepConsole, MetricsFile):
        while any(isinstance(cb, cls) for cb in trainer.callback_handler.callbacks):
            trainer.remove_callback(cls)
    step_console = StepConsole(console, version=version, open_ended=open_ended)
    trainer.add_callback(step_console)
    if metrics_path is not None:
        trainer.add_callback(MetricsFile(metrics_path, version=version))
    return step_console
