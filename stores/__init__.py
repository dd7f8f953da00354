"""Trace stores: the ``TraceStore`` protocol and its SQL (SQLite/PostgreSQL) and HTTP backends.

``SQLStore``, ``HTTPStore``, ``store_router`` and ``create_store_app`` are imported on first use, so
``import agentforge.stores`` stays light (no SQLAlchemy engine, no FastAPI).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentforge.ports import TraceStore

if TYPE_CHECKING:
    from agentforge.stores.http import HTTPStore
    from agentforge.stores.server import create_store_app, store_router
    from agentforge.stores.sql import SQLStore

__all__ = ["TraceStore", "SQLStore", "HTTPStore", "store_router", "create_store_app"]

_LAZY = {
    "SQLStore": "agentforge.stores.sql",
    "HTTPStore": "agentforge.stores.http",
    "store_router": "agentforge.stores.server",
    "create_store_app": "agentforge.stores.server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentforge.stores' has no attribute {name!r}")
