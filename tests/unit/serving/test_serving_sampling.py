"""Bad sampling parameters are a 400 that names the parameter (issue 16, low): the checks, then the real
embedded engine answering them (before this, ``max_tokens=-5`` got a misleading context-length 400 and a
wrongly typed ``top_p`` a bare 500)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from agentforge.serving.sampling import sampling_problem

BAD = [
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": [0.5]}, "top_p"),
    ({"n": 2}, "n"),
    ({"seed": "x"}, "seed"),
    ({"logprobs": 5}, "logprobs"),
    ({"top_logprobs": 50}, "top_logprobs"),
    ({"stream": "no"}, "stream"),
]


@pytest.mark.parametrize(("params", "name"), BAD)
def test_each_bad_parameter_is_named(params: dict, name: str) -> None:
    problem = sampling_problem(params, chat=True)
    assert problem is not None and problem.startswith(name), problem


def test_good_parameters_pass_on_both_endpoints() -> None:
    good = {
        "max_tokens": 4,
        "temperature": 0,
        "top_p": 0.9,
        "n": 1,
        "seed": 3,
        "top_logprobs": 2,
        "stream": False,
    }
    assert sampling_problem({**good, "logprobs": True}, chat=True) is None
    assert sampling_problem({**good, "logprobs": 2}, chat=False) is None
    assert sampling_problem({}, chat=True) is None
    assert sampling_problem({"logprobs": True}, chat=False) is not None  # completions take a count


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    pytest.importorskip("torch")
    from agentforge.serving.embedded import EmbeddedServer

    server = EmbeddedServer()
    server.start()
    yield server
    server.stop()


@pytest.mark.slow
def test_the_embedded_engine_answers_bad_parameters_with_a_400_naming_them(engine) -> None:
    chat = {"model": engine.served_name, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=engine.base_url, headers=engine.auth_headers(), timeout=60) as client:
        for params, name in BAD[:4] + BAD[8:10]:
            r = client.post("/chat/completions", json={**chat, **params})
            assert r.status_code == 400 and r.json()["error"]["message"].startswith(name), r.text
        r = client.post(
            "/chat/completions",
            json={**chat, "max_tokens": 2, "messages": [{"role": "user", "content": {"x": 1}}]},
        )
        assert r.status_code in (200, 400), r.text  # a template that cannot render it is a 400, never a 500
        ok = client.post("/chat/completions", json={**chat, "max_tokens": 2, "temperature": 0})
        assert ok.status_code == 200
