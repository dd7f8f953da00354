"""The training console (agentforge.trainers.progress): one readable line per step, one metrics.jsonl row per
step, transformers' metric dictionaries gone, and the library noise filtered only while agentforge's call runs.

A real ``transformers.Trainer`` trains a one-parameter model for three steps (no download, about a second).
"""

from __future__ import annotations

import io
import json
import logging
import warnings

import pytest
import torch
from rich.console import Console

from agentforge.trainers.progress import (
    HELD_OUT_KEY,
    MetricsFile,
    StepConsole,
    adopt_activation_checkpointing,
    format_seconds,
    library_noise_filtered,
    quiet,
    show_progress,
)

transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")


class _OneWeight(torch.nn.Module):
    """loss = (w - x)²: a model the Trainer can step without a checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": ((self.w - x) ** 2).mean()}


def _trainer(tmp_path, **args):  # type: ignore[no-untyped-def]
    config = transformers.TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        per_device_train_batch_size=2,
        logging_steps=1,
        learning_rate=0.1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        **args,
    )
    data = datasets.Dataset.from_list([{"x": float(i)} for i in range(8)])
    return transformers.Trainer(model=_OneWeight(), args=config, train_dataset=data)


def _recording_console() -> Console:
    return Console(file=io.StringIO(), width=80, record=True, color_system=None)


@pytest.mark.parametrize("disable_tqdm", [False, True])
def test_a_run_prints_one_line_per_step_writes_metrics_jsonl_and_no_metric_dicts(
    tmp_path, capsys, disable_tqdm: bool
) -> None:
    trainer = _trainer(tmp_path, disable_tqdm=disable_tqdm)
    printer = transformers.PrinterCallback if disable_tqdm else transformers.ProgressCallback
    assert any(isinstance(cb, printer) for cb in trainer.callback_handler.callbacks)
    console = _recording_console()
    show_progress(trainer, version=lambda: "policy@v7", console=console, metrics_path=tmp_path / "m.jsonl")
    show_progress(trainer, version=lambda: "policy@v7", console=console, metrics_path=tmp_path / "m.jsonl")
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert printer not in kinds and kinds.count(StepConsole) == 1 and kinds.count(MetricsFile) == 1

    trainer.train()

    lines = console.export_text().splitlines()
    assert len(lines) == 3, lines
    for step, line in enumerate(lines, start=1):
        assert line.startswith(f"step {step}/3  loss ") and line.endswith("  policy@v7"), line
        assert " s/step" in line and len(line) <= 80
    rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all({"step", "version", "loss", "learning_rate", "grad_norm"} <= set(r) for r in rows), rows
    assert all(r["version"] == "policy@v7" for r in rows)
    assert rows[0]["loss"] == pytest.approx(float(lines[0].split("loss ")[1].split()[0]), rel=1e-3)
    captured = capsys.readouterr()  # transformers' printers wrote every dict to stdout; nothing now
    assert "'loss'" not in captured.out + captured.err and "learning_rate" not in captured.out + captured.err


def test_the_step_line_shows_reward_held_out_step_seconds_eta_and_version() -> None:
    console = _recording_console()
    logs = {"reward": 0.375, "reward_std": 0.484, "loss": 0.02, HELD_OUT_KEY: 0.47, "train/step_s": 7.31}
    console.print(StepConsole(console).render(3, 20, logs, eta_s=124.2, version="policy@v2", width=80))
    assert console.export_text() == (
        "step  3/20  reward 0.375 ±0.48  held-out 0.470  7.3 s/step  eta 2m04s  policy@v2\n"
    )
    last = StepConsole(console).render(20, 20, {"reward": float("nan"), "loss": 0.5}, eta_s=0.0)
    assert last.plain == "step 20/20  loss 0.5"  # a NaN reward (no valid reward) falls back to the loss
    assert [format_seconds(s) for s in (0.4, 59.6, 124, 3780)] == ["0s", "1m00s", "2m04s", "1h03m"]


def test_a_long_version_name_stays_whole_on_one_80_column_line() -> None:
    console = _recording_console()
    logs = {"reward": 0.375, "reward_std": 0.484, HELD_OUT_KEY: 0.47, "train/step_s": 7.31}
    # eta goes first, then the spread; the numbers that matter and the version's name stay whole
    for version, expected in [
        (
            "customer-service@v12",
            "step  3/20  reward 0.375 ±0.48  held-out 0.470  7.3 s/step  customer-service@v12",
        ),
        (
            "customer-service-bot@v12",
            "step  3/20  reward 0.375  held-out 0.470  7.3 s/step  customer-service-bot@v12",
        ),
    ]:
        console.print(StepConsole(console).render(3, 20, logs, eta_s=124.2, version=version, width=80))
        assert console.export_text() == expected + "\n"
    roomy = StepConsole(console).render(
        3, 20, logs, eta_s=124.2, version="customer-service-bot@v12", width=120
    )
    assert "eta 2m04s" in roomy.plain and "±0.48" in roomy.plain


def test_rows_without_a_training_number_print_and_write_nothing(tmp_path) -> None:
    console = _recording_console()
    state = transformers.TrainerState(global_step=3, max_steps=3)
    summary = {"train_runtime": 1.2, "train_loss": 0.1, "epoch": 1.0}
    StepConsole(console).on_log(None, state, None, logs=summary)
    MetricsFile(tmp_path / "m.jsonl").on_log(None, state, None, logs=summary)
    assert console.export_text() == "" and not (tmp_path / "m.jsonl").exists()
    state.is_world_process_zero = False  # another rank: silent even for a step row
    StepConsole(console).on_log(None, state, None, logs={"loss": 1.0})
    MetricsFile(tmp_path / "m.jsonl").on_log(None, state, None, logs={"loss": 1.0})
    assert console.export_text() == "" and not (tmp_path / "m.jsonl").exists()
    state.is_world_process_zero = True
    MetricsFile(tmp_path / "m.jsonl").on_log(None, state, None, logs={"reward": float("nan"), "note": "x"})
    assert json.loads((tmp_path / "m.jsonl").read_text()) == {"step": 3, "reward": None}


def test_library_noise_is_filtered_only_inside_and_other_warnings_pass() -> None:
    def library_calls() -> None:
        warnings.warn_explicit(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6.",
            FutureWarning,
            "modeling_utils.py",
            1,
            module="transformers.modeling_utils",
        )
        warnings.warn_explicit(
            "`gradient_checkpointing_enable` is deprecated and will be removed in v6.",
            FutureWarning,
            "modeling_utils.py",
            2,
            module="transformers.modeling_utils",
        )
        warnings.warn(
            "You are using 'rollout_func', which is an experimental feature.", UserWarning, stacklevel=1
        )
        warnings.warn("the user's own deprecation", FutureWarning, stacklevel=1)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet(library_calls)()
        inside = [str(w.message) for w in seen]
        seen.clear()
        library_calls()
        outside = [str(w.message) for w in seen]
    assert inside == ["the user's own deprecation"]
    assert len(outside) == 4  # the filters did not outlive the call
    # The same deprecation from another module (e.g. the user's code) is not filtered.
    with warnings.catch_warnings(record=True) as seen, library_noise_filtered():
        warnings.simplefilter("always")
        warnings.warn_explicit(
            "`is_gradient_checkpointing` is deprecated",
            FutureWarning,
            "mine.py",
            1,
            module="my_package.model",
        )
    assert len(seen) == 1


def test_deepspeeds_cpu_notice_and_progress_bars_are_off_only_inside() -> None:
    from transformers.utils import logging as hf_logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    ds = logging.getLogger("DeepSpeed")
    handler = Keep()
    ds.addHandler(handler)
    try:
        with library_noise_filtered():
            assert not hf_logging.is_progress_bar_enabled()
            ds.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable ...")
            ds.warning("a real DeepSpeed problem")
        ds.warning("Setting accelerator to CPU (outside)")
    finally:
        ds.removeHandler(handler)
    assert records == ["a real DeepSpeed problem", "Setting accelerator to CPU (outside)"]
    assert hf_logging.is_progress_bar_enabled()


@pytest.mark.parametrize("passed", [None, False])
def test_configs_keep_the_checkpointing_choice_without_transformers_deprecation(tmp_path, passed) -> None:
    from agentforge.trainers.grpo_config import TrainConfig
    from agentforge.trainers.replay.sft_config import ReplaySFTConfig

    extra = {} if passed is None else {"gradient_checkpointing": passed}
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        configs = [
            TrainConfig(output_dir=str(tmp_path), num_generations=2, tasks_per_step=1, use_cpu=True, **extra),
            ReplaySFTConfig(output_dir=str(tmp_path), use_cpu=True, **extra),
        ]
    assert not [w for w in seen if "checkpointing" in str(w.message)], [str(w.message) for w in seen]
    expected = True if passed is None else passed  # TRL's default is True
    for config in configs:
        assert config.activation_checkpointing is expected and config.gradient_checkpointing is expected
    bare = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    adopt_activation_checkpointing(bare)  # already resolved: left alone
    assert bare.activation_checkpointing is False


def test_the_train_command_passes_report_to_integrations_and_keeps_its_checkpointing_choice(tmp_path) -> None:
    from agentforge.commands.train import _config

    args = (tmp_path, 2, 2, 1, 1, 1e-4, 8, 8, 0)
    assert _config(*args, " tensorboard, wandb").report_to == ["tensorboard", "wandb"]
    config = _config(*args)  # the default: no integration, metrics.jsonl only
    assert config.report_to == [] and config.activation_checkpointing is False


def test_an_open_ended_run_shows_no_total_and_no_eta() -> None:
    console = _recording_console()
    state = transformers.TrainerState(global_step=3, max_steps=10**9)  # the continual trainer: until stopped
    step_console = StepConsole(console, version=lambda: "policy@v4", open_ended=True)
    step_console.on_train_begin(None, transformers.TrainerState(global_step=0, max_steps=10**9), None)
    step_console.on_log(None, state, None, logs={"reward": 0.5, "reward_std": 0.5, "train/step_s": 2.0})
    assert console.export_text() == "step 3  reward 0.500 ±0.50  2.0 s/step  policy@v4\n"


def test_a_step_without_learning_signal_says_so(caplog) -> None:
    """Every group's rewards equal (TRL's frac_reward_zero_std == 1): the console and the log warn, since the
    step changed nothing (a new user trained a zero adapter without a word)."""
    import logging

    from agentforge.trainers.progress import no_signal_warning

    console = _recording_console()
    state = transformers.TrainerState(global_step=2, max_steps=2)
    with caplog.at_level(logging.WARNING, logger="agentforge.trainers"):
        StepConsole(console).on_log(
            None, state, None, logs={"reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0}
        )
        StepConsole(console).on_log(
            None, state, None, logs={"reward": 0.5, "reward_std": 0.5, "frac_reward_zero_std": 0.5}
        )
    text = console.export_text()
    assert "no learning signal" in text and text.count("no learning signal") == 1
    assert [r.getMessage() for r in caplog.records] == [no_signal_warning(2)]


def test_a_step_whose_conversations_split_says_so(caplog) -> None:
    """Rollouts split into several trajectories (the batch report's batch/split_share): the console and the
    log warn, since only each split rollout's last piece trained (issue 12 item 2)."""
    import logging

    from agentforge.trainers.progress import split_warning

    console = _recording_console()
    state = transformers.TrainerState(global_step=3, max_steps=4)
    with caplog.at_level(logging.WARNING, logger="agentforge.trainers"):
        StepConsole(console).on_log(None, state, None, logs={"reward": 0.5, "batch/split_share": 0.25})
        StepConsole(console).on_log(None, state, None, logs={"reward": 0.5, "batch/split_share": 0.0})
    text = console.export_text()
    assert text.count("split into several trajectories") == 1 and "25%" in text
    assert [r.getMessage() for r in caplog.records] == [split_warning(3, 0.25)]


def test_a_config_left_unset_trains_in_float32_on_the_cpu_of_a_machine_without_an_accelerator(
    tmp_path,
) -> None:
    import torch

    from agentforge.trainers.grpo_config import TrainConfig

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has an accelerator")
    unset = TrainConfig(
        output_dir=str(tmp_path), num_generations=2, tasks_per_step=1
    )  # TRL alone refuses this
    assert (unset.use_cpu, unset.bf16) == (True, False)
    chosen = TrainConfig(
        output_dir=str(tmp_path), num_generations=2, tasks_per_step=1, use_cpu=True, bf16=True
    )
    assert (chosen.use_cpu, chosen.bf16) == (True, True)  # a choice is kept
