"""Files and process helpers of the vLLM server: its chat templates, the key guard's folder, a free port,
and the child's death signal."""

from __future__ import annotations

import contextlib
import signal
from importlib import resources
from pathlib import Path

__all__ = ["tool_chat_template", "guard_dir", "default_chat_template"]


def tool_chat_template() -> Path:
    """Path of agentforge's SmolLM2 chat template with Hermes-style tool calls (``<tool_call>``)."""
    return Path(str(resources.files("agentforge.serving") / "templates" / "smollm2_tools.jinja"))


def guard_dir() -> Path:
    """The folder holding ``agentforge_vllm_guard.py``, put on the vLLM process's ``PYTHONPATH``."""
    return Path(str(resources.files("agentforge.serving") / "vllm_guard"))


def default_chat_template(model: str | Path) -> Path | None:
    """The chat template to serve ``model`` with tool calls: ``None`` (its own) if the checkpoint's template
    mentions tools, else :func:`tool_chat_template` (SmolLM2 format with Hermes-style tool calls)."""
    texts = []
    for name in ("chat_template.jinja", "tokenizer_config.json"):
        with contextlib.suppress(OSError):
            texts.append((Path(model) / name).read_text())
    return None if any("tools" in text for text in texts) else tool_chat_template()


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the starting thread's process dies.

    Without this, a parent killed by SIGTERM/SIGKILL (no ``atexit``) leaves vLLM running and holding memory.
    Linux delivers the signal when the *thread* that started vLLM exits, so start the server from a
    long-lived thread (the main thread, as the examples and test fixtures do). No-op off Linux.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass
