"""Fixtures for the trace store: one ``store`` fixture over every backend, and helpers to serve apps.

Backends (``store`` is parameterised over them, so every conformance test runs once per backend):

* ``sqlite``: a WAL SQLite file in ``tmp_path``;
* ``memory``: ``SQLStore("sqlite://")``;
* ``http``: ``HTTPStore`` against ``create_store_app`` served by uvicorn in a background thread on a free
  port, backed by a SQLite file, with a store key and an admin key (:data:`HTTP_KEYS`) and the adapter
  root :func:`adapter_root`;
* ``postgres``: ``SQLStore`` on a fresh database created for this test session from
  ``AGENTFORGE_TEST_PG_URL`` (tables emptied before each test); skipped when the variable is unset.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agentforge.stores.base import TraceStore

PG_ENV = "AGENTFORGE_TEST_PG_URL"
PG_SKIP_REASON = (
    f"PostgreSQL tests need {PG_ENV}; run: export {PG_ENV}=$(scripts/start_postgres.sh | tail -n 1)"
)


@contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a daemon thread on a free loopback port.

    Yields:
        The base URL, e.g. ``http://127.0.0.1:41234``.
    """
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start within 10 s")
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def lan_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, or ``None`` (no such interface)."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return None


def _drop_database(admin_url: str, name: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def pg_session_url() -> Iterator[str]:
    """URL of a PostgreSQL database created for this test session (dropped at the end)."""
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(PG_SKIP_REASON)
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from agentforge.stores.sql import SQLStore

    name = f"agentforge_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    engine = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except Exception as exc:  # no server, or no CREATEDB: say so instead of testing the wrong database
        pytest.fail(f"cannot create a test database on {make_url(base)!r}: {exc}")
    finally:
        engine.dispose()
    url = make_url(base).set(database=name).render_as_string(hide_password=False)
    SQLStore(url).close()  # create the tables once
    try:
        yield url
    finally:
        _drop_database(base, name)


def empty_pg_tables(url: str) -> None:
    """Delete every row of the store's tables (fast; keeps the schema)."""
    from sqlalchemy import create_engine
    from sqlmodel import SQLModel

    import agentforge.stores.tables  # noqa: F401  (registers the tables)

    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            names = ", ".join(t.name for t in SQLModel.metadata.sorted_tables if t.name.startswith("af_"))
            conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY")
    finally:
        engine.dispose()


@pytest.fixture
def pg_url(request: pytest.FixtureRequest) -> str:
    """A PostgreSQL URL whose store tables are empty (skips without ``AGENTFORGE_TEST_PG_URL``)."""
    url = request.getfixturevalue("pg_session_url")
    empty_pg_tables(url)
    return url


BACKENDS = ["sqlite", "memory", "http", pytest.param("postgres", marks=pytest.mark.postgres)]
#: The keys of the ``http`` backend's server and client (16+ characters, as servers require).
HTTP_KEYS = {"api_key": "conformance-store-key", "admin_key": "conformance-admin-key"}


def adapter_root(tmp_path: Path) -> Path:
    """The adapter root of a test's ``http`` store server: ``tmp_path / "adapters"`` (created)."""
    root = tmp_path / "adapters"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TraceStore]:
    """A fresh, empty ``TraceStore`` of each backend."""
    from agentforge.stores.http import HTTPStore
    from agentforge.stores.server import create_store_app
    from agentforge.stores.sql import SQLStore

    backend = request.param
    if backend == "sqlite":
        with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as s:
            yield s
    elif backend == "memory":
        with SQLStore("sqlite://") as s:
            yield s
    elif backend == "http":
        with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as backing:
            app = create_store_app(backing, **HTTP_KEYS, adapter_root=adapter_root(tmp_path))
            with serve_app(app) as url, HTTPStore(url, **HTTP_KEYS) as s:
                yield s
    else:
        if not os.environ.get(PG_ENV):
            pytest.skip(PG_SKIP_REASON)
        with SQLStore(request.getfixturevalue("pg_url")) as s:
            yield s
