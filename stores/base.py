"""The ``TraceStore`` protocol, kept under its first import path.

The contract every store backend (SQLite, PostgreSQL, HTTP client) keeps lives with the other ports in
:mod:`agentforge.ports`; new code imports it from there (or ``from agentforge import TraceStore``).
"""

from agentforge.ports import TraceStore

__all__ = ["TraceStore"]
