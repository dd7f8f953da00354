"""Fakes for testing agents and graphs without a real LLM: a scripted OpenAI-compatible engine and an
in-memory trace store.

:class:`ScriptedUpstream` answers ``/v1/chat/completions`` and ``/v1/completions`` from a script of
:class:`ScriptedTurn` s, in order, the way vLLM does: with ``return_token_ids: true`` it returns
``prompt_token_ids`` and per-choice ``token_ids``; with ``logprobs`` it returns one logprob per token;
``stream: true`` produces vLLM-shaped chunks (each carrying its ``token_ids``) and, with
``stream_options.include_usage``, a final usage chunk. A turn can also omit token ids (a hosted API),
swallow ids in tool-call chunks (what a tool-call parser does in vLLM), fail with an error, or be slow.
Run it in-process through :meth:`ScriptedUpstream.transport` or on a port with
:meth:`ScriptedUpstream.serve`::

    upstream = ScriptedUpstream([ScriptedTurn("Hello!"), ScriptedTurn(tool_calls=[ScriptedToolCall("now")])])
    store = memory_store()
    app = create_gateway(store, upstream.router(), transport=upstream.transport())

Fake token ids: unless a turn gives its own, text is "tokenised" by :func:`fake_token_ids` (one id per
4-character piece, deterministic). A chat prompt is one role marker id per message followed by the fake
ids of its content (and of its tool calls), so prompts of later turns start with those of earlier ones.

Modules: :mod:`~agentforge.testing.script` (the turns and fake ids), :mod:`~agentforge.testing.upstream`
(the fake engine), :mod:`~agentforge.testing.answer` (vLLM's JSON and SSE answer shapes). Import the
names from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentforge.testing.script import (
    ScriptedError,
    ScriptedRequest,
    ScriptedToolCall,
    ScriptedTurn,
    fake_token_ids,
)
from agentforge.testing.upstream import ScriptedUpstream

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = [
    "fake_token_ids",
    "ScriptedToolCall",
    "ScriptedError",
    "ScriptedTurn",
    "ScriptedRequest",
    "ScriptedUpstream",
    "memory_store",
]


def memory_store() -> TraceStore:
    """A fresh in-memory trace store: ``open_store("sqlite://")`` (a ``SQLStore``)."""
    from agentforge.open import open_store

    return open_store("sqlite://")
