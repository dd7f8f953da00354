"""Property-based fuzzing of the dashboard (issue 36, must-show: a fuzz pass over the new surfaces): any path
under it, any query string (filters, keyset cursors, diff arguments of any type), any cookie and any login
form body get a page, a JSON answer, a redirect or a clear 4xx — never a bare 500 — and without the key
nothing of the store's content comes back."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from fuzzing import FUZZ
from hypothesis import given, settings
from hypothesis import strategies as st

from agentforge.dashboard.app import create_dashboard_app
from agentforge.stores.sql import SQLStore
from agentforge.types import LLMCall, Reward, Rollout, Span, SpanKind

KEY = "dashboard-fuzz-key-0123456789"
MARKER = "private-marker-93k"
PATHS = [
    "/",
    "/runs",
    "/runs.json",
    "/rollouts",
    "/rollouts/{rid}",
    "/rollouts/{text}",
    "/versions",
    "/login",
]
PARAMS = ["state", "agent", "version", "min_reward", "max_reward", "before", "limit", "diff", "a", "b", "q"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    store = SQLStore(f"sqlite:///{tmp_path_factory.mktemp('dash') / 'traces.db'}")
    ro = store.enqueue_rollout(Rollout(agent="triage", metadata={"note": MARKER}))
    call = LLMCall(
        request={"messages": [{"role": "user", "content": MARKER}]},
        response_text=MARKER,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        logprobs=[-0.1],
        version="policy@v1",
    )
    store.add_span(Span(rollout_id=ro.rollout_id, kind=SpanKind.llm, llm=call))
    store.add_span(Span(kind=SpanKind.custom, name=MARKER))  # an unattributed call
    store.add_reward(Reward(rollout_id=ro.rollout_id, value=0.5, final=True))
    open_app = TestClient(create_dashboard_app(store, tokenizer=False), follow_redirects=False)
    keyed = TestClient(create_dashboard_app(store, api_key=KEY, tokenizer=False), follow_redirects=False)
    yield ro.rollout_id, open_app, keyed
    store.close()


queries = st.dictionaries(
    st.sampled_from(PARAMS),
    st.one_of(
        st.text(max_size=20), st.integers(-(2**70), 2**70).map(str), st.sampled_from(["nan", "-inf", "1e999"])
    ),
    max_size=4,
)


@settings(FUZZ, max_examples=150)
@given(
    path=st.sampled_from(PATHS),
    text=st.text(min_size=1, max_size=30),
    query=queries,
    cookie=st.text(max_size=40),
)
def test_any_dashboard_request_gets_an_answer_never_a_500(world, path, text, query, cookie) -> None:  # type: ignore[no-untyped-def]
    rollout_id, open_app, keyed = world
    url = path.format(rid=rollout_id, text=quote(text, safe=""))
    for client in (open_app, keyed):
        client.cookies.clear()
        client.cookies.set("agentforge_dashboard_key", cookie.encode("ascii", "ignore").decode() or "x")
        answer = client.get(url, params=query)
        assert answer.status_code < 500, (url, query, answer.status_code, answer.text[:300])
    keyed.cookies.clear()  # no key, no cookie: a login redirect or a refusal, and nothing of the store
    bare = keyed.get(url, params=query)
    assert path == "/login" or bare.status_code in (303, 307, 401, 403), (url, bare.status_code)
    assert MARKER not in bare.text


@settings(FUZZ, max_examples=60)
@given(body=st.binary(max_size=200))
def test_any_login_form_body_is_a_page_not_a_500(world, body: bytes) -> None:  # type: ignore[no-untyped-def]
    _, _, keyed = world
    answer = keyed.post("/login", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert answer.status_code in (200, 303), answer.status_code
    assert MARKER not in answer.text
