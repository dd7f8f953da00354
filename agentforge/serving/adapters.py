"""Read and check PEFT LoRA adapter directories before they reach an inference engine.

An adapter directory is what ``peft.PeftModel.save_pretrained`` writes: ``adapter_config.json`` plus
``adapter_model.safetensors``. Serving checks two things before loading (DESIGN.md, fact 2):

* the adapter was trained on the served base model (``base_model_name_or_path``), and
* its effective LoRA rank — ``r`` or the largest value in ``rank_pattern`` — fits the server's
  ``--max-lora-rank``, which vLLM only accepts from :data:`VLLM_LORA_RANKS`, and
* its LoRA tensors adapt modules the served checkpoint has, with fitting shapes, and every module its
  config promises (:mod:`agentforge.serving.adapter_modules`): an adapter for another architecture would
  otherwise go live and serve the base model's output unchanged.

Nothing here imports torch or peft: the checks read JSON (and, for :func:`adapter_weights`, the
safetensors header and raw bytes) only.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from agentforge.errors import AdapterIncompatibleError, ConfigError, UserError
from agentforge.serving.adapter_modules import check_adapter_modules

__all__ = [
    "VLLM_LORA_RANKS",
    "AdapterInfo",
    "AdapterWeights",
    "adapter_weights",
    "adapter_weights_later",
    "read_adapter",
    "check_adapter",
    "check_max_lora_rank",
    "same_model",
]

#: The values vLLM accepts for ``--max-lora-rank`` (``vllm.config.lora.MaxLoRARanks``).
VLLM_LORA_RANKS: tuple[int, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class AdapterInfo:
    """What serving needs to know about one adapter directory.

    Attributes:
        path: the adapter directory (resolved).
        base_model: ``base_model_name_or_path`` from ``adapter_config.json`` (may be empty).
        r: the default LoRA rank.
        max_rank: the effective maximum rank: ``max(r, *rank_pattern.values())``.
        rank_pattern: per-module rank overrides (module pattern → rank).
        target_modules: the adapted modules as recorded (list, or a regex string).
    """

    path: Path
    base_model: str
    r: int
    max_rank: int
    rank_pattern: dict[str, int] = field(default_factory=dict)
    target_modules: list[str] | str | None = None


def read_adapter(path: str | Path) -> AdapterInfo:
    """Read ``adapter_config.json`` of a PEFT LoRA adapter directory.

    Args:
        path: the adapter directory.

    Returns:
        The parsed :class:`AdapterInfo`.

    Raises:
        UserError: the directory or its ``adapter_config.json`` is missing or unreadable, or the adapter
            is not a LoRA adapter.
    """
    folder = Path(path).expanduser().resolve()
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise UserError(
            f"{folder} is not a PEFT adapter directory (no adapter_config.json); pass the folder "
            "written by PeftModel.save_pretrained"
        )
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {config_file}: {exc}") from exc
    peft_type = str(config.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise UserError(f"{folder} holds a {peft_type} adapter; serving loads LoRA adapters only")
    r = int(config.get("r") or 0)
    rank_pattern = {str(k): int(v) for k, v in (config.get("rank_pattern") or {}).items()}
    return AdapterInfo(
        path=folder,
        base_model=str(config.get("base_model_name_or_path") or ""),
        r=r,
        max_rank=max([r, *rank_pattern.values()]),
        rank_pattern=rank_pattern,
        target_modules=config.get("target_modules"),
    )


def same_model(a: str | Path, b: str | Path) -> bool:
    """Whether two model references name the same checkpoint.

    Two references match when they resolve to the same existing directory, or when their last path
    components are equal ignoring case (``/cache/SmolLM2-135M-Instruct`` and
    ``HuggingFaceTB/SmolLM2-135M-Instruct``): adapters record the path they were trained from, which
    differs between machines.

    Args:
        a: a model name or checkpoint path.
        b: a model name or checkpoint path.

    Returns:
        True when both refer to the same model.
    """
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return pa.name.lower() == pb.name.lower() and bool(pa.name)


def check_max_lora_rank(max_lora_rank: int) -> int:
    """Validate a server's ``--max-lora-rank``.

    Args:
        max_lora_rank: the requested maximum rank.

    Returns:
        ``max_lora_rank`` unchanged.

    Raises:
        ConfigError: vLLM does not accept the value; the message lists the accepted values.
    """
    if max_lora_rank not in VLLM_LORA_RANKS:
        accepted = ", ".join(map(str, VLLM_LORA_RANKS))
        raise ConfigError(f"max_lora_rank={max_lora_rank} is not accepted by vLLM; use one of {accepted}")
    return max_lora_rank


def check_adapter(path: str | Path, *, base_model: str | Path, max_lora_rank: int) -> AdapterInfo:
    """Check that an adapter can be served by a server with ``base_model`` and ``max_lora_rank``.

    A passed check is remembered while ``adapter_config.json`` and ``adapter_model.safetensors`` keep their
    inode, size and time stamps (for the same served model path and rank), so checking the same files again
    (the hot swap, then the engine's load) costs two ``stat`` calls.

    Args:
        path: the adapter directory.
        base_model: the served base model (path or name).
        max_lora_rank: the server's ``--max-lora-rank``.

    Returns:
        The adapter's :class:`AdapterInfo`.

    Raises:
        UserError: the directory is not a readable LoRA adapter.
        AdapterIncompatibleError: the base model differs, the effective rank exceeds ``max_lora_rank``, or
            its tensors do not adapt the served model's modules (see
            :func:`~agentforge.serving.adapter_modules.check_adapter_modules`); the message says what to change.
    """
    folder = Path(path).expanduser().resolve()
    stamp = _stamp(folder / "adapter_config.json", folder / "adapter_model.safetensors")
    return _checked(folder, str(base_model), max_lora_rank, stamp)


def _stamp(*files: Path) -> tuple[tuple[int, int, int, int] | None, ...]:
    """Identity of each file's current content for the caches below: ``(inode, size, mtime_ns, ctime_ns)``
    (``None`` for a missing file); rewriting a file changes its ctime even where its mtime is set back."""
    stamps: list[tuple[int, int, int, int] | None] = []
    for file in files:
        try:
            st = os.stat(file)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(stamps)


@lru_cache(maxsize=32)
def _checked(folder: Path, base_model: str, max_lora_rank: int, stamp: object) -> AdapterInfo:
    """:func:`check_adapter` of unchanged files (``stamp``), run once: a hot swap checks an adapter before it
    asks for a slot and the engine's ``load_adapter`` checks it again (errors are not cached)."""
    info = read_adapter(folder)
    if info.base_model and not same_model(info.base_model, base_model):
        raise AdapterIncompatibleError(
            f"adapter {info.path} was trained on {info.base_model!r} but the server serves {str(base_model)!r}; "
            "retrain the adapter on the served base model or serve its base model"
        )
    if info.max_rank > max_lora_rank:
        where = "r" if info.max_rank == info.r else f"rank_pattern (max {info.max_rank}, r={info.r})"
        bigger = next((v for v in VLLM_LORA_RANKS if v >= info.max_rank), None)
        restart = f" or restart the server with --max-lora-rank {bigger}" if bigger else ""
        raise AdapterIncompatibleError(
            f"adapter {info.path} has LoRA rank {info.max_rank} from {where}, above the server maximum "
            f"--max-lora-rank {max_lora_rank}; retrain with r<={max_lora_rank} (and no rank_pattern entry "
            f"above it){restart}"
        )
    check_adapter_modules(info.path, base_model=base_model, target_modules=info.target_modules)
    return info


@dataclass(frozen=True)
class AdapterWeights:
    """A cheap summary of an adapter's weights, to tell whether two versions must answer differently.

    Attributes:
        digest: SHA-256 of the weight file (``adapter_model.safetensors`` or ``.bin``); equal digests
            mean equal weights.
        zero: every ``lora_B`` tensor is all zero bytes (a freshly initialised LoRA: it adds nothing,
            so it answers exactly like the base model). Always False for ``.bin`` files (not inspected).
    """

    digest: str
    zero: bool


def adapter_weights(path: str | Path) -> AdapterWeights:
    """Hash an adapter's weight file and check whether its LoRA ``B`` matrices are all zero.

    Reads the file once (a few MB for a small LoRA; about 1 GB/s), without torch. The summary is remembered
    per file while its inode, size and time stamps stay the same (a rollback or a restart loads the same files
    again).

    Args:
        path: the adapter directory.

    Returns:
        The :class:`AdapterWeights`.

    Raises:
        UserError: the directory holds no ``adapter_model.safetensors``/``adapter_model.bin``, or the
            safetensors header cannot be parsed.
    """
    folder = Path(path).expanduser().resolve()
    for name in ("adapter_model.safetensors", "adapter_model.bin"):
        if (folder / name).is_file():
            return _weights(folder / name, _stamp(folder / name))
    raise UserError(f"{folder} holds no adapter_model.safetensors or adapter_model.bin")


@lru_cache(maxsize=32)
def _weights(file: Path, stamp: object) -> AdapterWeights:
    """:func:`adapter_weights` of one weight file whose content ``stamp`` identifies."""
    data = file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if file.suffix == ".bin":
        return AdapterWeights(digest, zero=False)
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
    except (struct.error, ValueError) as exc:
        raise UserError(f"cannot read the safetensors header of {file}: {exc}") from exc
    start = 8 + size
    b_tensors = [v["data_offsets"] for k, v in header.items() if k != "__metadata__" and "lora_B" in k]
    zero = bool(b_tensors) and all(not data[start + a : start + b].strip(b"\0") for a, b in b_tensors)
    return AdapterWeights(digest, zero=zero)


_worker_lock = threading.Lock()
_worker: tuple[int, ThreadPoolExecutor] | None = None  # (the process it belongs to, the pool)


def adapter_weights_later(path: str | Path) -> Callable[[], AdapterWeights]:
    """Run :func:`adapter_weights` on a background thread (the read and the hash release the GIL), so it runs
    beside other work: a hot swap hashes the weights while the engine loads them and answers its canary.

    One worker thread for the process, started on the first call and kept (it exits with the interpreter; a
    forked child starts its own): starting a thread per swap cost up to 0.2 s inside the swap on busy
    shared cores.

    Args:
        path: the adapter directory.

    Returns:
        A function that waits for the result and returns it, or raises what :func:`adapter_weights` raised
        (``UserError``).
    """
    global _worker
    with _worker_lock:
        if _worker is None or _worker[0] != os.getpid():  # a forked child has no copy of the thread
            _worker = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="adapter-weights"))
        future = _worker[1].submit(adapter_weights, path)
    return future.result
