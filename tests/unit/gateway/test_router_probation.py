"""The router's probation: a version's answers wait for its verdict; a failed one hands its calls back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agentforge.gateway.probation import VersionRefused
from agentforge.gateway.router import ModelRouter, Upstream


class Answer:
    """An engine answer that records whether it was closed unread."""

    closed = False

    async def aclose(self) -> None:
        self.closed = True


def router() -> ModelRouter:
    r = ModelRouter()
    for v in ("policy@v1", "policy@v2"):
        r.register(v, Upstream("http://127.0.0.1:1/v1", v))
    r.set_alias("policy", "policy@v1")
    return r


async def test_held_answers_go_out_when_the_version_passes() -> None:
    r = router()
    probation = r.start_probation("policy@v2", "policy@v1")
    r.set_alias("policy", "policy@v2")
    answers = [Answer(), Answer()]
    held = [asyncio.ensure_future(probation.hold(a)) for a in answers]
    await asyncio.sleep(0)
    assert await asyncio.to_thread(probation.wait_held, 2, 10)  # both wait for the verdict
    assert not any(task.done() for task in held)
    await asyncio.to_thread(r.end_probation, "policy@v2", True)  # given from another thread, as serving does
    await asyncio.gather(*held)
    assert probation.held == 2 and probation.waiting == 0 and not any(a.closed for a in answers)
    assert r.probation("policy@v2") is None and r.alias("policy") == "policy@v2"
    await probation.hold(Answer())  # decided: no wait


async def test_a_failed_version_points_the_alias_back_and_refuses_held_and_later_answers() -> None:
    r = router()
    probation = r.start_probation("policy@v2", "policy@v1")
    r.set_alias("policy", "policy@v2")
    held_answer = Answer()
    held = asyncio.ensure_future(probation.hold(held_answer))
    assert await asyncio.to_thread(probation.wait_held, 1, 10)
    r.end_probation("policy@v2", False)
    assert r.alias("policy") == "policy@v1"  # new calls go to the old version at once
    with pytest.raises(VersionRefused) as refused:
        await held
    assert refused.value.fallback == "policy@v1" and held_answer.closed
    late = Answer()  # an answer of a call sent before the verdict that arrives after it
    assert r.probation("policy@v2") is probation
    with pytest.raises(VersionRefused):
        await probation.hold(late)
    assert late.closed
    r.drain("policy@v2", timeout_s=1)
    assert r.probation("policy@v2") is None  # drained: the probation ends with it


async def test_a_client_that_leaves_while_held_closes_its_answer() -> None:
    r = router()
    probation = r.start_probation("policy@v2", "policy@v1")
    answer = Answer()
    held = asyncio.ensure_future(probation.hold(answer))
    assert await asyncio.to_thread(probation.wait_held, 1, 10)
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    assert answer.closed and probation.waiting == 0


def test_wait_alias_returns_when_the_alias_moves() -> None:
    r = router()
    assert r.wait_alias("policy", "policy@v2", timeout_s=0) == "policy@v1"  # already elsewhere
    assert r.wait_alias("policy", "policy@v1", timeout_s=0.01) is None
    mover = threading.Timer(0.05, r.set_alias, ("policy", "policy@v2"))
    mover.start()
    assert r.wait_alias("policy", "policy@v1", timeout_s=10) == "policy@v2"
    mover.join()


def test_wait_for_call_returns_when_a_call_of_the_version_starts() -> None:
    r = router()
    assert not r.wait_for_call("policy@v2", timeout_s=0.01)  # nobody calls it
    caller = threading.Timer(0.05, r.acquire, ("policy@v2",))
    caller.start()
    assert r.wait_for_call("policy@v2", timeout_s=10)
    caller.join()
    assert r.wait_for_call("policy@v2", timeout_s=0)  # in flight already: at once
    r.release("policy@v2")
    assert not r.wait_for_call("policy@v2", timeout_s=0) and not r._awaited  # noqa: SLF001 - nothing left waiting
