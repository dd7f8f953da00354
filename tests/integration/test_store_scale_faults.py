"""Scale-out under faults (issue 16, must-show): 4 runner processes against the HTTP store backed by
PostgreSQL, with a store key. Mid-run the store server is killed with SIGKILL and restarted, and PostgreSQL is
restarted once (immediate shutdown, as a crash). The runners' ``HTTPStore`` retries with backoff (tenacity),
heartbeats resume, every rollout ends exactly once, and every span and reward a store acknowledged is there.

Real components: a private PostgreSQL cluster (:mod:`private_postgres`), ``create_store_app`` under uvicorn in
its own process, four ``Runner`` processes with the agent of :mod:`fault_agents`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from private_postgres import private_postgres

from agentforge.stores.sql import SQLStore
from agentforge.types import AttemptState, Rollout, RolloutState, SpanKind, Task

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

KEY = "scale-out-store-key-0123"
RUNNERS = 4
ROLLOUTS = 60
SUPPORT = Path(__file__).resolve().parents[1] / "support"

SERVER = textwrap.dedent("""
    import sys, uvicorn
    from agentforge.stores.server import create_store_app
    from agentforge.stores.sql import SQLStore
    app = create_store_app(SQLStore(sys.argv[1]), api_key=sys.argv[2])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[3]), log_level="warning")
""")

RUNNER = textwrap.dedent("""
    import os, sys, time
    from agentforge.runtime import Runner
    from agentforge.stores.http import HTTPStore
    from fault_agents import logging_agent
    store = HTTPStore(sys.argv[1], api_key=sys.argv[2], retries=10_000, retry_for_s=120, backoff_s=0.05,
                      max_backoff_s=1.0, timeout_s=10)
    runner = Runner(store, logging_agent, "http://127.0.0.1:9", workers=1, heartbeat_s=0.5,
                    heartbeat_timeout_s=15, poll_s=0.1)
    runner.start()
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.1)
    runner.stop()
    store.close()
""")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(pg_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, pg_url, KEY, str(port)],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/store/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"store server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    raise RuntimeError("store server did not start within 60 s")


def _wait_for(store: SQLStore, done: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        finished = len(store.list_rollouts(state=RolloutState.succeeded))
        if finished >= done or time.monotonic() > deadline:
            return finished
        time.sleep(0.2)


def test_runners_ride_out_a_killed_store_server_and_a_restarted_database(tmp_path: Path) -> None:
    ack_log, stop_file, server_log = tmp_path / "acks.log", tmp_path / "stop", tmp_path / "server.log"
    with private_postgres() as pg:
        check = SQLStore(pg.url)  # also creates the tables before anything else connects
        ids = [
            check.enqueue_rollout(Rollout(task=Task(task_id=f"t{i}", input={"pause_s": 0.15}))).rollout_id
            for i in range(ROLLOUTS)
        ]
        port = _free_port()
        server = _start_server(pg.url, port, server_log)
        env = {**os.environ, "AGENTFORGE_ACK_LOG": str(ack_log), "PYTHONPATH": str(SUPPORT)}
        url = f"http://127.0.0.1:{port}"
        runners = [
            subprocess.Popen(
                [sys.executable, "-c", RUNNER, url, KEY, str(stop_file)],
                env=env,
                stdout=(tmp_path / f"runner{n}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            for n in range(RUNNERS)
        ]
        try:
            assert _wait_for(check, 8, 120) >= 8, "the runners did not get going"
            server.send_signal(signal.SIGKILL)  # the store server dies mid-run, requests in flight
            server.wait(10)
            killed_at = time.time()
            time.sleep(2.0)
            server = _start_server(pg.url, port, server_log)
            before_pg = _wait_for(check, ROLLOUTS // 2, 120)
            pg.restart("immediate")  # the database crashes and comes back; every pooled connection is dead
            check.close()
            check = SQLStore(pg.url)
            finished = _wait_for(check, ROLLOUTS, 240)
        finally:
            stop_file.touch()
            for proc in runners:
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
            server.send_signal(signal.SIGTERM)
            server.wait(20)
        logs = "\n".join((tmp_path / f"runner{n}.log").read_text()[-1500:] for n in range(RUNNERS))
        assert finished == ROLLOUTS, (
            f"{finished}/{ROLLOUTS} succeeded (before PG restart: {before_pg})\n{logs}"
        )
        assert [p.returncode for p in runners] == [0] * RUNNERS, logs

        # every rollout ended exactly once: one succeeded attempt, nothing left running or queued
        attempts = {rid: check.list_attempts(rid) for rid in ids}
        states = Counter(a.state for atts in attempts.values() for a in atts)
        assert all([a.state for a in atts].count(AttemptState.succeeded) == 1 for atts in attempts.values())
        assert states[AttemptState.running] == 0
        assert {r.state for r in check.list_rollouts()} == {RolloutState.succeeded}
        # heartbeats resumed after the kill: attempts that started before it beat again after it
        assert any(a.started_at < killed_at < a.heartbeat_at for atts in attempts.values() for a in atts)

        # nothing acknowledged was lost, nothing stored twice
        acks = [line.split() for line in ack_log.read_text().splitlines()]
        acked_spans = {i for kind, i in acks if kind == "span"}
        acked_rewards = {i for kind, i in acks if kind == "reward"}
        spans = check.list_spans(kind=SpanKind.custom)
        rewards = [r for rid in ids for r in check.list_rewards(rid)]
        assert acked_spans <= {s.span_id for s in spans} and acked_rewards <= {r.reward_id for r in rewards}
        assert len({s.span_id for s in spans}) == len(spans) and len({r.reward_id for r in rewards}) == len(
            rewards
        )
        for rid in ids:  # the training view: the succeeded attempt's 3 spans and its final reward
            assert [s.name for s in check.list_spans(rollout_id=rid, valid_only=True)] == [
                "step-0",
                "step-1",
                "step-2",
            ]
            final = check.final_reward(rid)
            assert final is not None and final.value == 1.0
        print(
            f"\nscale-out under faults: {ROLLOUTS} rollouts, {RUNNERS} runner processes; attempts {dict(states)}; "
            f"spans acknowledged {len(acked_spans)}, stored {len(spans)}, lost {len(acked_spans - {s.span_id for s in spans})}; "
            f"rewards acknowledged {len(acked_rewards)}, stored {len(rewards)}, "
            f"lost {len(acked_rewards - {r.reward_id for r in rewards})}"
        )
        check.close()
