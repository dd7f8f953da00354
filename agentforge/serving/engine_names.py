"""Loading and unloading an adapter name an engine may or may not hold already.

A published version's name always means the same weights (DESIGN fact 2), so when the engine still holds a name
serving wants loaded (an unload that failed left it there, or a load raced an engine restart) serving it is right,
and when it no longer holds a name serving wants unloaded (it restarted) that name is unloaded all the same. These
two helpers say so for any :class:`~agentforge.ports.PolicyServer` (vLLM or embedded); the engines themselves
refuse a name in use (``UserError``), and a name they do not hold (``NotFoundError``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from agentforge.errors import NotFoundError, ServingError, UserError

if TYPE_CHECKING:
    from agentforge.ports import PolicyServer

__all__ = ["load_or_reuse", "unload_if_held"]

log = logging.getLogger(__name__)


def load_or_reuse(server: PolicyServer, name: str, path: str | Path) -> bool:
    """Load the adapter at ``path`` under ``name``, or keep the one the engine holds under that name already.

    Args:
        server: the engine.
        name: a published version's name (the same weights whenever it is loaded).
        path: that version's adapter directory.

    Returns:
        Whether the engine held ``name`` already (nothing was loaded).

    Raises:
        UserError, AdapterIncompatibleError, ServingError: as ``server.load_adapter``, when the engine does not
            list ``name`` among its adapters afterwards (a refusal for another reason, or a failed load).
    """
    try:
        server.load_adapter(name, str(path))
    except UserError:
        try:
            held = name in server.adapters()
        except ServingError:
            held = False
        if not held:
            raise
        log.warning("%s was still loaded in the engine; serving it", name)
        return True
    return False


def unload_if_held(server: PolicyServer, name: str) -> None:
    """Unload ``name``; an engine that no longer holds it (restarted) counts as unloaded (logged).

    Raises:
        ServingError: the engine failed to unload it (it may still hold it: :func:`load_or_reuse` reuses it).
    """
    try:
        server.unload_adapter(name)
    except NotFoundError as exc:
        log.warning("%s was no longer loaded in the engine: %s", name, exc)
