"""Gateway replicas behind HAProxy: the load balancer's config file, and HAProxy run as a child process.

Each replica keeps per-rollout state in its own memory (a conversation's token-in continuation, the rollout's
privacy placeholders, the probation of a swap), so every call of one rollout must reach the same replica.
The config hashes the first two path segments of ``/rollouts/<rollout_id>/v1/...`` (HAProxy ``balance uri
depth 2``) onto the replicas with consistent hashing (``hash-type consistent``): a rollout keeps its replica
while the set of live replicas stays the same, and when one replica goes, only its rollouts move (each to
one other replica; HAProxy's health check, ``GET /health`` every second, takes it out after two misses).
Calls without a rollout in the URL (``/v1/...``, the store API, the dashboard) go round robin. HAProxy
itself is Debian's ``haproxy`` package (2.6; ``apt-get install haproxy``); agentforge only writes its config.

Reference: HAProxy 2.6 configuration manual, sections 4.2 ``balance`` (``uri``, ``depth``) and ``hash-type``.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from agentforge.errors import UserError

__all__ = ["haproxy_config", "find_haproxy", "HAProxy"]

#: a replica's health check: every this many milliseconds; out after two misses, back after one answer
CHECK_INTER_MS = 1000


def haproxy_config(
    replicas: Sequence[str], port: int, host: str = "127.0.0.1", timeout_s: float = 600.0
) -> str:
    """The HAProxy config of one gateway address in front of ``replicas``.

    Args:
        replicas: the replicas' ``host:port`` addresses (at least one).
        port: the port the load balancer binds; ``host``: its address (loopback by default; each replica
            enforces its own key, HAProxy adds none).
        timeout_s: how long a client or a replica may stay silent inside one call (a long stream), seconds.

    Returns:
        The config file's text.

    Raises:
        UserError: no replica, or an address that is not ``host:port``.
    """
    if not replicas:
        raise UserError("haproxy_config: name at least one replica (host:port)")
    for address in replicas:
        name, _, number = address.rpartition(":")
        if not name or not number.isdigit():
            raise UserError(f"haproxy_config: replica {address!r} is not host:port")
    timeout = f"{int(timeout_s * 1000)}ms"
    servers = [
        f"    server r{i} {address} check inter {CHECK_INTER_MS} fall 2 rise 1"
        for i, address in enumerate(replicas)
    ]
    check = [
        "    option httpchk GET /health",
        "    http-check expect status 200",  # 503: the replica is up, its engine is not: out until it is
    ]
    return "\n".join(
        [
            "global",
            "    maxconn 8192",
            "defaults",
            "    mode http",
            "    timeout connect 5s",
            f"    timeout client {timeout}",
            f"    timeout server {timeout}",
            "    option http-keep-alive",
            # a call whose replica refuses the connection (dead, not yet out), or answers 503 (its engine
            # refused the connection: the gateway sent nothing), goes to another replica: the request was
            # never processed, so even a POST is safe to retry. HAProxy keeps a copy of each request for
            # this; one larger than its buffer (tune.bufsize) gets the 503 instead
            "    retries 2",
            "    retry-on conn-failure 503",
            "    option http-buffer-request",
            "    option redispatch 1",
            "frontend gateway",
            f"    bind {host}:{port}",
            "    use_backend by_rollout if { path_beg /rollouts/ }",
            "    default_backend any_replica",
            "backend by_rollout",
            "    balance uri depth 2",  # /rollouts/<rollout_id>
            "    hash-type consistent",
            *check,
            *servers,
            "backend any_replica",
            "    balance roundrobin",
            *check,
            *servers,
            "",
        ]
    )


def find_haproxy() -> str | None:
    """The ``haproxy`` executable on ``PATH`` (or ``/usr/sbin``), or ``None``."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


class HAProxy:
    """HAProxy in a child process with :func:`haproxy_config`, stopped by :meth:`stop` (or ``with``).

    Args:
        replicas: the replicas' ``host:port`` addresses.
        port: the port it binds on 127.0.0.1 (or ``host``).
        timeout_s: how long it may take to accept connections, seconds.

    Raises:
        UserError: HAProxy is not installed, refuses the config, or does not listen in time.
    """

    def __init__(
        self, replicas: Sequence[str], port: int, host: str = "127.0.0.1", timeout_s: float = 10.0
    ) -> None:
        binary = find_haproxy()
        if binary is None:
            raise UserError("HAProxy is not installed: apt-get install -y haproxy (Debian's package, 2.6+)")
        self.url = f"http://{host}:{port}"
        self._dir = tempfile.TemporaryDirectory(prefix="agentforge-haproxy-")
        self.config_path = Path(self._dir.name) / "haproxy.cfg"
        self.config_path.write_text(haproxy_config(replicas, port, host), encoding="utf-8")
        checked = subprocess.run(
            [binary, "-c", "-q", "-f", str(self.config_path)], capture_output=True, text=True
        )
        if checked.returncode != 0:
            self._dir.cleanup()
            raise UserError(f"HAProxy refused its config: {checked.stderr.strip() or checked.stdout.strip()}")
        # -db: one process in the foreground (a child to stop with SIGTERM, whose CPU time is its own); its
        # messages (a replica going DOWN or UP) go to a file: a pipe nobody reads would fill and stall it
        self.log_path = Path(self._dir.name) / "haproxy.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen([binary, "-db", "-f", str(self.config_path)], stderr=log)
        deadline = time.monotonic() + timeout_s
        # listening, and still running a moment later (not another process's port it failed to bind)
        while True:
            if _listening(host, port):
                time.sleep(0.2)
                if self.proc.poll() is None:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = self.log_path.read_text(errors="replace").strip()
                self.stop()
                raise UserError(f"HAProxy did not listen on {host}:{port} in {timeout_s:g} s: {err}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """Stop HAProxy (SIGTERM, then SIGKILL after 10 s) and remove its config."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._dir.cleanup()

    def __enter__(self) -> HAProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
