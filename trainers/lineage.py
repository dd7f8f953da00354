"""One adapter lineage trained over several rounds keeps its optimizer state.

A *lineage* is the chain of adapters one policy serves: each GRPO round is a new :class:`~agentforge.trainers.
grpo_trainer.LightningTrainer` that continues the served adapter (``TrainConfig.init_adapter``). ``transformers``
builds a fresh AdamW for every trainer, so each round used to start with Adam's moments at zero, and Adam's
first step then moves every LoRA weight by about ``±lr`` whatever the gradient (its update is ``m̂ / √v̂`` with
both moments from that one gradient; Kingma & Ba 2015, §2), a jolt at the start of every round (DESIGN fact 10).

**Saved.** Whenever the trainer publishes an adapter (``{output_dir}/adapters/step-N``), the optimizer state goes
beside it as :data:`OPTIMIZER_STATE_FILE` (:func:`save_optimizer_state`): per trainable parameter, by name, its
state tensors (AdamW: ``exp_avg``, ``exp_avg_sq`` and the bias-correction ``step``), the parameters' names and
shapes in order, the optimizer's class, and the steps the lineage has taken. The name differs from
``transformers``' ``optimizer.pt`` on purpose: an adapter folder is not a resumable checkpoint
(:mod:`~agentforge.trainers.checkpoints`).

**Loaded.** :class:`LineageOptimizer` (a mixin of the trainer class, :mod:`~agentforge.trainers.lightning_grpo`)
overrides ``Trainer.create_optimizer``, the override point ``transformers`` documents for this, and loads the
state found in ``init_adapter`` into the new optimizer before the first step (:func:`load_optimizer_state`).
Parameters are matched by name, in the order of the trainable parameters; when the names, their shapes or the
optimizer class differ (another rank, other target modules, another optimizer) it warns, says why, and starts
fresh. A resume from a full checkpoint (``train(resume_from_checkpoint=...)``) loads the checkpoint's optimizer
afterwards, so the checkpoint wins. The learning-rate schedule is not carried: a warm-up restarts every round.

**Continuing a lineage.** The next round passes the *served* adapter's folder (:func:`served_adapter_dir`) as
``init_adapter``: after a promotion that is the new adapter, after a refusal the one still serving, so a refused
candidate's weights and its moments are dropped together.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from agentforge.errors import NotFoundError
from agentforge.ports import TraceStore

__all__ = [
    "OPTIMIZER_STATE_FILE",
    "LineageOptimizer",
    "load_optimizer_state",
    "save_optimizer_state",
    "served_adapter_dir",
]

logger = logging.getLogger("agentforge.trainer")

#: The file beside a published adapter that holds the optimizer state of its lineage.
OPTIMIZER_STATE_FILE = "lineage_optimizer.pt"
_FORMAT = 1


def _trainable(model: Any) -> list[tuple[str, torch.nn.Parameter]]:
    """``model``'s trainable parameters, in order, named without a DDP ``module.`` prefix."""
    return [(n.removeprefix("module."), p) for n, p in model.named_parameters() if p.requires_grad]


def _inner(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside ``accelerate``'s ``AcceleratedOptimizer`` (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def save_optimizer_state(optimizer: Any, model: Any, folder: str | Path, lineage_steps: int) -> Path:
    """Write ``optimizer``'s state for ``model``'s trainable parameters to ``folder/``:data:`OPTIMIZER_STATE_FILE`.

    Args:
        optimizer: the trainer's optimizer (a torch optimizer, possibly wrapped by ``accelerate``).
        model: the trained model (e.g. the ``PeftModel``); its trainable parameters name the state.
        folder: the adapter folder the state goes beside.
        lineage_steps: optimizer steps the lineage has taken, this round's included.

    Returns:
        The file written (CPU tensors; a parameter without state yet, never stepped, has none in it).
    """
    inner = _inner(optimizer)
    named = _trainable(model)
    state = {
        n: {k: v.detach().cpu().clone() for k, v in inner.state[p].items()}
        for n, p in named
        if p in inner.state
    }
    payload = {
        "format": _FORMAT,
        "optimizer": type(inner).__name__,
        "lineage_steps": int(lineage_steps),
        "params": [(n, list(p.shape)) for n, p in named],
        "state": state,
    }
    path = Path(folder) / OPTIMIZER_STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def _mismatch(saved: dict[str, Any], named: list[tuple[str, torch.nn.Parameter]], inner: Any) -> str | None:
    """Why ``saved`` cannot be loaded for these parameters and optimizer (``None``: it can)."""
    if saved.get("format") != _FORMAT:
        return f"format {saved.get('format')!r}, this agentforge reads {_FORMAT}"
    if saved.get("optimizer") != type(inner).__name__:
        return f"it is {saved.get('optimizer')}'s state and this run uses {type(inner).__name__}"
    have = [(n, list(p.shape)) for n, p in named]
    want = [(n, list(shape)) for n, shape in saved["params"]]
    if [n for n, _ in have] != [n for n, _ in want]:
        missing = sorted({n for n, _ in want} - {n for n, _ in have})
        extra = sorted({n for n, _ in have} - {n for n, _ in want})
        return (
            f"the trainable parameters differ ({len(want)} saved, {len(have)} now; not trainable now: "
            f"{missing[:3]}, not saved: {extra[:3]})"
        )
    for (name, shape), (_, saved_shape) in zip(have, want, strict=True):
        if shape != saved_shape:
            return f"{name} has shape {shape}, the saved state {saved_shape}"
    in_optimizer = {id(p) for group in inner.param_groups for p in group["params"]}
    outside = [n for n, p in named if id(p) not in in_optimizer]
    return f"{outside[0]} is trainable but not in the optimizer" if outside else None


def load_optimizer_state(optimizer: Any, model: Any, folder: str | Path) -> dict[str, Any] | None:
    """Load the lineage's optimizer state saved in ``folder`` into a new ``optimizer`` (module docstring).

    Args:
        optimizer: a freshly built optimizer over ``model``'s trainable parameters (no step taken yet).
        model: the model whose trainable parameters ``optimizer`` updates.
        folder: an adapter folder (``init_adapter``).

    Returns:
        ``{"path", "lineage_steps"}`` when the state was loaded; ``None`` when ``folder`` holds none (a fresh
        state, silently: e.g. a replay-SFT adapter) or it does not fit (a fresh state, with a warning saying why).
    """
    path = Path(folder) / OPTIMIZER_STATE_FILE
    if not path.is_file():
        return None
    inner = _inner(optimizer)
    named = _trainable(model)
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        problem = _mismatch(saved, named, inner)
    except Exception as exc:  # a truncated or foreign file: the run still trains, from a fresh state
        problem = f"it cannot be read ({exc!r})"
    if problem is not None:
        logger.warning(
            "not loading the optimizer state of %s: %s; this round starts with a fresh optimizer (Adam's moments at "
            "zero)",
            path,
            problem,
        )
        return None
    index = {id(p): i for i, p in enumerate(p for group in inner.param_groups for p in group["params"])}
    state = {index[id(p)]: saved["state"][n] for n, p in named if n in saved["state"]}
    inner.load_state_dict({"state": state, "param_groups": inner.state_dict()["param_groups"]})
    logger.info("optimizer state of %s loaded (%d steps in the lineage)", path, saved["lineage_steps"])
    return {"path": str(path), "lineage_steps": int(saved["lineage_steps"])}


class LineageOptimizer:
    """Mixin for ``transformers.Trainer``: the optimizer starts from ``args.init_adapter``'s saved state.

    Attributes:
        lineage_loaded: ``{"path", "lineage_steps"}`` of the state loaded, or ``None`` (a fresh optimizer).
        lineage_steps: optimizer steps of the lineage before this run (0 for a fresh one).
    """

    lineage_loaded: dict[str, Any] | None = None
    lineage_steps: int = 0

    def create_optimizer(self, model: Any = None) -> Any:
        """``transformers``' optimizer, loaded with the lineage's state when ``init_adapter`` holds one."""
        fresh = self.optimizer is None  # type: ignore[attr-defined]
        optimizer = super().create_optimizer(model)  # type: ignore[misc]
        folder = getattr(self.args, "init_adapter", "")  # type: ignore[attr-defined]
        if fresh and folder:
            target = model if model is not None else self.model  # type: ignore[attr-defined]
            self.lineage_loaded = load_optimizer_state(optimizer, target, folder)
            self.lineage_steps = self.lineage_loaded["lineage_steps"] if self.lineage_loaded else 0
        return optimizer


def served_adapter_dir(store: TraceStore, alias: str = "policy") -> str:
    """The adapter folder of the version ``alias`` serves, to continue its lineage (``init_adapter``).

    Args:
        store: the trace store publishers record versions in.
        alias: the served model alias (a tenant's alias, e.g. ``policy@acme``, for its lineage).

    Returns:
        The active version's adapter folder, or ``""`` when the base model serves (nothing published, or a
        rollback to the base): the next round then starts a fresh adapter.
    """
    try:
        active = store.get_resource(alias)
    except NotFoundError:
        return ""
    if active.payload.get("base") or not active.payload.get("path"):
        return ""
    return str(active.payload["path"])
