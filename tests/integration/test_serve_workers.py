"""``agentforge serve --workers 2`` (issue 39): two whole ``serve`` replicas (each with its own embedded
engine) on one store behind HAProxy. ``--adapter`` is published once and served by both from their first
call; a version activated later is staged by both replicas before either serves it, and every answer is served
by the version its span records; a replica killed with SIGKILL comes back; SIGTERM stops HAProxy and both
replicas (exit status 0).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from adapters import LETTER_MESSAGES, letter_adapter
from prerequisites import need_haproxy
from processes import cmdline

from agentforge.loopback import free_port
from agentforge.serving.barrier import barrier_resource
from agentforge.stores.sql import SQLStore
from agentforge.trainers.publish import StorePublisher
from agentforge.types import Rollout, SpanKind, Task

pytestmark = pytest.mark.slow


def _ask(url: str, rollout_id: str) -> str | None:
    """The answer of one call of ``rollout_id`` through HAProxy, ``None`` if it failed."""
    body = {"model": "policy", "messages": LETTER_MESSAGES, "max_tokens": 4, "temperature": 0}
    try:
        r = httpx.post(f"{url}/rollouts/{rollout_id}/v1/chat/completions", json=body, timeout=60)
    except httpx.HTTPError:
        return None
    return r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None


def test_two_replicas_stage_a_new_version_before_either_serves_it_and_stop_on_sigterm(tmp_path: Path) -> None:
    need_haproxy()
    first, second = letter_adapter("A"), letter_adapter("B")  # built before the replicas take the cores
    url_db = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(url_db)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "agentforge.cli",
        "serve",
        "--workers",
        "2",
        "--backend",
        "embedded",
        "--port",
    ]
    proc = subprocess.Popen(
        [
            *cmd,
            str(port),
            "--store-url",
            url_db,
            "--max-model-len",
            "1024",
            "--no-dashboard",
            "--adapter",
            first,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while f"http://127.0.0.1:{port}\n" not in lines:
            assert proc.poll() is None, (proc.returncode, (proc.stderr.read() if proc.stderr else "")[-3000:])
            assert time.monotonic() < deadline, "the replica set did not print its URL"
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port}"
        ids = [
            store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="t")).rollout_id for i in range(6)
        ]
        # --adapter: published once by the parent, served by both replicas from their first call
        assert [_ask(url, rid) for rid in ids] == ["A"] * len(ids)
        assert [r.ref for r in store.list_resources("policy")] == ["policy@v1"]

        StorePublisher(store).publish(second, step=1)  # what a trainer anywhere does
        deadline = time.monotonic() + 120
        while not all(_ask(url, rid) == "B" for rid in ids):  # each replica follows within its poll
            assert time.monotonic() < deadline, "the replicas never served policy@v2"
            time.sleep(0.5)

        records = [r for r in store.list_resources(barrier_resource("policy")) if r.payload["version"] == 2]
        assert sorted(r.payload["replica"] for r in records) == ["r0", "r1"]  # both staged it
        both_staged = max(r.created_at for r in records)
        spans = [s for rid in ids for s in store.list_spans(rollout_id=rid, kind=SpanKind.llm)]
        assert spans and all(s.status == "ok" for s in spans)
        for span in spans:  # every answer from the version its span records; none from v2 before both staged
            assert span.llm.response_text == {"policy@v1": "A", "policy@v2": "B"}[span.llm.version], span.llm
            if span.llm.version == "policy@v2":
                assert span.started_at >= both_staged

        # kill -9 of replica r0: its rollouts move to r1 (HAProxy's health check), then r0 is started again,
        # serves the store's version from its first call, and takes its rollouts back
        (r0,) = [c for c in psutil.Process(proc.pid).children() if "r0" in cmdline(c)]
        r0.kill()
        deadline = time.monotonic() + 180
        answers: list[str | None] = []
        while True:
            answers += [_ask(url, rid) for rid in ids]
            alive = [c for c in psutil.Process(proc.pid).children() if "r0" in cmdline(c)]
            if alive and alive[0].pid != r0.pid and answers[-len(ids) :] == ["B"] * len(ids):
                break
            assert time.monotonic() < deadline, answers[-len(ids) :]
            time.sleep(0.5)
        assert set(answers) <= {"B", None}  # only calls caught by the kill fail, none from another version
        assert store.get_resource("policy").ref == "policy@v2"

        replicas = psutil.Process(proc.pid).children()
        assert len(replicas) == 3  # r0, r1 and HAProxy
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        stderr = proc.stderr.read() if proc.stderr else ""
        assert "replica r0 exited (code -9); started again" in stderr
        assert "stopped (SIGTERM): HAProxy, 2 replicas" in stderr
        assert not [c for c in replicas if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        store.close()
