"""A throw-away PostgreSQL cluster of one test, so a test may restart it without touching anyone else's.

``private_postgres()`` runs ``initdb`` in a fresh directory under ``/tmp`` (as the ``postgres`` system user,
which PostgreSQL requires when the test runs as root), starts the server on a free loopback port with trust
authentication, and yields a :class:`PrivatePostgres` with its SQLAlchemy URL and a :meth:`~PrivatePostgres.
restart`. The cluster is stopped and deleted afterwards. It skips the test when the PostgreSQL server binaries
(``/usr/lib/postgresql/*/bin``) or the ``postgres`` user are missing (``scripts/start_postgres.sh`` installs
them).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["PrivatePostgres", "private_postgres"]


@dataclass
class PrivatePostgres:
    """A running private cluster: ``url`` (database ``postgres``, user ``agentforge``, no password)."""

    bin_dir: Path
    data_dir: Path
    port: int
    run_as: str | None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://agentforge@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        cmd = [str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-w", "-t", "60", *args]
        if self.run_as is not None:
            cmd = ["su", self.run_as, "-s", "/bin/sh", "-c", " ".join(f"'{c}'" for c in cmd)]
        subprocess.run(cmd, check=True, capture_output=True, timeout=90)

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data_dir}"
        self._ctl("-l", str(self.data_dir / "server.log"), "-o", options, "start")

    def restart(self, mode: str = "immediate") -> None:
        """Restart the server; ``immediate`` aborts every connection as a crash would (no clean shutdown)."""
        self._ctl("-m", mode, "stop")
        self.start()

    def stop(self) -> None:
        """Stop the server (fast shutdown)."""
        self._ctl("-m", "fast", "stop")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started private cluster (see the module docstring); stopped and removed on exit."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.skip("PostgreSQL server binaries not installed; run scripts/start_postgres.sh")
    bin_dir = Path(found[-1]).parent
    run_as: str | None = None
    root = Path(tempfile.mkdtemp(prefix="agentforge-pg-"))
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root without a 'postgres' user to run the server as")
        run_as = "postgres"
        os.chown(root, user.pw_uid, user.pw_gid)
    data = root / "data"
    initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", "agentforge", "--auth=trust", "-E", "UTF8"]
    if run_as is not None:
        initdb = ["su", run_as, "-s", "/bin/sh", "-c", " ".join(f"'{c}'" for c in initdb)]
    subprocess.run(initdb, check=True, capture_output=True, timeout=120)
    cluster = PrivatePostgres(bin_dir, data, _free_port(), run_as)
    cluster.start()
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            shutil.rmtree(root, ignore_errors=True)
