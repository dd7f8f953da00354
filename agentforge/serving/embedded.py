"""``EmbeddedServer``: an in-process transformers + peft backend for machines without vLLM.

It serves the OpenAI routes the gateway uses — ``/v1/chat/completions`` (plain and streamed),
``/v1/completions`` (text or token-id prompts), ``/v1/models``, vLLM's ``/tokenize`` (a chat rendered to ids, for
the gateway's token-in continuations) and ``/detokenize`` (ids to text, for masking what the model wrote) —
from a FastAPI app on a loopback port in a background thread, with any number of LoRA adapters loaded side by
side (peft multi-adapter). Responses carry
``prompt_token_ids``, ``choices[0].token_ids`` and ``logprobs`` in vLLM's format, by default with vLLM's default
``logprobs_mode`` (log-softmax of the raw logits, before temperature; ``logprobs_mode=`` picks), so the gateway treats both
backends alike. One request generates at a time (a lock); it is meant for tests, demos and small CPUs,
not throughput.

Every route but ``/health`` needs ``Authorization: Bearer <api_key>``, a key generated per start (the
gateway's upstream entries carry it), so no other local process can use the engine behind the gateway's
back and unrecorded. Adapters load in process only; the HTTP app has no admin routes.
"""

from __future__ import annotations

import contextlib
import hmac
import inspect
import secrets
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from agentforge.config import HTTP_KEEP_ALIVE_S, default_model_dir
from agentforge.errors import MissingExtraError, NotFoundError, ServingError, UserError
from agentforge.loopback import bearer_token, free_port
from agentforge.serving.adapters import check_adapter
from agentforge.serving.sampling import sampling_problem
from agentforge.serving.vllm import default_chat_template
from agentforge.serving.vllm_format import ResponseShaper, Step, prompt_logprob_entries
from agentforge.types import LOGPROBS_MODES

__all__ = ["EmbeddedServer"]


def _render_errors() -> tuple[type[BaseException], ...]:
    """What rendering a body's prompt raises for a body it cannot render: the chat template's own errors
    (jinja2's ``TemplateError``, e.g. ``UndefinedError`` for a message without ``role``) and the tokenizer's."""
    errors: tuple[type[BaseException], ...] = (TypeError, ValueError, KeyError, AttributeError)
    try:
        from jinja2 import TemplateError
    except ImportError:  # pragma: no cover - transformers' chat templates need jinja2
        return errors
    return (*errors, TemplateError)


class _RequestError(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def _close_generators(*generators: Iterator[Any], timeout_s: float = 30.0) -> None:
    """Close generators that may be running one step in another thread (waits up to ``timeout_s``).

    Raises:
        ValueError: a generator was still executing after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    for gen in generators:
        while True:
            try:
                gen.close()  # type: ignore[attr-defined]  # generators, typed as the iterators they are
                break
            except ValueError:  # "generator already executing": a step is finishing in a worker thread
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)


class EmbeddedServer:
    """A :class:`~agentforge.ports.PolicyServer` running transformers + peft in this process.

    Args:
        model: checkpoint directory (default: the prepared SmolLM2-135M-Instruct).
        host: loopback address to bind.
        port: TCP port (default: a free one).
        served_name: the name the base model is served under.
        max_lora_rank: adapters above this rank are refused (mirrors vLLM's ``--max-lora-rank``).
        max_model_len: prompt + completion limit (tokens).
        dtype: torch dtype name of the weights (``float32`` is the safe choice on CPU).
        chat_template: template file (default: as :class:`~agentforge.serving.vllm.VLLMServer`).
        logprobs_mode: what the returned logprobs are, as vLLM's ``--logprobs-mode``: ``"raw_logprobs"``
            (vLLM's default: log-softmax of the raw logits) or ``"processed_logprobs"`` (of the distribution
            sampled from: after temperature and ``top_p``); the gateway records it on every span.

    Attributes:
        api_key: the key every route but ``/health`` needs (``None`` before :meth:`start`; new per start).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        served_name: str = "base",
        max_lora_rank: int = 16,
        max_model_len: int = 2048,
        dtype: str = "float32",
        chat_template: str | Path | None = None,
        logprobs_mode: str = "raw_logprobs",
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise UserError(f"logprobs_mode={logprobs_mode!r}: use one of {', '.join(LOGPROBS_MODES)}")
        self.logprobs_mode = logprobs_mode
        self.base_model = str(model if model is not None else default_model_dir())
        self.host, self.port, self.served_name = host, port or free_port(host), served_name
        self.max_lora_rank, self.max_model_len, self.dtype = max_lora_rank, max_model_len, dtype
        template = Path(chat_template) if chat_template else default_chat_template(self.base_model)
        self._template = template.read_text() if template else None
        self._lock = threading.Lock()  # one generation (or adapter change) at a time
        self._adapters: dict[str, str] = {}
        self._model: Any = None
        self._tokenizer: Any = None
        self._server: Any = None
        self._cache_arg = "past_key_values"
        self._thread: threading.Thread | None = None
        self.api_key: str | None = None

    @property
    def base_url(self) -> str:
        """OpenAI-compatible base URL ending in ``/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def base_model_name(self) -> str:
        """The name the base weights are served under."""
        return self.served_name

    def auth_headers(self) -> dict[str, str]:
        """``{"Authorization": "Bearer <api_key>"}`` (``{}`` before :meth:`start`)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def start(self, timeout_s: float = 60.0) -> None:
        """Load the model and serve it; blocks until the HTTP server accepts requests.

        Raises:
            MissingExtraError: torch/transformers/peft are missing (``agentforge[train]``).
            ServingError: the HTTP server did not start within ``timeout_s`` seconds.
        """
        if self._thread is not None:
            return
        try:
            import torch
            import uvicorn
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MissingExtraError(
                exc.name or "transformers", "train", "the embedded policy server"
            ) from exc
        self._tokenizer = AutoTokenizer.from_pretrained(self.base_model)
        self._model = AutoModelForCausalLM.from_pretrained(
            self.base_model, dtype=getattr(torch, self.dtype)
        ).eval()
        params = inspect.signature(self._model.forward).parameters  # transformers 5.2x renamed the KV cache
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.api_key = secrets.token_urlsafe(32)
        config = uvicorn.Config(
            self._app(),
            host=self.host,
            port=self.port,
            log_level="warning",
            access_log=False,
            timeout_keep_alive=HTTP_KEEP_ALIVE_S,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, name=f"embedded-server-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise ServingError(f"embedded server did not start on {self.base_url} within {timeout_s}s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the HTTP server and drop the model. Safe to call twice."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        # A generation still finishing its step (an abandoned stream) holds the lock: let it end first.
        locked = self._lock.acquire(timeout=10)
        try:
            self._server = self._thread = self._model = None
            self._adapters.clear()
        finally:
            if locked:
                self._lock.release()

    def load_adapter(self, name: str, path: str | Path) -> None:
        """Validate, then load the PEFT adapter at ``path`` under the new name ``name``.

        Raises:
            AdapterIncompatibleError: wrong base model or rank above ``max_lora_rank`` (nothing loaded).
            UserError: ``name`` is in use; ServingError: not started or peft failed.
        """
        info = check_adapter(path, base_model=self.base_model, max_lora_rank=self.max_lora_rank)
        if self._model is None:
            raise ServingError("the embedded server is not started")
        if name == self.served_name or name in self._adapters:
            raise UserError(f"adapter name {name!r} is already in use; load every version under a new name")
        from peft import PeftModel

        with self._lock:
            try:
                if isinstance(self._model, PeftModel):
                    self._model.load_adapter(str(info.path), adapter_name=name)
                else:
                    self._model = PeftModel.from_pretrained(self._model, str(info.path), adapter_name=name)
                self._model.eval()
            except Exception as exc:
                raise ServingError(f"peft could not load {info.path} as {name!r}: {exc}") from exc
            self._adapters[name] = str(info.path)

    def unload_adapter(self, name: str) -> None:
        """Unload adapter ``name``. Raises: ``NotFoundError``."""
        with self._lock:
            if name not in self._adapters:
                raise NotFoundError(f"adapter {name!r} is not loaded on {self.base_url}")
            del self._adapters[name]
            if self._adapters:
                if name in self._model.active_adapters:
                    self._model.set_adapter(next(iter(self._adapters)))
                self._model.delete_adapter(name)
            else:
                self._model = self._model.unload()  # back to the plain base model

    def adapters(self) -> list[str]:
        """Names of the adapters currently loaded."""
        return sorted(self._adapters)

    # -- generation ---------------------------------------------------------------------------------

    def _select(self, model: str) -> contextlib.AbstractContextManager[Any]:
        if model == self.served_name:
            return self._model.disable_adapter() if self._adapters else contextlib.nullcontext()
        if model not in self._adapters:
            known = ", ".join([self.served_name, *self._adapters])
            raise _RequestError(
                404, f"The model `{model}` does not exist. Valid models: {known}.", "NotFoundError"
            )
        self._model.set_adapter(model)
        return contextlib.nullcontext()

    def _generate(
        self, model: str, prompt_ids: list[int], body: dict[str, Any], stops: set[int], limit: int
    ) -> Generator[Step, None, None]:
        """Yield one :data:`Step` per sampled token (at most ``limit``); holds the lock while it runs."""
        import torch

        temperature, top_p = float(body.get("temperature", 1.0) or 0.0), float(body.get("top_p") or 1.0)
        top_n = (
            int(body.get("top_logprobs") or 0)
            if body.get("logprobs") is True
            else int(body.get("logprobs") or 0)
        )
        generator = torch.Generator().manual_seed(int(body["seed"])) if body.get("seed") is not None else None
        with self._lock, self._select(model):
            ids, cache = torch.tensor([prompt_ids]), None
            for _ in range(limit):
                with torch.inference_mode():  # per step: a streamed generator may resume on another thread
                    out = self._model(input_ids=ids, **{self._cache_arg: cache}, use_cache=True)
                    cache, logits = getattr(out, self._cache_arg), out.logits[0, -1].float()
                    logp = torch.log_softmax(logits, -1)
                    if temperature <= 0:
                        token = int(logits.argmax())
                    else:
                        probs = torch.softmax(logits / temperature, -1)
                        if top_p < 1.0:
                            sorted_p, order = probs.sort(descending=True)
                            sorted_p[(sorted_p.cumsum(0) - sorted_p) > top_p] = 0.0
                            probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
                        token = int(torch.multinomial(probs, 1, generator=generator))
                        if self.logprobs_mode == "processed_logprobs":  # the distribution sampled from
                            logp = (
                                torch.log_softmax(logits / temperature, -1)
                                if top_p >= 1.0
                                else (probs / probs.sum()).log()
                            )
                    top = (
                        [(int(i), float(v)) for v, i in zip(*logp.topk(top_n), strict=True)] if top_n else []
                    )
                yield token, float(logp[token]), top
                if token in stops:
                    return
                ids = torch.tensor([[token]])

    def _prompt_logprobs(self, model: str, ids: list[int]) -> list[dict[str, Any] | None]:
        """vLLM's ``prompt_logprobs`` with no top entries: raw log-probabilities of ``ids[1:]`` in one pass."""
        import torch

        with self._lock, self._select(model), torch.inference_mode():
            logits = self._model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
        values = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].tolist()
        return prompt_logprob_entries(self._tokenizer, ids, values)

    def _stop_ids(self, body: dict[str, Any]) -> set[int]:
        eos = getattr(self._model.generation_config, "eos_token_id", None)
        extra = [] if body.get("ignore_eos") else ([eos] if isinstance(eos, int) else list(eos or []))
        return {self._tokenizer.eos_token_id, *extra}

    def _limit(self, body: dict[str, Any], prompt_ids: list[int]) -> int:
        requested = int(body.get("max_completion_tokens") or body.get("max_tokens") or 256)
        return min(requested, self.max_model_len - len(prompt_ids))

    def _prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            text = self._tokenizer.apply_chat_template(
                body["messages"],
                tools=body.get("tools"),
                chat_template=self._template,
                tokenize=False,
                add_generation_prompt=body.get("add_generation_prompt", True),
                **(body.get("chat_template_kwargs") or {}),
            )
        elif isinstance(body.get("prompt"), list) and all(isinstance(t, int) for t in body["prompt"]):
            return list(body["prompt"])
        else:
            text = str(body.get("prompt", ""))
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- HTTP ---------------------------------------------------------------------------------------

    def _app(self) -> Any:
        from fastapi import Body, Depends, FastAPI, Header, Request
        from fastapi.responses import JSONResponse, StreamingResponse

        key = (self.api_key or "").encode()

        def authorize(authorization: str = Header("")) -> None:
            if not key or not hmac.compare_digest(bearer_token(authorization).encode(), key):
                raise _RequestError(
                    401, "this engine port needs the serving layer's key", "AuthenticationError"
                )

        app = FastAPI(
            title="agentforge embedded policy server",
            docs_url=None,
            redoc_url=None,
            openapi_url=None,
        )
        keyed = [Depends(authorize)]  # every route but /health

        class EngineStream(StreamingResponse):
            """A streamed answer that frees the engine the moment it ends, however it ends.

            Starlette stops iterating a stream whose client left (the disconnect cancels it, or a send
            fails) but does not close the iterator, so a generator suspended inside ``_generate`` would
            hold the engine lock until garbage collection and wedge every later request. This response
            closes the event and token generators (releasing the lock) when it ends, normally or not.
            """

            def __init__(self, steps: Iterator[Step], events: Iterator[str]) -> None:
                super().__init__(events, media_type="text/event-stream")
                self._generators = (events, steps)

            async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
                import anyio

                try:
                    await super().__call__(scope, receive, send)
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(_close_generators, *self._generators)

        @app.exception_handler(_RequestError)
        async def _error(_: Request, exc: _RequestError) -> JSONResponse:
            body = {"error": {"message": str(exc), "type": exc.kind, "param": None, "code": exc.status}}
            return JSONResponse(body, status_code=exc.status)

        @app.get("/health")
        def health() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/v1/models", dependencies=keyed)
        def models() -> dict[str, Any]:
            card = {"object": "model", "created": int(time.time()), "owned_by": "agentforge"}
            cards = [card | {"id": self.served_name, "root": self.base_model, "parent": None}]
            cards += [
                card | {"id": n, "root": p, "parent": self.served_name} for n, p in self._adapters.items()
            ]
            return {"object": "list", "data": cards}

        render_errors = _render_errors()

        def respond(body: dict[str, Any], chat: bool) -> Any:
            problem = sampling_problem(body, chat)
            if problem is not None:
                raise _RequestError(400, problem)
            body.setdefault("model", self.served_name)
            if body["model"] != self.served_name and body["model"] not in self._adapters:
                self._select(body["model"])  # raises the 404
            try:
                prompt_ids = self._prompt_ids(body, chat)
            except render_errors as exc:  # the chat template's complaint
                what = "messages" if chat else "prompt"
                raise _RequestError(400, f"cannot render the {what}: {type(exc).__name__}: {exc}") from None
            vocab = int(self._model.get_input_embeddings().num_embeddings)
            bad = next((t for t in prompt_ids if not 0 <= t < vocab), None)
            if bad is not None:  # vLLM answers 400 for it too; an index error of the model was a 500
                raise _RequestError(
                    400, f"prompt token id {bad} is outside the model's vocabulary of {vocab}"
                )
            limit = self._limit(body, prompt_ids)
            if limit <= 0:
                raise _RequestError(
                    400, f"prompt of {len(prompt_ids)} tokens leaves no room in {self.max_model_len}"
                )
            stops = self._stop_ids(body)
            shaper = ResponseShaper(
                self._tokenizer, body, chat=chat, prompt_ids=prompt_ids, stop_ids=stops, limit=limit
            )
            steps = self._generate(body["model"], prompt_ids, body, stops, limit)
            if body.get("stream"):
                return EngineStream(steps, shaper.stream(steps))
            out = shaper.full(list(steps))
            if not chat and body.get("prompt_logprobs") is not None:  # each prompt token's, as vLLM
                out["choices"][0]["prompt_logprobs"] = self._prompt_logprobs(body["model"], prompt_ids)
            return out

        @app.post(
            "/v1/chat/completions", dependencies=keyed
        )  # sync handlers: FastAPI runs them in its thread pool
        def chat(body: dict[str, Any] = Body(...)) -> Any:
            return respond(body, chat=True)

        @app.post("/v1/completions", dependencies=keyed)
        def completions(body: dict[str, Any] = Body(...)) -> Any:
            return respond(body, chat=False)

        @app.post("/tokenize", dependencies=keyed)
        def tokenize(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
            """vLLM's ``/tokenize``: ``messages`` (+ ``tools``, ``add_generation_prompt``) or ``prompt``."""
            chat = "messages" in body
            try:
                ids = self._prompt_ids(body, chat)
            except render_errors as exc:
                raise _RequestError(400, f"cannot render: {type(exc).__name__}: {exc}") from None
            return {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids}

        @app.post("/detokenize", dependencies=keyed)
        def detokenize(body: dict[str, Any] = Body(...)) -> dict[str, Any]:
            """vLLM's ``/detokenize``: ``tokens`` (ids) → ``prompt`` (their text, special tokens kept)."""
            ids = body.get("tokens")
            vocab = len(self._tokenizer)
            if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < vocab for t in ids):
                raise _RequestError(400, f"'tokens' must be a list of token ids in [0, {vocab})")
            return {"prompt": self._tokenizer.decode(ids)}

        return app

    def __enter__(self) -> EmbeddedServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
