"""Gateway replicas behind HAProxy (issue 39, first step): a rollout's calls all reach one replica, and a
replica killed with SIGKILL loses no acknowledged span while its rollouts move to the replica left.

Two gateway processes on one PostgreSQL store, each in front of its own
scripted engine, so an answer names the replica that served it (``from-r0`` / ``from-r1``); Debian's HAProxy
in front of both with :func:`agentforge.scale.haproxy_config`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prerequisites import need_haproxy

from agentforge.errors import UserError
from agentforge.loopback import free_port
from agentforge.open import open_store
from agentforge.scale import HAProxy, haproxy_config
from agentforge.testing import ScriptedTurn, ScriptedUpstream
from agentforge.types import Rollout, Task

ROOT = Path(__file__).resolve().parents[2]

#: one replica: a gateway process on the store ``argv[2]`` in front of the engine ``argv[3]``, port ``argv[1]``
REPLICA = """
import sys, threading
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import GatewayServer
from agentforge.open import open_store
router = ModelRouter()
router.register("policy@v1", Upstream(base_url=sys.argv[3], model="base"))
router.set_alias("policy", "policy@v1")
GatewayServer(open_store(sys.argv[2]), router, port=int(sys.argv[1])).start()
threading.Event().wait()
"""


def _replica(store_url: str, engine_url: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", REPLICA, str(port), store_url, engine_url], cwd=ROOT)
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, f"replica exited with {proc.returncode}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "the replica did not start"
        time.sleep(0.1)


@pytest.fixture
def store_url(pg_url: str) -> str:
    """The replicas' one store: PostgreSQL, as a deployment runs them (SQLite under several replicas is
    covered by the ``--workers`` benchmark's test, tests/unit/cli/test_benchmarks.py)."""
    return pg_url


@pytest.fixture
def two_replicas(
    store_url: str,
) -> Iterator[tuple[HAProxy, list[subprocess.Popen[bytes]], str, list[ScriptedUpstream]]]:
    need_haproxy()
    engines = [ScriptedUpstream([ScriptedTurn(f"from-r{i}")], cycle=True).serve() for i in range(2)]
    replicas: list[subprocess.Popen[bytes]] = []
    try:
        ports = []
        for engine in engines:
            proc, port = _replica(store_url, f"{engine.url}/v1")
            replicas.append(proc)
            ports.append(port)
        with HAProxy([f"127.0.0.1:{p}" for p in ports], free_port()) as balancer:
            yield balancer, replicas, store_url, engines
    finally:
        for proc in replicas:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(20)
        for engine in engines:
            engine.stop()


def _ask(url: str, rollout_id: str, turn: int) -> str | None:
    """One chat call of ``rollout_id`` through the balancer: the replica's name, or ``None`` if it failed."""
    body = {"model": "policy", "messages": [{"role": "user", "content": f"turn {turn}"}], "max_tokens": 8}
    try:
        r = httpx.post(f"{url}/rollouts/{rollout_id}/v1/chat/completions", json=body, timeout=30)
    except httpx.HTTPError:
        return None
    return r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None


def test_the_config_hashes_the_rollout_segment_consistently_and_refuses_bad_addresses() -> None:
    text = haproxy_config(["127.0.0.1:9001", "127.0.0.1:9002"], 9000)
    backend = text.split("backend by_rollout\n", 1)[1].split("backend any_replica", 1)[0]
    assert "balance uri depth 2" in backend and "hash-type consistent" in backend
    assert backend.count("server r") == 2 and "check inter" in backend
    assert "bind 127.0.0.1:9000" in text and "use_backend by_rollout if { path_beg /rollouts/ }" in text
    with pytest.raises(UserError, match="host:port"):
        haproxy_config(["127.0.0.1"], 9000)
    with pytest.raises(UserError, match="at least one"):
        haproxy_config([], 9000)


@pytest.mark.slow
@pytest.mark.postgres
def test_each_rollout_stays_on_one_replica_and_a_killed_replica_loses_no_acknowledged_span(
    two_replicas,
) -> None:  # type: ignore[no-untyped-def]
    balancer, replicas, store_url, _ = two_replicas
    store = open_store(store_url)
    try:
        rollouts = [store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="t")) for i in range(16)]
        ids = [r.rollout_id for r in rollouts]
        served: dict[str, list[str | None]] = {
            rid: [_ask(balancer.url, rid, t) for t in range(4)] for rid in ids
        }
        # every call answered, each rollout's four on one replica, and the rollouts spread over both
        assert all(None not in names and len(set(names)) == 1 for names in served.values()), served
        home = {rid: names[0] for rid, names in served.items()}
        assert set(home.values()) == {"from-r0", "from-r1"}, home

        replicas[0].send_signal(signal.SIGKILL)
        replicas[0].wait(10)
        answered: Counter[str] = Counter(
            {rid: sum(n is not None for n in names) for rid, names in served.items()}
        )
        after: dict[str, list[str | None]] = {rid: [] for rid in ids}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until HAProxy's health check moved r0's rollouts to r1
            for rid in ids:
                name = _ask(balancer.url, rid, 9)
                after[rid].append(name)
                answered[rid] += name is not None
            if all(names[-1] == "from-r1" for names in after.values()):
                break
        assert all(names[-1] == "from-r1" for names in after.values()), after
        # r1's rollouts never failed; r0's failed only until the balancer took r0 out
        assert all(None not in after[rid] for rid in ids if home[rid] == "from-r1"), after
        for rid in ids:  # every acknowledged call left its span in the one store
            spans = [s for s in store.list_spans(rollout_id=rid) if s.llm is not None and s.status == "ok"]
            assert len(spans) >= answered[rid], (rid, len(spans), answered[rid])
    finally:
        store.close()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_replica_whose_engine_refuses_connections_hands_its_calls_to_the_other(
    two_replicas,
) -> None:  # type: ignore[no-untyped-def]
    """r0's engine is gone but r0 itself is up (its health check still passes): r0 answers 503
    ``engine_unavailable`` (nothing was sent) and HAProxy sends the call again to r1, so no call fails.
    Before, r0 answered 502 and HAProxy passed it on: every call of r0's rollouts failed until r0 left."""
    balancer, _, store_url, engines = two_replicas
    store = open_store(store_url)
    try:
        ids = [
            store.enqueue_rollout(Rollout(task=Task(input={"i": i}), agent="t")).rollout_id for i in range(16)
        ]
        home = {rid: _ask(balancer.url, rid, 0) for rid in ids}
        assert set(home.values()) == {"from-r0", "from-r1"}, home
        engines[0].stop()
        time.sleep(1.0)  # the replica's keep-alive connections to it see the close
        after = {rid: [_ask(balancer.url, rid, t) for t in range(1, 4)] for rid in ids}
        assert all(names == ["from-r1"] * 3 for names in after.values()), after
        refused = [
            s
            for rid in ids
            if home[rid] == "from-r0"
            for s in store.list_spans(rollout_id=rid)
            if s.llm is not None and s.status == "error"
        ]
        assert refused and all("not accepting connections" in (s.error or "") for s in refused)
    finally:
        store.close()


def test_the_deploy_guides_config_file_is_what_the_function_writes_and_haproxy_accepts_it(
    tmp_path: Path,
) -> None:
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    block = text.split("<!-- haproxy.cfg -->\n```\n", 1)[1].split("```", 1)[0]
    assert block == haproxy_config(["10.0.0.11:8000", "10.0.0.12:8000"], 8000, host="0.0.0.0")
    binary = need_haproxy()  # and HAProxy accepts it
    (tmp_path / "haproxy.cfg").write_text(block, encoding="utf-8")
    checked = subprocess.run(
        [binary, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr


def test_haproxy_that_cannot_bind_its_port_is_a_clear_error() -> None:
    import socket

    need_haproxy()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match="did not listen|cannot bind|Address already in use"):
            HAProxy(["127.0.0.1:9"], port, timeout_s=3)
