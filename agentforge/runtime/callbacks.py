"""``ToolSpanCallback``: record LangChain/LangGraph tool calls as ``tool`` spans.

The gateway already records every LLM call; tools run inside the agent, so only the agent's framework
sees them. This LangChain callback handler writes one :class:`~agentforge.types.Span` of kind
``tool`` per tool run (``ToolNode`` calls and direct ``tool.invoke`` calls alike), with the tool's
input, output (or error), and timing.

It only observes: it returns nothing to LangChain, never raises into the graph (a failed store write is
logged), and touches neither the graph's state nor its checkpoints, so a graph runs and checkpoints
exactly as without it. Requires ``langchain-core`` (``pip install "agentforge[agents]"``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import TYPE_CHECKING, Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from agentforge.runtime.context import bound_tool_output
from agentforge.types import Span, SpanKind, now

if TYPE_CHECKING:
    from agentforge.ports import TraceStore
    from agentforge.runtime.context import RolloutContext

__all__ = ["ToolSpanCallback"]

logger = logging.getLogger("agentforge.runtime")


def _text(value: Any) -> str:
    """A tool input/output as text: a message's ``content``, a string, or JSON (``str`` as fallback)."""
    content = getattr(value, "content", value)
    if isinstance(content, str):
        return content
    try:
        return json.dumps(content, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(content)


class ToolSpanCallback(BaseCallbackHandler):
    """A LangChain callback handler that stores each tool run as a ``Span(kind="tool")``.

    Span fields: ``name`` = the tool's name; ``attributes`` = ``{"input": str, "output": str,
    "output_chars": int, "tool_call_id": str | None, "run_id": str, "parent_run_id": str | None}``;
    ``status="error"`` with ``error`` set when the tool raised. ``started_at``/``ended_at`` in seconds.

    Args:
        store: where spans go (in a runner: ``ctx.store``).
        rollout_id: the rollout the spans belong to.
        attempt_id: the attempt (recommended: keeps a dead attempt's spans apart).
        max_chars: store at most this many characters of each input/output, cut with
            :func:`~agentforge.runtime.context.bound_tool_output`'s marker; ``None`` stores them whole
            (``output_chars`` always holds the full length).
    """

    raise_error = False  # never break the graph because tracing failed
    run_inline = True  # record in the tool's own thread, in order

    def __init__(
        self, store: TraceStore, rollout_id: str, attempt_id: str | None = None, max_chars: int | None = None
    ) -> None:
        super().__init__()
        self.store, self.rollout_id, self.attempt_id, self.max_chars = (
            store,
            rollout_id,
            attempt_id,
            max_chars,
        )
        self._runs: dict[UUID, dict[str, Any]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_context(cls, ctx: RolloutContext, max_chars: int | None = None) -> ToolSpanCallback:
        """The handler for a runner's attempt: its store, rollout and attempt."""
        return cls(ctx.store, ctx.rollout_id, ctx.attempt_id, max_chars)

    # Only tool events matter; LangChain then skips this handler for everything else. (Not
    # ``ignore_agent``: LangChain files tool events under it.)
    @property
    def ignore_llm(self) -> bool:
        return True

    @property
    def ignore_chain(self) -> bool:
        return True

    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_chat_model(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    def _bound(self, text: str) -> str:
        return text if self.max_chars is None else bound_tool_output(text, self.max_chars)

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Remember the tool's name, input and start time until it ends."""
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        text = input_str if inputs is None else _text(inputs)
        with self._lock:
            self._runs[run_id] = {
                "name": str(name),
                "input": text,
                "started_at": now(),
                "parent_run_id": parent_run_id,
                "tool_call_id": kwargs.get("tool_call_id"),
            }

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Store the span of a tool that returned."""
        self._finish(run_id, output=output)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Store the span of a tool that raised (``status="error"``)."""
        self._finish(run_id, error=error)

    def _finish(self, run_id: UUID, output: Any = None, error: BaseException | None = None) -> None:
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is None:
            return
        out = "" if error is not None else _text(output)
        call_id = getattr(output, "tool_call_id", None) or run["tool_call_id"]
        span = Span(
            rollout_id=self.rollout_id,
            attempt_id=self.attempt_id,
            kind=SpanKind.tool,
            name=run["name"],
            status="error" if error is not None else "ok",
            error=None if error is None else f"{type(error).__name__}: {error}",
            attributes={
                "input": self._bound(run["input"]),
                "output": self._bound(out),
                "output_chars": len(out),
                "tool_call_id": call_id,
                "run_id": str(run_id),
                "parent_run_id": None if run["parent_run_id"] is None else str(run["parent_run_id"]),
            },
            started_at=run["started_at"],
            ended_at=now(),
        )
        try:
            self.store.add_span(span)
        except Exception:  # noqa: BLE001 - observing must never change the graph's behaviour
            logger.exception("ToolSpanCallback could not store the span of tool %r", run["name"])
