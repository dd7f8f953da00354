"""Token in, token out for linear conversations: a rollout's follow-up chat call is sent to the engine as ids.

Why: between two calls of a tool loop the client sends the whole history back, and the chat template renders
the assistant's turn again from the *parsed* message (tool-call arguments re-serialised, spacing changed), so
the next prompt's ids no longer start with the previous prompt + completion ids, and the trainer's merge rule
(:mod:`agentforge.trainers.samples`) starts a new trajectory (DESIGN fact 6).

What: the gateway remembers, per rollout, the last few chat calls it answered (the client's request and the
recorded ids). A new chat call of that rollout *continues* one of them when its ``messages`` start with that
call's messages plus the assistant message the gateway returned (compared as the client may echo them:
content without surrounding whitespace, tool calls by name and parsed arguments, ids ignored) and it renders
with the same ``tools`` / ``chat_template_kwargs``. Then its prompt is built as

    previous prompt ids + previous completion ids + closing + ids of the newly rendered messages

where the new messages' ids are ``render(messages)[len(render(messages[:k+1], no generation prompt)):]``
(the engine's own ``/tokenize``, with the engine's chat template and the tool schemas), and ``closing`` is
what the template puts after an assistant turn (ChatML: ``<|im_end|>\\n``) minus the part the model sampled
itself (its ``<|im_end|>``): the closing is the common tail of two probe renderings, cached per engine. The
ids go to the engine's ``/v1/completions`` (a token-id prompt), and the answer is turned back into the chat
answer the client expects, tool calls parsed in the Hermes format as vLLM's ``hermes`` parser and the
embedded backend do (:func:`agentforge.toolcalls.parse_tool_calls`). A streamed continuation is generated
whole and sent as a short stream (role, content and tool calls, finish, usage). The span is recorded from
that answer with the flag :data:`CONTINUED`; the engine's echoed prompt ids are the span's prompt ids.

A guided chat call of a rollout (``tool_choice="required"``, a JSON ``response_format``, ...) also takes this
module's path: it is answered as the engine answers it and recorded with the policy's own log-probabilities
(:mod:`agentforge.gateway.guided`).

When a call of a known rollout cannot continue, it takes the ordinary path and its span gets the flag
``prefix_break:<reason>`` (see :data:`BREAK_REASONS`), so every split the trainer counts has a visible cause.
Calls outside a rollout, non-chat calls and engines without ``Upstream.token_in`` never enter this module
beyond one dictionary lookup. State lives in this gateway process (an LRU of :data:`MAX_ROLLOUTS` rollouts,
:data:`TURNS_PER_ROLLOUT` calls each, :data:`MAX_IDS` token ids in all), and is rebuilt from the trace store
where it is missing or behind: a chat call that carries an assistant message, of a rollout this process remembers nothing of (another replica
served it, or this process restarted), or whose history holds an answer after the last call it continues of
those remembered here (another replica answered it), reads the
rollout's recorded chat calls (their spans hold the request and the ids, committed before their answers
were sent) off the event loop and continues the one it extends. So a conversation stays one trajectory
whichever gateway replica serves each of its calls. A rollout whose read found nothing to continue is not
read again while it stays in an LRU of :data:`MAX_ROLLOUTS` ids (unless this process then records a call of it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import anyio
from starlette.responses import Response

from agentforge.gateway.guided import GUIDED_RECOMPUTED, is_guided, recompute_logprobs
from agentforge.gateway.prefix_call import answer_client, engine_call
from agentforge.gateway.prefix_wire import chat_answer, engine_headers
from agentforge.gateway.upstream import UpstreamTimeout, UpstreamUnreachable
from agentforge.gateway.wire import decode_json, encode_json, error_body

if TYPE_CHECKING:
    from agentforge.gateway.call import CallContext
    from agentforge.gateway.host import CallHost
    from agentforge.gateway.router import Upstream
    from agentforge.types import LLMCall, Span

__all__ = [
    "CONTINUED",
    "BREAK_PREFIX",
    "BREAK_REASONS",
    "Continuations",
    "MAX_IDS",
    "MAX_ROLLOUTS",
    "TURNS_PER_ROLLOUT",
]

logger = logging.getLogger("agentforge.gateway")

#: Flag on the span of a call whose prompt was built from the rollout's previous ids (token in, token out).
CONTINUED = "token_in_continuation"
#: Prefix of the flag on the span of a call of a known rollout that could not continue (``prefix_break:why``).
BREAK_PREFIX = "prefix_break:"
#: Why a call of a known rollout was not continued.
BREAK_REASONS = {
    "option": "the request sets an option a token-id prompt cannot carry (n > 1, a forced tool_choice, ...)",
    "history": "its messages do not start with an earlier call's messages and the answer the gateway gave",
    "render": "the engine could not render the messages (no /tokenize, or an error)",
    "template": "the template's rendering of the history is not a prefix of its rendering of the new messages",
}
#: Rollouts whose recent calls are remembered (least recently used ones are forgotten first).
MAX_ROLLOUTS = 2048
#: Calls remembered per rollout (several are kept for agents that interleave independent conversations).
TURNS_PER_ROLLOUT = 4
#: Token ids (prompt + completion, summed over every remembered call) held at most; past it the least recently
#: used rollouts are forgotten (a later call of one reads its calls back from the store). About 36 bytes an id
#: in CPython (an int object and its list slot): ≈ 150 MB.
MAX_IDS = 4_000_000

#: Request keys a continuation carries over to ``/v1/completions`` unchanged.
_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "user",
)
#: Request keys a continuation understands; any other key sends the call down the ordinary path.
_ALLOWED = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
        "max_tokens",
        "n",
        "logprobs",
        "max_completion_tokens",
        "top_logprobs",
        "return_token_ids",
        "parallel_tool_calls",
        "chat_template_kwargs",
        "metadata",
        "store",
        *_SAMPLING,
    }
)
#: Request keys that change how the messages render: they must equal the earlier call's.
_RENDER_KEYS = ("tools", "chat_template_kwargs")
_PROBES = ("A", "B")


class _Turn:
    """One answered chat call: the client's request and the recorded call (ids, text, tool calls)."""

    __slots__ = ("request", "llm")

    def __init__(self, request: dict[str, Any], llm: LLMCall) -> None:
        self.request, self.llm = request, llm


def _arguments(raw: Any) -> str:
    """Tool-call arguments in one canonical form (parsed JSON, sorted keys; raw text when not JSON)."""
    if isinstance(raw, dict):
        return json.dumps(raw, sort_keys=True)
    if raw is None or not str(raw).strip():
        return "{}"
    try:
        return json.dumps(json.loads(raw), sort_keys=True)
    except (ValueError, TypeError):
        return str(raw)


def _text(content: Any) -> str:
    if isinstance(content, list):  # content parts: their text, in order
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _message_key(message: Any) -> tuple[Any, ...]:
    """What must be equal for a history message to count as the same message."""
    if not isinstance(message, dict):
        return ("?", repr(message))
    calls = tuple(
        ((c.get("function") or {}).get("name"), _arguments((c.get("function") or {}).get("arguments")))
        for c in message.get("tool_calls") or ()
        if isinstance(c, dict)
    )
    return (message.get("role"), _text(message.get("content")).strip(), calls, message.get("tool_call_id"))


def _answer_key(llm: LLMCall) -> tuple[Any, ...]:
    """The key of the assistant message the gateway returned for ``llm``."""
    calls = tuple((c.name, _arguments(c.arguments)) for c in llm.tool_calls)
    return ("assistant", (llm.response_text or "").strip(), calls, None)


def _unsupported(body: dict[str, Any]) -> bool:
    if body.get("n") not in (None, 1) or body.get("tool_choice") not in (None, "auto", "none"):
        return True
    return any(key not in _ALLOWED for key in body)


def _common_tail(a: Sequence[int], b: Sequence[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return list(a[len(a) - n :])


def _glue(completion: Sequence[int], closing: Sequence[int]) -> list[int]:
    """The part of ``closing`` that follows ``completion``: the longest head of ``closing`` the completion
    already ends with (the model's own end-of-turn token) is not repeated."""
    for j in range(min(len(closing), len(completion)), 0, -1):
        if list(completion[-j:]) == list(closing[:j]):
            return list(closing[j:])
    return list(closing)


def _continuable(llm: LLMCall) -> bool:
    """Whether a recorded chat call may be continued token-in: trainable, with its prompt and completion ids."""
    return llm.trainable and llm.prompt_token_ids is not None and llm.completion_token_ids is not None


class Continuations:
    """Per-rollout memory of answered chat calls, and the token-in path for the calls that continue them.

    Args:
        max_rollouts: rollouts remembered (LRU).
        turns_per_rollout: calls remembered per rollout.
        stored: reads a rollout's recorded spans from the trace store (``None``: memory only).
        max_ids: token ids held at most, all rollouts together (LRU rollouts forgotten past it).
    """

    def __init__(
        self,
        max_rollouts: int = MAX_ROLLOUTS,
        turns_per_rollout: int = TURNS_PER_ROLLOUT,
        stored: Callable[[str], Sequence[Span]] | None = None,
        max_ids: int = MAX_IDS,
    ) -> None:
        self._turns: OrderedDict[str, list[_Turn]] = OrderedDict()
        self._max, self._per, self._max_ids = max_rollouts, turns_per_rollout, max_ids
        self._ids: dict[str, int] = {}  # rollout id → token ids its remembered calls hold
        self._held = 0  # sum of self._ids
        self._stored = stored
        # rollouts whose store read found no call to continue (not read again while remembered here)
        self._read_empty: OrderedDict[str, None] = OrderedDict()
        self._closings: dict[str, list[int]] = {}  # engine root URL → its template's closing after a turn
        self._breaks: weakref.WeakKeyDictionary[CallContext, str] = weakref.WeakKeyDictionary()

    def __len__(self) -> int:
        return len(self._turns)

    def wants(self, ctx: CallContext) -> bool:
        """Whether ``ctx`` may take this module's path: its rollout has a remembered call, or it is a guided
        call of a rollout (a dictionary lookup and a few key reads: the hot path's only cost)."""
        if ctx.rollout_id is None:
            return False
        return ctx.rollout_id in self._turns or is_guided(ctx.body) or self._may_read(ctx)

    def _may_read(self, ctx: CallContext) -> bool:
        """Whether the store may hold calls ``ctx`` continues: a chat call with an assistant message, of a
        rollout not read in vain before."""
        if self._stored is None or ctx.endpoint != "chat" or ctx.rollout_id in self._read_empty:
            return False
        messages = ctx.body.get("messages")
        return isinstance(messages, list) and any(
            isinstance(m, dict) and m.get("role") == "assistant" for m in messages
        )

    async def _read(self, rollout_id: str) -> list[_Turn] | None:
        """The rollout's last :data:`TURNS_PER_ROLLOUT` continuable chat calls as the trace store holds them,
        read in a worker thread, now remembered in place of what this process held; ``None`` when there is
        none (or the store failed: logged, the call takes the ordinary path)."""
        assert self._stored is not None
        try:
            spans = await anyio.to_thread.run_sync(self._stored, rollout_id)
        except Exception as exc:  # noqa: BLE001 - a store outage must not fail the call: render it anew
            logger.warning(
                "could not read rollout %s's calls to continue its conversation: %s", rollout_id, exc
            )
            return None
        turns = [
            _Turn(s.llm.request, s.llm)
            for s in spans
            if s.llm is not None
            and s.status == "ok"
            and s.llm.endpoint == "chat"
            and _continuable(s.llm)
            and isinstance(s.llm.request, dict)
        ][-self._per :]
        if not turns:
            self._read_empty[rollout_id] = None
            if len(self._read_empty) > self._max:
                self._read_empty.popitem(last=False)
            return None
        self._keep(rollout_id, turns)
        return turns

    def _keep(self, rollout_id: str, turns: list[_Turn]) -> None:
        """Remember ``turns`` as the rollout's (most recently used), then forget least recently used rollouts
        while more than ``max_rollouts`` are remembered or their calls hold more than ``max_ids`` token ids
        (never the rollout just kept)."""
        self._turns[rollout_id] = turns
        self._turns.move_to_end(rollout_id)
        size = sum(len(t.llm.prompt_token_ids or ()) + len(t.llm.completion_token_ids or ()) for t in turns)
        self._held += size - self._ids.get(rollout_id, 0)
        self._ids[rollout_id] = size
        while len(self._turns) > 1 and (len(self._turns) > self._max or self._held > self._max_ids):
            gone, _ = self._turns.popitem(last=False)
            self._held -= self._ids.pop(gone, 0)

    # --- memory (called by the recorder for every recorded call) ---------------------------------
    def remember(self, ctx: CallContext, llm: LLMCall) -> None:
        """Keep ``llm`` as a call later calls of its rollout may continue; add a break flag found earlier.

        Args:
            ctx: the call's context (its rollout id, endpoint and body).
            llm: the call as it is about to be recorded (``flags`` may be extended here).
        """
        if self._breaks:
            why = self._breaks.pop(ctx, None)
            if why is not None:
                llm.flags.append(BREAK_PREFIX + why)
        rollout_id = ctx.rollout_id
        if rollout_id is None or ctx.endpoint != "chat" or not _continuable(llm):
            return
        self._read_empty.pop(rollout_id, None)
        turns = self._turns.get(rollout_id) or []
        turns.append(_Turn(ctx.body, llm))
        del turns[: -self._per]
        self._keep(rollout_id, turns)

    def _match(self, body: dict[str, Any], turns: list[_Turn]) -> _Turn | None:
        messages = body.get("messages") or []
        for turn in reversed(turns):
            before = turn.request.get("messages") or []
            k = len(before)
            if len(messages) <= k + 1 or any(body.get(key) != turn.request.get(key) for key in _RENDER_KEYS):
                continue
            if _message_key(messages[k]) != _answer_key(turn.llm):
                continue
            if all(_message_key(a) == _message_key(b) for a, b in zip(messages[:k], before, strict=True)):
                return turn
        return None

    @staticmethod
    def _behind(body: dict[str, Any], turn: _Turn) -> bool:
        """Whether ``body``, which continues ``turn``, holds another assistant message after that call's answer:
        a later call of the rollout this process did not answer (another replica did)."""
        messages = body.get("messages") or []
        after = messages[len(turn.request.get("messages") or []) + 1 :]
        return any(isinstance(m, dict) and m.get("role") == "assistant" for m in after)

    def _break(self, ctx: CallContext, why: str) -> None:
        self._breaks[ctx] = why

    # --- the token-in path ----------------------------------------------------------------------
    async def forward(
        self, gateway: CallHost, ctx: CallContext, upstream: Upstream, release: Callable[[], None]
    ) -> Response | None:
        """Answer ``ctx`` with a token-id prompt when it continues a remembered call of its rollout; answer a
        guided call and record it with the policy's own logprobs (:mod:`agentforge.gateway.guided`).

        Args:
            gateway: the gateway (its upstream client and recorder).
            ctx: the call (one :meth:`wants`).
            upstream: the engine serving the resolved version (continuations: ``token_in`` engines only).
            release: releases the version's in-flight count (called once the engine answered).

        Returns:
            The client's response, or ``None`` to take the ordinary path (a break's reason is flagged on its
            span).
        """
        if ctx.endpoint != "chat" or not upstream.token_ids:
            return None
        rollout_id = ctx.rollout_id or ""
        turns = self._turns.get(rollout_id)
        read = False
        if turns is None and upstream.token_in and self._may_read(ctx):
            # a rollout another replica served, or this process served before it restarted
            turns, read = await self._read(rollout_id), True
        if turns and upstream.token_in:
            turn = self._match(ctx.body, turns)
            if not read and turn is not None and self._behind(ctx.body, turn) and self._may_read(ctx):
                fresher = await self._read(rollout_id)  # calls of it another replica answered since
                if fresher:
                    turn = self._match(ctx.body, fresher)
            continued = await self._continue(gateway, ctx, upstream, turn, release)
            if not isinstance(continued, str):
                return continued
            self._break(ctx, continued)
        if upstream.token_in and is_guided(ctx.body):  # engines serving started (prompt_logprobs)
            return await self._guided(gateway, ctx, upstream, release)
        return None

    async def _continue(
        self,
        gateway: CallHost,
        ctx: CallContext,
        upstream: Upstream,
        turn: _Turn | None,
        release: Callable[[], None],
    ) -> Response | str:
        """The continued call's response, or why it cannot continue (a :data:`BREAK_REASONS` key); ``turn``
        is the remembered call the request extends (``None``: none)."""
        if _unsupported(ctx.body):
            return "option"
        if turn is None:
            return "history"
        try:
            built = await self._prompt(gateway, ctx, upstream, turn)
        except asyncio.CancelledError:  # the client left while its prompt was rendered: record it
            await gateway.record(
                ctx,
                gateway.failed_call(ctx, flags=["client_disconnected", CONTINUED]),
                error="client disconnected before the engine answered",
                client_disconnected=True,
            )
            raise
        except (UpstreamTimeout, UpstreamUnreachable, ValueError, KeyError, TypeError) as exc:
            logger.warning("could not render a continuation on %s: %s", upstream.base_url, exc)
            built = None
        if built is None or isinstance(built, str):
            return built or "render"
        ids, max_model_len = built
        return await self._generate(gateway, ctx, upstream, ids, max_model_len, release)

    async def _tokenize(
        self,
        gateway: CallHost,
        upstream: Upstream,
        messages: list[Any],
        tools: Any,
        generation: bool,
        **kw: Any,
    ) -> dict[str, Any] | None:
        body: dict[str, Any] = {
            "model": upstream.model,
            "messages": messages,
            "add_generation_prompt": generation,
        }
        if tools:
            body["tools"] = tools
        body.update({k: v for k, v in kw.items() if v is not None})
        response = await gateway.client.post(
            upstream.base_url.rstrip("/").removesuffix("/v1") + "/tokenize",
            encode_json(body),
            engine_headers(upstream),
            False,
        )
        if response.status_code >= 400:
            logger.warning(
                "the engine's /tokenize answered HTTP %d: %s", response.status_code, response.content
            )
            return None
        data = decode_json(response.content or b"")
        return data if isinstance(data, dict) and isinstance(data.get("tokens"), list) else None

    async def _closing(self, gateway: CallHost, upstream: Upstream) -> list[int] | None:
        root = upstream.base_url
        if root not in self._closings:
            probes = await asyncio.gather(
                *(
                    self._tokenize(
                        gateway,
                        upstream,
                        [{"role": "user", "content": "x"}, {"role": "assistant", "content": p}],
                        None,
                        False,
                    )
                    for p in _PROBES
                )
            )
            if any(p is None for p in probes):
                return None
            self._closings[root] = _common_tail(probes[0]["tokens"], probes[1]["tokens"])  # type: ignore[index]
        return self._closings[root]

    async def _prompt(
        self, gateway: CallHost, ctx: CallContext, upstream: Upstream, turn: _Turn
    ) -> tuple[list[int], int] | str | None:
        """``(ids, max_model_len)`` of the continued prompt, a break reason, or ``None`` (render failed)."""
        messages, tools = ctx.body["messages"], ctx.body.get("tools")
        kwargs = ctx.body.get("chat_template_kwargs")
        k = len(turn.request.get("messages") or []) + 1
        new, history, closing = await asyncio.gather(
            self._tokenize(gateway, upstream, messages, tools, True, chat_template_kwargs=kwargs),
            self._tokenize(gateway, upstream, messages[:k], tools, False, chat_template_kwargs=kwargs),
            self._closing(gateway, upstream),
        )
        if new is None or history is None or closing is None:
            return None
        full, head = new["tokens"], history["tokens"]
        if not closing or full[: len(head)] != head or head[-len(closing) :] != closing:
            return "template"
        previous = turn.llm.prompt_token_ids or []
        completion = turn.llm.completion_token_ids or []
        ids = [*previous, *completion, *_glue(completion, closing), *full[len(head) :]]
        return ids, int(new.get("max_model_len") or 0)

    async def _generate(
        self,
        gateway: CallHost,
        ctx: CallContext,
        upstream: Upstream,
        ids: list[int],
        max_model_len: int,
        release: Callable[[], None],
    ) -> Response:
        body = ctx.body
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if limit is None and max_model_len:
            limit = max(1, max_model_len - len(ids))
        request: dict[str, Any] = {k: body[k] for k in _SAMPLING if k in body}
        request.update(model=body.get("model"), prompt=ids, max_tokens=limit)
        if body.get("logprobs") and body.get("top_logprobs"):
            request["logprobs"] = int(body["top_logprobs"])
        data = await engine_call(gateway, ctx, upstream, "completions", request, release, CONTINUED)
        if isinstance(data, Response):
            return data
        try:
            answer = chat_answer(data, body)
        except (KeyError, TypeError, IndexError) as exc:
            msg = f"upstream answered a token-id prompt with a body the gateway cannot read: {exc!r}"
            code = "bad_upstream_response"
            return await gateway.fail(ctx, 502, error_body(msg, "upstream_error", code), code)

        def check(llm: LLMCall) -> None:
            if llm.prompt_token_ids != ids:
                llm.flags.append("prompt_ids_differ_from_sent")

        return await answer_client(gateway, ctx, answer, [CONTINUED], check)

    async def _guided(
        self, gateway: CallHost, ctx: CallContext, upstream: Upstream, release: Callable[[], None]
    ) -> Response:
        """A guided chat call: answered as the engine answers it, recorded with the policy's own logprobs and
        the masked ones in ``attributes["guided_logprobs"]`` (:func:`~.guided.recompute_logprobs`)."""
        data = await engine_call(gateway, ctx, upstream, "chat", ctx.body, release, GUIDED_RECOMPUTED)
        if isinstance(data, Response):
            return data
        return await answer_client(
            gateway,
            ctx,
            data,
            [],
            lambda llm: recompute_logprobs(gateway.client, upstream, llm, gateway.cache_salt(ctx)),
        )
