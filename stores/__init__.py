"""Trace stores: the ``TraceStore`` protocol and its SQL (SQLite/PostgreSQL) and HTTP backends."""

from agentforge.stores.base import TraceStore

__all__ = ["TraceStore"]
