"""The dashboard's pages over a real SQLite store (no browser): what each page shows, bad input, and access.

The browser tests over a store a real training run filled are in ``tests/e2e/test_dashboard_browser.py``.
"""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi.testclient import TestClient

from agentforge.dashboard.app import MOUNT_PATH, create_dashboard_app
from agentforge.errors import UserError
from agentforge.gate import Decision, record_decision
from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter
from agentforge.stores.sql import SQLStore
from agentforge.types import LLMCall, ResourceVersion, Reward, Rollout, Span, SpanKind

KEY = "k" * 24


@pytest.fixture
def filled(tmp_path):
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        ro = store.enqueue_rollout(Rollout(agent="triage", metadata={"trainer_run": "run-1", "step": 0}))
        first = LLMCall(
            model="policy",
            version="policy@v1",
            request={"messages": [{"role": "user", "content": "hello"}]},
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            logprobs=[-0.1, -2.3],
            response_text="hi",
            latency_s=0.25,
        )
        # the follow-up prompt extends prompt+completion with two tool-result tokens (mask 0), then samples 3
        second = first.model_copy(
            update={
                "prompt_token_ids": [1, 2, 3, 4, 5, 6, 7],
                "completion_token_ids": [8, 9, 10],
                "logprobs": [-0.5, -0.01, -1.0],
                "response_text": "done",
            }
        )
        store.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.llm, llm=first, started_at=10.0))
        store.add_span(
            Span(rollout_id=ro.rollout_id, kind=SpanKind.tool, name="lookup", started_at=10.3, ended_at=10.4)
        )
        store.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.llm, llm=second, started_at=10.5))
        store.add_reward(
            Reward(rollout_id=ro.rollout_id, value=0.75, final=True, metadata={"parts": {"tool": 1.0}})
        )
        for step in (1, 2, 3):
            attrs = {
                "run_id": "run-1",
                "step": step,
                "reward": 0.1 * step,
                "train/step_s": 2.0 + step,
                "version": f"policy@v{step - 1}",
                "eval/held_out": 0.5 if step == 3 else None,
            }
            store.add_span(Span(kind=SpanKind.custom, name="trainer.metrics", attributes=attrs))
        for step in (1, 2):
            store.publish_resource(
                ResourceVersion(name="policy", kind="adapter", payload={"path": f"/a/{step}", "step": step})
            )
        record_decision(
            store,
            Decision(
                name="policy",
                stage="eval",
                outcome="refused",
                candidate="policy@v2",
                live="policy@v1",
                reason="no gain",
            ),
        )
        store.activate_resource("policy", 1)
        store.publish_resource(
            ResourceVersion(name="prompt:triage", kind="prompt", payload={"template": "Be brief.\nAnswer."})
        )
        store.publish_resource(
            ResourceVersion(name="prompt:triage", kind="prompt", payload={"template": "Be kind.\nAnswer."})
        )
        yield store, ro.rollout_id


def test_pages_show_runs_rollouts_one_rollout_and_versions(filled) -> None:
    store, rollout_id = filled
    client = TestClient(create_dashboard_app(store, tokenizer=False))
    runs = client.get("/runs")
    assert runs.status_code == 200 and "run-1" in runs.text and "/static/chart.umd.js" in runs.text
    data = client.get("/runs.json").json()
    assert [s["reward"] for s in data["runs"][0]["steps"]] == pytest.approx([0.1, 0.2, 0.3])
    assert [s["held_out"] for s in data["runs"][0]["steps"]] == [None, None, 0.5]
    assert [e["event"] for e in data["timeline"]] == ["published", "published", "refused"]

    table = client.get("/rollouts", params={"agent": "triage", "min_reward": "0.5"})
    assert table.status_code == 200 and rollout_id in table.text
    assert rollout_id not in client.get("/rollouts", params={"max_reward": "0.5"}).text

    page = client.get(f"/rollouts/{rollout_id}").text
    assert page.count('class="span-row') == 3 and "lookup" in page and "hello" in page
    # one trajectory: 2 + 3 sampled tokens trainable, the 2 tool-result tokens not
    assert re.findall(r'data-count="(\d+)"', page) == ["5"] and page.count("tok trained") == 5
    assert page.count("tok env") == 2 and "logprob -2.300" in page

    versions = client.get("/versions", params={"diff": "prompt:triage", "a": 1, "b": 2}).text
    assert re.search(r'class="version live" data-ref="policy@v1"', versions)
    assert "-Be brief." in versions and "+Be kind." in versions
    assert "eval refused" in versions and "run-1" in versions  # the gate's record, the run that served v1


def test_bad_input_and_unknown_ids_get_clear_answers(filled) -> None:
    store, _ = filled
    client = TestClient(create_dashboard_app(store, tokenizer=False))
    missing = client.get("/rollouts/ro-nope")
    assert missing.status_code == 404 and "ro-nope" in missing.text
    bad = client.get("/rollouts", params={"min_reward": "high"})
    assert bad.status_code == 400 and "bad filter" in bad.text
    assert client.get("/rollouts", params={"min_reward": "2", "max_reward": "1"}).status_code == 400
    with pytest.raises(UserError, match="tokenizer.json"):
        create_dashboard_app(store, tokenizer="/nonexistent")


def test_keyset_pages_walk_every_rollout(tmp_path) -> None:
    with SQLStore(f"sqlite:///{tmp_path / 'many.db'}") as store:
        ids = [store.enqueue_rollout(Rollout(agent="a")).rollout_id for _ in range(7)]
        client = TestClient(create_dashboard_app(store, tokenizer=False))
        seen, url = [], "/rollouts?limit=3"
        while url:
            text = client.get(url).text
            seen += re.findall(r'<a href="/rollouts/(ro-[0-9a-f]+)">', text)
            older = re.search(r'id="older" href="([^"]+)"', text)
            url = older[1].replace("&amp;", "&") if older else ""
        assert seen == ids[::-1]


def test_with_a_key_requests_present_it_or_log_in(filled) -> None:
    store, _ = filled
    client = TestClient(create_dashboard_app(store, KEY, tokenizer=False), follow_redirects=False)
    assert client.get("/runs").headers["location"] == "/login"
    assert client.get("/runs.json", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert client.post("/login", data={"key": "wrong" * 5}).text.count("not the store API key") == 1
    login = client.post("/login", data={"key": KEY})
    assert login.status_code == 303 and "httponly" in login.headers["set-cookie"].lower()
    assert (
        KEY not in login.headers["set-cookie"]
    )  # the cookie opens the dashboard; it is not the store API key
    assert client.get("/runs").status_code == 200  # the cookie now
    other = TestClient(create_dashboard_app(store, KEY, tokenizer=False), follow_redirects=False)
    other.cookies.set("agentforge_dashboard_key", KEY)  # the raw key as a cookie is no session
    assert other.get("/runs").status_code == 303
    with pytest.raises(UserError):
        create_dashboard_app(store, "short")


def _collect(sent: list[dict]):
    async def send(message: dict) -> None:
        sent.append(message)

    return send


async def test_without_a_key_only_loopback_is_served(filled) -> None:
    store, _ = filled
    app = create_dashboard_app(store, tokenizer=False)
    for server, status in ((("10.1.2.3", 8050), 403), (("127.0.0.1", 8050), 200)):
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "path": "/runs.json",
            "raw_path": b"/runs.json",
            "query_string": b"",
            "headers": [],
            "server": server,
            "client": ("10.9.9.9", 5555),
            "scheme": "http",
            "root_path": "",
        }
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        await app(scope, receive, _collect(sent))
        assert sent[0]["status"] == status


async def test_mounted_on_the_gateway_behind_its_key(filled) -> None:
    store, _ = filled
    dash = create_dashboard_app(store, KEY, tokenizer=False)
    gateway = create_gateway(store, ModelRouter(), KEY, mounts={MOUNT_PATH: dash})
    transport = httpx.ASGITransport(app=gateway)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        assert (await client.get("/v1/models")).status_code == 401  # the gateway's own check still holds
        to_login = await client.get("/dashboard/runs")
        assert to_login.status_code == 303 and to_login.headers["location"] == "/dashboard/login"
        keyed = await client.get("/dashboard/runs", headers={"X-Api-Key": KEY})
        assert keyed.status_code == 200 and 'src="/dashboard/static/chart.umd.js"' in keyed.text
        assert (
            await client.get("/dashboard/static/chart.umd.js", headers={"X-Api-Key": KEY})
        ).status_code == 200


def test_a_span_with_token_ids_outside_the_vocabulary_is_shown_not_a_500(tmp_path) -> None:
    """Issue 36 (low): one span whose ids the tokenizer cannot decode (here -1 and 2**40: the tokenizers
    library raises OverflowError) made its rollout page a 500. The ids show as what they are."""
    from agentforge.model import default_model_dir, is_prepared

    if not is_prepared():
        pytest.skip("the default model's tokenizer is not prepared (make setup)")
    with SQLStore(f"sqlite:///{tmp_path / 'traces.db'}") as store:
        ro = store.enqueue_rollout(Rollout(agent="triage"))
        call = LLMCall(
            model="policy",
            request={"messages": [{"role": "user", "content": "hi"}]},
            prompt_token_ids=[1, -1, 3],
            completion_token_ids=[2**40, 5],
            logprobs=[-0.1, -0.2],
            response_text="x",
        )
        store.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.llm, llm=call))
        client = TestClient(create_dashboard_app(store, tokenizer=default_model_dir()))
        page = client.get(f"/rollouts/{ro.rollout_id}")
        assert page.status_code == 200, page.text[:500]
        assert "⟨-1: not in the vocabulary⟩" in page.text and f"⟨{2**40}: not in the vocabulary⟩" in page.text
