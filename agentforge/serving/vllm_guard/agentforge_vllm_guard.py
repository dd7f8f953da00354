"""ASGI middleware that vLLM loads (``--middleware agentforge_vllm_guard.KeyGuard``): every route needs a key.

This file runs inside vLLM's interpreter (its own virtual environment), so it imports nothing but the
standard library. :class:`agentforge.serving.vllm.VLLMServer` puts this folder on the vLLM process's
``PYTHONPATH`` and hands it two secrets it generates per start, in the environment (never on the command
line, which every local user can read):

* ``AGENTFORGE_VLLM_KEY`` — the inference key: ``POST /v1/chat/completions``, ``/v1/completions``,
  ``GET /v1/models``, ``POST /tokenize``, ``/detokenize``. The gateway's upstream entries carry it.
* ``AGENTFORGE_VLLM_ADMIN_KEY`` — the admin key, held by the serving layer only: every other route
  (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``, the SageMaker routes ``/adapters`` and
  ``/invocations``, ``/metrics``, dev-mode routes, anything vLLM adds later). It also opens the
  inference routes.

Only ``GET /health`` is open. vLLM's own ``--api-key`` is not enough: its middleware guards only paths
under ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (``vllm/entrypoints/serve/middleware/authenticate.py``
in vLLM 0.32), which leaves ``POST /adapters`` (load a LoRA from any directory), ``DELETE /adapters/{name}``
and ``POST /invocations`` (chat without a key) open. Paths are matched exactly, so a path trick
(``//v1/...``, a trailing slash, ``%2F``) lands in "everything else" and needs the admin key.

Refused requests get ``401`` with an OpenAI-style body. Without both keys in the environment the middleware
raises at construction, so vLLM fails to start rather than serve unguarded.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["INFERENCE_ROUTES", "KeyGuard"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: ``(method, path)`` pairs the inference key opens; every other route needs the admin key.
INFERENCE_ROUTES: frozenset[tuple[str, str]] = frozenset(
    {
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("GET", "/v1/models"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
    }
)
_OPEN_ROUTES = frozenset({("GET", "/health"), ("HEAD", "/health")})


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyGuard:
    """Pure ASGI middleware: inference routes need either key, every other route the admin key.

    Args:
        app: the ASGI app to guard (vLLM's FastAPI app).

    Raises:
        RuntimeError: ``AGENTFORGE_VLLM_KEY`` or ``AGENTFORGE_VLLM_ADMIN_KEY`` is unset or shorter than 16
            characters (vLLM then fails to start).
    """

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        keys = {
            name: os.environ.get(name, "") for name in ("AGENTFORGE_VLLM_KEY", "AGENTFORGE_VLLM_ADMIN_KEY")
        }
        short = [name for name, key in keys.items() if len(key) < 16]
        if short:
            raise RuntimeError(
                f"agentforge_vllm_guard: {', '.join(short)} unset or shorter than 16 characters"
            )
        self.app = app
        self._inference = _digest(keys["AGENTFORGE_VLLM_KEY"])
        self._admin = _digest(keys["AGENTFORGE_VLLM_ADMIN_KEY"])

    def _bearer(self, scope: Scope) -> bytes | None:
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return _digest(token.strip()) if scheme.lower() == "bearer" else None
        return None

    def allowed(self, scope: Scope) -> bool:
        """Whether the request in ``scope`` may reach vLLM (see the module docstring)."""
        route = (str(scope.get("method") or "GET").upper(), str(scope.get("path") or ""))
        if route in _OPEN_ROUTES:
            return True
        token = self._bearer(scope)
        if token is None:
            return False
        admin = hmac.compare_digest(token, self._admin)
        inference = hmac.compare_digest(token, self._inference)
        return admin or (inference and route in INFERENCE_ROUTES)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(
            {
                "error": {
                    "message": "this engine port needs the serving layer's key",
                    "type": "authentication_error",
                    "param": None,
                    "code": 401,
                }
            }
        ).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": body})
