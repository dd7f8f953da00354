"""Does an adapter's LoRA actually touch the served model? Its tensor keys checked against the base's modules.

An adapter whose config names the right base model can still carry tensors for another architecture (GPT-2's
``c_attn``/``c_proj`` on a Llama-style model): engines load it without complaint and then serve the base
model's output byte for byte under the new version name. Before a version goes live,
:func:`check_adapter_modules` reads the tensor names and shapes from the safetensors headers alone (no torch,
a few KB read) and requires that

* every LoRA tensor, its PEFT prefix (``base_model.model.``) and LoRA suffix stripped, names a module of the
  served checkpoint that has a 2-D weight (the layers LoRA adapts: linear projections and embeddings), with
  matching shapes (``lora_A``: ``(r, in)``, ``lora_B``: ``(out, r)`` for a base weight ``(out, in)``), and
* each module the config's ``target_modules`` list promises has at least one such tensor.

Checkpoints this cannot read (a hub name, ``.bin`` weights) skip the check; what it refuses is listed with
sample names from both sides.
"""

from __future__ import annotations

import json
import struct
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentforge.errors import AdapterIncompatibleError, UserError

__all__ = ["safetensors_shapes", "base_modules", "adapter_modules", "check_adapter_modules"]

_PEFT_PREFIX = "base_model.model."
_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B")
_SAMPLES = 4


def safetensors_shapes(file: Path) -> dict[str, list[int]]:
    """Tensor name → shape from a ``.safetensors`` file's header (reads only the header).

    Args:
        file: the safetensors file.

    Returns:
        ``{name: shape}`` for every tensor (``__metadata__`` left out).

    Raises:
        UserError: the file is unreadable or its header is not safetensors JSON.
    """
    try:
        with open(file, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > 100_000_000:
                raise ValueError(f"header of {size} bytes")
            header = json.loads(handle.read(size))
    except (OSError, struct.error, ValueError) as exc:
        raise UserError(f"cannot read the safetensors header of {file}: {exc}") from exc
    return {k: list(v["shape"]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


@lru_cache(maxsize=8)
def _base_modules(folder: str, stamp: float) -> dict[str, list[int]] | None:
    root = Path(folder)
    files = [root / "model.safetensors"] if (root / "model.safetensors").is_file() else []
    index = root / "model.safetensors.index.json"
    if not files and index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"cannot read {index}: {exc}") from exc
        files = [root / shard for shard in sorted(shards)]
    if not files:
        return None
    shapes: dict[str, list[int]] = {}
    for file in files:
        shapes.update(safetensors_shapes(file))
    modules = {
        k.removesuffix(".weight"): s for k, s in shapes.items() if k.endswith(".weight") and len(s) == 2
    }
    try:
        tied = bool(json.loads((root / "config.json").read_text()).get("tie_word_embeddings"))
    except (OSError, ValueError):
        tied = False
    embed = next((s for m, s in modules.items() if m.endswith("embed_tokens")), None)
    if tied and "lm_head" not in modules and embed is not None:
        modules["lm_head"] = embed  # tied output head: served, but stored only as the embedding
    return modules


def base_modules(model: str | Path) -> dict[str, list[int]] | None:
    """The served checkpoint's LoRA-adaptable modules: module name → weight shape ``(out, in)``.

    Args:
        model: the checkpoint directory (a hub name or a missing directory gives ``None``).

    Returns:
        ``{module: [out, in]}`` for every 2-D ``*.weight`` in ``model.safetensors`` (or its shards), the
        tied ``lm_head`` included; ``None`` when the checkpoint has no safetensors weights to read.

    Raises:
        UserError: a safetensors file or the shard index is unreadable.
    """
    folder = Path(str(model)).expanduser()
    if not folder.is_dir():
        return None
    stamps = [f.stat().st_mtime for f in folder.glob("model*.safetensors*")]
    return _base_modules(str(folder.resolve()), max(stamps, default=0.0))


def adapter_modules(path: str | Path) -> dict[str, dict[str, list[int]]] | None:
    """The modules an adapter's LoRA tensors adapt: module → ``{"lora_A": shape, "lora_B": shape, ...}``.

    Args:
        path: the adapter directory.

    Returns:
        Module names with the PEFT prefix and LoRA suffix stripped (``model.layers.0.self_attn.q_proj``),
        each with its LoRA tensors' shapes (``lora_A``/``lora_B``, or ``lora_embedding_A``/``_B``);
        ``None`` when the adapter has no ``adapter_model.safetensors`` (``.bin`` is not inspected).

    Raises:
        UserError: the safetensors header is unreadable.
    """
    file = Path(path).expanduser() / "adapter_model.safetensors"
    if not file.is_file():
        return None
    modules: dict[str, dict[str, list[int]]] = {}
    for key, shape in safetensors_shapes(file).items():
        suffix = next((s for s in _LORA_SUFFIXES if key.endswith(s)), None)
        if suffix is None:
            continue  # magnitude vectors, modules_to_save: not LoRA matrices
        module = key.removesuffix(suffix).removeprefix(_PEFT_PREFIX)
        modules.setdefault(module, {})[suffix.strip(".").removesuffix(".weight")] = shape
    return modules


def _fits(lora: dict[str, list[int]], base: list[int]) -> bool:
    out, inp = base
    a, b = lora.get("lora_A"), lora.get("lora_B")
    if a is not None or b is not None:
        return (a is None or a[-1] == inp) and (b is None or b[0] == out)
    ea, eb = lora.get("lora_embedding_A"), lora.get("lora_embedding_B")  # embedding (vocab, dim)
    return (ea is None or ea[-1] == out) and (eb is None or eb[0] == inp)


def _promised(target_modules: Any) -> list[str]:
    if isinstance(target_modules, list | tuple | set):
        return sorted(str(t) for t in target_modules)
    return []  # "all-linear" or a regex: no module list to hold the adapter to


def check_adapter_modules(path: str | Path, *, base_model: str | Path, target_modules: Any) -> None:
    """Refuse an adapter whose LoRA tensors would change nothing (or less than promised) on ``base_model``.

    Args:
        path: the adapter directory.
        base_model: the served checkpoint directory (a name that is no directory skips the check).
        target_modules: the adapter config's ``target_modules`` (list, regex string or ``None``).

    Raises:
        AdapterIncompatibleError: no LoRA tensor at all; tensors for modules the served model lacks or whose
            shapes differ; or a promised target module without tensors. The message lists sample names from
            the adapter and from the served model.
        UserError: a safetensors header is unreadable.
    """
    lora = adapter_modules(path)
    base = base_modules(base_model) if lora is not None else None
    if lora is None or base is None:
        return
    folder = Path(path).expanduser().resolve()
    served = ", ".join(sorted(base)[:: max(1, len(base) // _SAMPLES)][:_SAMPLES])
    if not lora:
        raise AdapterIncompatibleError(
            f"adapter {folder} holds no LoRA tensors (no *.lora_A.weight / *.lora_B.weight keys); it would "
            f"serve the base model unchanged. Served model modules, e.g.: {served}"
        )
    missing = sorted(m for m in lora if m not in base)
    wrong = sorted(m for m in lora if m in base and not _fits(lora[m], base[m]))
    unmet = [
        t
        for t in _promised(target_modules)
        if not any(m == t or m.endswith(f".{t}") for m in base.keys() & lora)
    ]
    if not (missing or wrong or unmet):
        return
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of its {len(lora)} LoRA modules are not in the served model, e.g. {', '.join(missing[:_SAMPLES])}"
        )
    if wrong:
        detail = ", ".join(f"{m} {lora[m]} vs base {base[m]}" for m in wrong[:_SAMPLES])
        problems.append(f"{len(wrong)} have shapes that do not fit the served weights: {detail}")
    if unmet:
        problems.append(f"its config promises target_modules {unmet} that no tensor of it adapts")
    raise AdapterIncompatibleError(
        f"adapter {folder} does not fit the served model {str(base_model)!r}: {'; '.join(problems)}. "
        f"Served model modules, e.g.: {served}. Was it trained on another architecture? Retrain it on the "
        "served base model; nothing was loaded"
    )
