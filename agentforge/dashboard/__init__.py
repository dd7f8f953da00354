"""The dashboard: a read-only web view of a trace store (``agentforge dashboard``, ``/dashboard`` on ``serve``).

:func:`~agentforge.dashboard.app.create_dashboard_app` builds the FastAPI app; :mod:`agentforge.dashboard.views`
computes what each page shows, through the :class:`~agentforge.ports.TraceStore` port only. Importing this
package imports neither FastAPI nor the store backends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

    from agentforge.ports import TraceStore

__all__ = ["create_dashboard_app"]


def create_dashboard_app(store: TraceStore, api_key: str | None = None, **kwargs: Any) -> FastAPI:
    """See :func:`agentforge.dashboard.app.create_dashboard_app` (imported on call)."""
    from agentforge.dashboard.app import create_dashboard_app as create

    return create(store, api_key, **kwargs)
