"""Open a trace store from a URL: the one place that maps a URL to a concrete store.

* ``sqlite:///path/traces.db`` (a file, WAL mode) or ``sqlite://`` (in memory) →
  :class:`~agentforge.stores.sql.SQLStore`;
* ``postgresql+psycopg://user:pw@host/db`` → :class:`~agentforge.stores.sql.SQLStore` on PostgreSQL;
* ``http(s)://host:port`` (a store server, or a gateway's store API) → :class:`~agentforge.stores.http.HTTPStore`.

A SQL store exports what it commits to an OpenTelemetry collector while ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set (:mod:`agentforge.stores.otlp`).

It is the one wiring point below the CLI that names concrete store backends (the import-layer contracts in
``pyproject.toml`` allow it and nothing else in the core). The store classes are imported on call, so
importing this module stays cheap::

    store = open_store("sqlite:///runs/traces.db")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from agentforge.config import default_store_url
from agentforge.errors import UserError

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = ["open_store", "is_process_local", "SQL_BACKENDS", "HTTP_SCHEMES"]

#: SQLAlchemy backends a :class:`~agentforge.stores.sql.SQLStore` runs on.
SQL_BACKENDS = ("sqlite", "postgresql")
#: URL prefixes that name a store server (:class:`~agentforge.stores.http.HTTPStore`).
HTTP_SCHEMES = ("http://", "https://")

_EXAMPLES = "sqlite:///path/traces.db, postgresql+psycopg://user:pw@host/db or http://host:port"


def open_store(
    url: str | None = None,
    *,
    api_key: str | None = None,
    admin_key: str | None = None,
    must_exist: bool = False,
) -> TraceStore:
    """The trace store at ``url``.

    Args:
        url: ``sqlite:///path`` (``sqlite://`` in memory), ``postgresql+psycopg://…`` or ``http(s)://…``;
            ``None``: ``$AGENTFORGE_STORE_URL`` or SQLite in ``$AGENTFORGE_HOME``
            (:func:`agentforge.config.default_store_url`).
        api_key: the store server's key (``http(s)://`` only; ignored otherwise).
        admin_key: the store server's admin key, for publishing and activating versions (``http(s)://``
            only); ``None``: ``$AGENTFORGE_ADMIN_KEY`` if set.
        must_exist: refuse a SQLite file that does not exist yet, so a mistyped path for a store that is
            only read does not create an empty one.

    Returns:
        An open store; close it with ``store.close()``.

    Raises:
        UserError: the URL cannot be parsed, names another database than SQLite or PostgreSQL, or (with
            ``must_exist``) names a SQLite file that does not exist.
        MissingExtraError: a PostgreSQL URL without ``psycopg`` installed, or an OTLP endpoint in the environment
            without the OpenTelemetry SDK and exporter (``agentforge[otel]``).
        ConfigError: the OpenTelemetry environment holds a value that is not valid.
        StoreError: the database cannot be opened.
    """
    url = url or default_store_url()
    if url.startswith(HTTP_SCHEMES):
        from agentforge.stores.http import HTTPStore

        return HTTPStore(url, api_key=api_key, admin_key=admin_key or os.environ.get("AGENTFORGE_ADMIN_KEY"))
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UserError(f"{url!r} is not a store URL; use {_EXAMPLES}") from None
    backend = parsed.get_backend_name()
    if backend not in SQL_BACKENDS:
        raise UserError(f"{url!r}: no trace store runs on {backend!r}; use {_EXAMPLES}")
    if must_exist and backend == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database).expanduser()
        if not path.is_file():
            raise UserError(f"no trace store at {path} (from {url!r}); check the path")
    from agentforge.stores.otlp import export_to_otlp
    from agentforge.stores.sql import SQLStore

    store = SQLStore(url)
    try:
        export_to_otlp(store)  # only while the OpenTelemetry environment names an OTLP endpoint
    except BaseException:
        store.close()
        raise
    return store


def is_process_local(url: str) -> bool:
    """Whether the store at ``url`` lives in this process only: an in-memory SQLite database (``sqlite://``).

    Other processes (``Runner(mode="process")`` workers) cannot open such a store; a SQLite file, PostgreSQL
    or a store server (``http(s)://``) they can.

    Args:
        url: a store URL (see :func:`open_store`).

    Returns:
        ``True`` for in-memory SQLite.

    Raises:
        sqlalchemy.exc.ArgumentError: ``url`` is not an ``http(s)://`` URL and cannot be parsed.
    """
    if url.startswith(HTTP_SCHEMES):
        return False
    from sqlalchemy.engine import make_url

    from agentforge.stores.engine import is_memory_url

    return is_memory_url(make_url(url))
