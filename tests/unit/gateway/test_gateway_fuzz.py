"""Property-based fuzzing of the gateway's HTTP surface with Hypothesis (issue 16, must-show).

Whatever a client sends — JSON of any shape, bodies that are not JSON, any path and method, streamed or
not — the gateway answers with an OpenAI-style error body or a well-formed answer, never a bare 500 page
and never a crash, and every JSON-object request to an LLM route is recorded as exactly one span.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fuzzing import FUZZ, json_values
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.gateway.app import create_gateway
from agentforge.privacy import PrivacyConfig
from agentforge.testing import ScriptedUpstream, memory_store

_SETTINGS = settings(FUZZ, max_examples=150)

_json = json_values(max_leaves=20, max_text=40)
#: The personal values of the fuzz bodies (as mask mode must never store them) and what carries them.
_PII_VALUES = ("jane.doe@example.com", "4111 1111 1111 1111", "hunter2hunter2")
_pii = st.sampled_from(
    ["jane.doe@example.com", "4111 1111 1111 1111", "password=hunter2hunter2", "<EMAIL_1>", "x"]
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", "", "🤖"])},
    optional={
        "content": st.one_of(st.text(max_size=60), _json, _pii),
        "tool_calls": _json,
        "name": st.one_of(_json, _pii),
    },
)
_body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.one_of(st.sampled_from(["policy", "policy@v1", "policy@v9", "nope", ""]), _json),
        "messages": st.one_of(st.lists(_message, max_size=3), _json),
        "prompt": st.one_of(st.text(max_size=60), st.lists(st.integers(0, 50_000), max_size=5), _json),
        "stream": st.one_of(st.booleans(), _json),
        "stream_options": st.one_of(st.fixed_dictionaries({}, optional={"include_usage": _json}), _json),
        "max_tokens": st.one_of(st.integers(-5, 100), _json),
        "temperature": _json,
        "logprobs": _json,
        "n": _json,
        "tools": _json,
        "tool_choice": _json,
        "extra_body": _json,
        "metadata": st.one_of(st.fixed_dictionaries({"note": _pii}), _json),
        "not_a_field": _pii,
    },
)
_routes = st.sampled_from(["/v1/chat/completions", "/v1/completions", "/rollouts/ro-x/v1/chat/completions"])


@pytest.fixture(scope="module", params=["off", "mask"])
def gateway(request: pytest.FixtureRequest):
    """One gateway for every example (a fresh one each would spend the time building stores); privacy off,
    and in mask mode (``serve``'s default: every free-text field walked, answers restored)."""
    store = memory_store()
    upstream = ScriptedUpstream(["fine <EMAIL_1>", "also fine"], cycle=True)
    privacy = PrivacyConfig(mode=request.param)
    app = create_gateway(store, upstream.router(), transport=upstream.transport(), privacy=privacy)
    yield store, app, request.param
    store.close()


def _send(app, method: str, route: str, **kwargs) -> httpx.Response:
    async def call() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            return await client.request(method, route, **kwargs)

    return asyncio.run(call())


def _check_error_shape(response: httpx.Response) -> None:
    assert response.status_code != 500 or "error" in response.json(), response.text[:300]
    if response.status_code >= 400:
        error = response.json()["error"]  # every error is OpenAI's shape, JSON
        assert isinstance(error["message"], str) and error["message"]
        assert "type" in error and "code" in error


@_SETTINGS
@given(route=_routes, body=_body)
def test_any_json_object_gets_an_openai_shaped_answer_and_exactly_one_span(
    gateway, route: str, body: dict
) -> None:
    store, app, mode = gateway
    before = store.list_spans(orphans=True)
    response = _send(app, "POST", route, content=json.dumps(body))
    _check_error_shape(response)
    if response.status_code == 200:
        if body.get("stream") is True:
            assert response.text.endswith("data: [DONE]\n\n"), response.text[-200:]
        else:
            assert response.json()["object"] in ("chat.completion", "text_completion")
    new = store.list_spans(orphans=True)[len(before) :]
    assert len(new) == 1, f"{len(new)} spans for one call answered {response.status_code}"
    assert (new[0].status == "ok") == (response.status_code == 200)
    if mode == "mask":  # whatever the call's fate, no value the detectors know reaches the store in clear
        stored = new[0].model_dump_json()
        leaked = [v for v in _PII_VALUES if v in stored]
        assert leaked == [], (leaked, response.status_code)


@_SETTINGS
@given(
    route=st.one_of(_routes, st.text(alphabet="/abcdefv1%.._-rollouts", max_size=40).map(lambda p: "/" + p)),
    method=st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]),
    raw=st.one_of(st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode())),
    content_type=st.sampled_from(["application/json", "text/plain", "", "application/json; charset=latin-1"]),
)
def test_any_bytes_any_path_any_method_never_crash_the_gateway(
    gateway, route: str, method: str, raw: bytes, content_type: str
) -> None:
    _, app, _ = gateway
    response = _send(app, method, route, content=raw, headers={"content-type": content_type})
    if method == "HEAD":
        assert response.status_code < 500
    elif response.status_code != 200 or response.headers.get("content-type", "").startswith(
        "application/json"
    ):
        _check_error_shape(response)
