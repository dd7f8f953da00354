"""A customer-service app that serves an agent to users and turns their feedback into training rewards.

Every conversation is one stored rollout (``session_id == rollout_id``); the agent's LLM calls go through
the agentforge gateway at ``{gateway}/rollouts/{rollout_id}/v1``, so each is recorded token-exactly and
attributed to that conversation. A user's thumbs up/down becomes the rollout's reward, whenever it comes.

Routes:

* ``POST /sessions`` — ``{"user"?, "metadata"?, "prompt_version"?}`` → 201 ``{"session_id", "rollout_id",
  "session_token", "state": "running", "prompt_version"}``. The rollout is enqueued for agent :data:`AGENT` and moved to
  ``running`` at once, without an attempt: the app, not a runner, works on it, so no heartbeat is needed
  (a conversation may idle for hours) and a runner's ``requeue_stale`` never takes it back. The system
  prompt is the versioned resource :data:`PROMPT_NAME`, read when the session starts (the active version,
  or ``prompt_version`` when given; 404 if it does not exist) and recorded in the rollout's
  ``resources``: publishing a new version changes the next sessions, with no restart.
* ``POST /sessions/{id}/messages`` — ``{"content", "stream"?: false}`` → ``{"reply", "tool_calls"}``, or
  with ``stream: true`` a ``text/event-stream`` of ``delta`` (``{"text"}``), ``tool`` and a final ``done``
  event (``{"reply", "tool_calls"}``); a failed model call is a 502 (an ``error`` event when streaming)
  and the turn is dropped from the history. 404 for an unknown session, 409 for a closed one.
* ``POST /sessions/{id}/feedback`` — ``{"score": 1 | -1 | float, "comment"?}`` → the rollout's reward
  (``name="user_feedback"``, ``source="user_feedback"``, ``final=True``, the comment in its metadata),
  written with :func:`agentforge.tracing.emit_reward`. Feedback after ``close`` still attaches (rewards
  may arrive at any time); the last feedback is the one that trains. 404 for an unknown session.
* ``POST /sessions/{id}/close`` — the rollout goes to ``succeeded`` (idempotent) → ``{"session_id",
  "state"}``.

Who may do what: every ``/sessions/{id}/...`` route needs ``Authorization: Bearer <session_token>``, the
token ``POST /sessions`` returned for that session (401 without it or with another session's token), so
nobody can talk in, rate or close a conversation that is not theirs; the store keeps only the token's
SHA-256, so a rating still checks after a restart. With an app key (``--app-key`` / ``$AGENTFORGE_APP_KEY``)
``POST /sessions`` needs ``Authorization: Bearer <app key>`` too; without one the app serves only requests
that arrive on loopback (:class:`agentforge.loopback.LoopbackGuard`), as every agentforge server does. The
app holds the gateway's keys; the users never see them.

Run it next to a gateway (the gateway also serves the store API, so the store URL defaults to it)::

    python examples/app/service.py --gateway-url http://127.0.0.1:8000 --port 8080
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import math
import os
import secrets
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from fastapi import FastAPI, Header, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field, field_validator

from agentforge import (
    AgentForgeError,
    NotFoundError,
    Rollout,
    RolloutState,
    Task,
    TraceStore,
    emit_reward,
    get_prompt,
    open_store,
    rollout_base_url,
)
from agentforge.types import new_id

sys.path.insert(0, str(Path(__file__).resolve().parent))  # chat_agent.py sits next to this file

import chat_agent  # noqa: E402

from agentforge.loopback import LoopbackGuard, bearer_token, check_bind  # noqa: E402

__all__ = ["AGENT", "PROMPT_NAME", "create_app", "main"]

#: The agent name of every rollout this app stores.
AGENT = "app:customer-service"

#: The versioned system-prompt resource (version 1: chat_agent's built-in system prompt).
PROMPT_NAME = "prompt:app-system"


class NewSession(BaseModel):
    """Body of ``POST /sessions``."""

    user: str | None = Field(
        default=None, min_length=1, max_length=200
    )  # the app's user: the rollout's user_id
    metadata: dict[str, Any] = Field(default_factory=dict)
    prompt_version: int | None = Field(default=None, ge=1)


class UserMessage(BaseModel):
    """Body of ``POST /sessions/{id}/messages``."""

    content: str = Field(min_length=1)
    stream: bool = False


class Feedback(BaseModel):
    """Body of ``POST /sessions/{id}/feedback``: ``score`` is the reward (1 thumbs up, -1 thumbs down)."""

    score: float
    comment: str | None = None

    @field_validator("score")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("score must be a finite number, e.g. 1 (thumbs up) or -1 (thumbs down)")
        return v


@dataclass
class Conversation:
    """An open conversation: its rollout, its token's digest, its message history, and a lock (one turn at a
    time)."""

    rollout_id: str
    token_digest: str
    messages: list[dict[str, Any]]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


#: Where a session's token digest is kept (``Rollout.metadata``); the token itself is never stored.
TOKEN_KEY = "session_token_sha256"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _unknown(session_id: str) -> HTTPException:
    return HTTPException(
        404, detail=f"no session {session_id!r}: unknown session id (start one with POST /sessions)"
    )


def create_app(
    gateway_url: str,
    store: TraceStore,
    *,
    model: str = "policy",
    api_key: str | None = None,
    max_tokens: int = 48,
    app_key: str | None = None,
    agent: Any = chat_agent,
    prompt_name: str = PROMPT_NAME,
) -> FastAPI:
    """Build the app.

    Args:
        gateway_url: the agentforge gateway's root, e.g. ``http://127.0.0.1:8000`` (no ``/v1``).
        store: the trace store the gateway writes to (an ``HTTPStore`` of the gateway, or the same
            ``SQLStore``); the app writes rollouts and feedback rewards there.
        model: the model name the agent asks for (the gateway's alias).
        api_key: the gateway's API key, if it has one.
        max_tokens: completion limit per model call, tokens.
        app_key: the key ``POST /sessions`` needs (``None``: loopback only; see the module docstring).
        agent: the agent the app serves: a module (or object) with ``SYSTEM`` (its default system prompt),
            ``new_conversation(system)``, ``async reply(client, model, messages, max_tokens)`` and
            ``stream_reply(...)``, as :mod:`chat_agent` (the default) or ``order_agent`` (the order bot).
        prompt_name: the versioned system-prompt resource the sessions read (its version 1: ``agent.SYSTEM``).

    Returns:
        The FastAPI app (routes in the module docstring). Conversations live in this process's memory;
        their rollouts, spans and rewards live in the store.
    """
    root = gateway_url.rstrip("/")
    client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=api_key or "unused-on-loopback")
    open_sessions: dict[str, Conversation] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.close()

    app = FastAPI(
        title="agentforge example: customer-service app",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    if app_key is None:
        app.add_middleware(LoopbackGuard, what="example app")

    def session_rollout(session_id: str, authorization: str | None) -> Rollout:
        """The session's rollout, once the caller proved it holds the session's token (404, 401)."""
        try:
            rollout = store.get_rollout(session_id)
        except NotFoundError:
            raise _unknown(session_id) from None
        if rollout.agent != AGENT:
            raise _unknown(session_id)
        expected = str(rollout.metadata.get(TOKEN_KEY, ""))
        given = bearer_token(authorization)
        if not expected or not given or not hmac.compare_digest(_digest(given), expected):
            raise HTTPException(
                401,
                detail=f"session {session_id!r} needs 'Authorization: Bearer <session_token>' with the token "
                "POST /sessions returned for it",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return rollout

    @app.post("/sessions", status_code=201)
    def new_session(
        body: NewSession | None = None, authorization: str | None = Header(default=None)
    ) -> dict[str, Any]:
        if app_key is not None and not hmac.compare_digest(bearer_token(authorization), app_key):
            raise HTTPException(
                401,
                detail="POST /sessions needs 'Authorization: Bearer <app key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        body = body or NewSession()
        token = secrets.token_urlsafe(24)
        try:  # read at every session start: a newly published version applies from the next session
            prompt = get_prompt(store, prompt_name, version=body.prompt_version, default=agent.SYSTEM)
        except NotFoundError as exc:
            raise HTTPException(404, detail=str(exc)) from None
        except AgentForgeError as exc:  # e.g. the store refused to publish the first prompt: no admin key
            raise HTTPException(
                503,
                detail=f"the app cannot read or publish its prompt {prompt_name!r}: {exc}. Start the app with the "
                "store's admin key (--admin-key / AGENTFORGE_ADMIN_KEY) so it can publish its first prompt, or "
                "publish one with an admin key first",
            ) from None
        session_id = new_id("ro")  # the session is the rollout: forget --session <session_id> finds it
        rollout = Rollout(
            rollout_id=session_id,
            session_id=session_id,
            user_id=body.user,
            agent=AGENT,
            task=Task(input={"channel": "app"}, metadata={"user": body.user}),
            resources={prompt_name: str(prompt.version)},
            metadata={**body.metadata, "user": body.user, TOKEN_KEY: _digest(token)},
        )
        rollout = store.enqueue_rollout(rollout)
        rollout = store.update_rollout(rollout.rollout_id, state=RolloutState.running)
        system = str(prompt.payload.get("template", ""))
        open_sessions[rollout.rollout_id] = Conversation(
            rollout.rollout_id, _digest(token), agent.new_conversation(system)
        )
        return {
            "session_id": rollout.rollout_id,
            "rollout_id": rollout.rollout_id,
            "session_token": token,
            "state": rollout.state,
            "prompt_version": prompt.version,
        }

    @app.post("/sessions/{session_id}/messages", response_model=None)
    async def message(
        session_id: str, body: UserMessage, authorization: str | None = Header(default=None)
    ) -> dict[str, Any] | StreamingResponse:
        conv = open_sessions.get(session_id)
        if conv is None or not hmac.compare_digest(_digest(bearer_token(authorization)), conv.token_digest):
            rollout = await asyncio.to_thread(session_rollout, session_id, authorization)  # 404, 401
        if conv is None:
            raise HTTPException(
                409,
                detail=f"session {session_id!r} is not open (its rollout is {rollout.state.value}); "
                "start a new one with POST /sessions",
            )
        agent_client = client.with_options(base_url=rollout_base_url(root, conv.rollout_id))
        if body.stream:
            return StreamingResponse(
                _stream_turn(agent, conv, agent_client, model, body.content, max_tokens),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        async with conv.lock:
            size = len(conv.messages)
            conv.messages.append({"role": "user", "content": body.content})
            try:
                text, tools = await agent.reply(agent_client, model, conv.messages, max_tokens)
            except openai.APIError as exc:
                del conv.messages[size:]
                raise HTTPException(502, detail=f"the model call failed: {exc}") from exc
        return {"reply": text, "tool_calls": tools}

    @app.post("/sessions/{session_id}/feedback")
    def feedback(
        session_id: str, body: Feedback, authorization: str | None = Header(default=None)
    ) -> dict[str, Any]:
        session_rollout(session_id, authorization)
        reward = emit_reward(
            body.score,
            name="user_feedback",
            final=True,
            rollout_id=session_id,
            source="user_feedback",
            store=store,
            comment=body.comment,
        )
        return {"session_id": session_id, "reward_id": reward.reward_id, "value": reward.value}

    @app.post("/sessions/{session_id}/close")
    async def close(session_id: str, authorization: str | None = Header(default=None)) -> dict[str, str]:
        rollout = await asyncio.to_thread(session_rollout, session_id, authorization)
        conv = open_sessions.pop(session_id, None)
        if conv is not None:
            async with conv.lock:  # let a turn in progress finish first
                pass
        if rollout.state is RolloutState.running:
            rollout = await asyncio.to_thread(store.update_rollout, session_id, state=RolloutState.succeeded)
        return {"session_id": session_id, "state": rollout.state}

    return app


async def _stream_turn(
    agent: Any, conv: Conversation, client: openai.AsyncOpenAI, model: str, content: str, max_tokens: int
) -> AsyncIterator[str]:
    """One streamed turn as server-sent events; a failure becomes an ``error`` event."""
    async with conv.lock:
        size = len(conv.messages)
        conv.messages.append({"role": "user", "content": content})
        try:
            async for event in agent.stream_reply(client, model, conv.messages, max_tokens):
                yield chat_agent.as_sse(event)
        except openai.APIError as exc:
            del conv.messages[size:]
            yield chat_agent.as_sse({"type": "error", "detail": f"the model call failed: {exc}"})


def main() -> None:
    """Command line: serve the app with uvicorn (flags default to ``AGENTFORGE_*`` environment variables)."""
    import uvicorn

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    gateway = os.environ.get("AGENTFORGE_GATEWAY_URL", "http://127.0.0.1:8000")
    parser.add_argument("--gateway-url", default=gateway)
    parser.add_argument(
        "--store-url", default=os.environ.get("AGENTFORGE_STORE_URL"), help="default: the gateway URL"
    )
    parser.add_argument("--model", default=os.environ.get("AGENTFORGE_MODEL", "policy"))
    parser.add_argument("--api-key", default=os.environ.get("AGENTFORGE_API_KEY"))
    parser.add_argument(  # the first session publishes the built-in system prompt as version 1
        "--admin-key", default=os.environ.get("AGENTFORGE_ADMIN_KEY"), help="the store's admin key"
    )
    parser.add_argument(
        "--app-key",
        default=os.environ.get("AGENTFORGE_APP_KEY"),
        help="key for POST /sessions (required off loopback)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    check_bind(args.host, args.app_key, "example app")
    store = open_store(args.store_url or args.gateway_url, api_key=args.api_key, admin_key=args.admin_key)
    try:
        app = create_app(
            args.gateway_url, store, model=args.model, api_key=args.api_key, app_key=args.app_key
        )
        uvicorn.run(app, host=args.host, port=args.port)
    finally:
        store.close()


if __name__ == "__main__":
    main()
