"""Streamed tool-call deltas in the shape OpenAI's clients accumulate, whatever the engine sent.

OpenAI's stream format gives each tool call, by ``index``, one opening fragment with ``id``, ``type`` and
``function.name``, then fragments of ``function.arguments`` only; clients (the OpenAI SDK's
``ChatCompletionStreamState``, LangChain) concatenate every string they get per index. Engines other
than vLLM bend this: some send the ``id`` only on a call's last fragment, some repeat the ``id`` (or the
name, or the type) on every fragment — which a client concatenates into ``call_1call_1`` — and some put
a call's opening next to another call's last fragment in one chunk (which is legal and passed as is).

:class:`ToolCallDeltas` rewrites choice 0's tool-call deltas in place, before the gateway records or
forwards a chunk, so the client and the span see the same stream and accumulate the same calls:

* a call's fragments are held back until its ``id`` arrives, then sent as one opening fragment (``id``,
  ``type``, name and the arguments so far); a call still without an id when the choice finishes gets one
  (``call_`` + 24 hex digits) — flags ``tool_call_id_late`` / ``tool_call_id_assigned``;
* a repeated ``id``, ``type`` or whole ``name`` after the opening is dropped — flag
  ``tool_call_delta_repeated``;
* a fragment without ``index`` continues the last call (or opens a new one when it brings a new id) —
  flag ``tool_call_index_missing``.

The flags land on the span (``LLMCall.flags``), so a repaired stream is visible where it is stored.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCallDeltas"]


@dataclass
class _Call:
    """What the client has been sent for one call index, and what is held back."""

    id_sent: bool = False
    name: str = ""
    held_name: str = ""
    held_arguments: str = ""
    held_type: str | None = None


@dataclass
class ToolCallDeltas:
    """Per-stream repair state (see the module docstring).

    Attributes:
        repairs: the flags of the repairs made so far, in the order first made.
    """

    repairs: list[str] = field(default_factory=list)
    _calls: dict[int, _Call] = field(default_factory=dict)
    _ids: dict[str, int] = field(default_factory=dict)
    _last: int = -1

    def _flag(self, name: str) -> None:
        if name not in self.repairs:
            self.repairs.append(name)

    def repair(self, chunk: dict[str, Any]) -> None:
        """Rewrite choice 0's ``delta.tool_calls`` of one decoded chat chunk in place.

        Args:
            chunk: a decoded ``data:`` payload; other choices and other fields are left alone. When choice 0
                carries ``finish_reason``, every call still held is sent in this chunk.
        """
        choice = _choice0(chunk)
        if choice is None:
            return
        delta = choice.get("delta")
        if choice.get("finish_reason") is None and not (isinstance(delta, dict) and "tool_calls" in delta):
            return  # a text token's chunk (nearly all of them): nothing to repair
        entries = delta.get("tool_calls") if isinstance(delta, dict) else None
        out: list[dict[str, Any]] = []
        if isinstance(entries, list):
            for entry in entries:
                if isinstance(entry, dict):
                    sent = self._entry(entry)
                    if sent is not None:
                        out.append(sent)
        if choice.get("finish_reason") is not None:
            out.extend(self._flush())
        if out:
            if not isinstance(delta, dict):
                delta = choice["delta"] = {}
            delta["tool_calls"] = out
        elif isinstance(delta, dict) and "tool_calls" in delta:
            del delta["tool_calls"]

    def _index(self, entry: dict[str, Any]) -> int:
        index = entry.get("index")
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return index
        self._flag("tool_call_index_missing")
        call_id = entry.get("id")
        if isinstance(call_id, str) and call_id:
            known = self._ids.get(call_id)
            if known is not None:
                return known
            if self._last < 0 or self._calls[self._last].id_sent:
                return max(self._calls, default=-1) + 1
        return max(self._last, 0)

    def _entry(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        index = self._index(entry)
        self._last = index
        call = self._calls.setdefault(index, _Call())
        function = found if isinstance(found := entry.get("function"), dict) else {}
        name = found if isinstance(found := function.get("name"), str) else ""
        arguments = found if isinstance(found := function.get("arguments"), str) else ""
        call_id = entry.get("id") if isinstance(entry.get("id"), str) and entry.get("id") else None
        type_ = entry.get("type") if isinstance(entry.get("type"), str) else None
        if call.id_sent:  # after the opening fragment: argument fragments (and a name still streaming)
            fn: dict[str, Any] = {}
            if call_id is not None or type_ is not None or (name and name == call.name):
                self._flag("tool_call_delta_repeated")  # a client would concatenate the repeat
            elif name:
                call.name += name
                fn["name"] = name
            if arguments:
                fn["arguments"] = arguments
            return {"index": index, "function": fn} if fn else None
        call.held_name = call.held_name if name and name == call.held_name else call.held_name + name
        call.held_arguments += arguments
        call.held_type = call.held_type or type_
        if call_id is None:
            self._flag("tool_call_id_late")
            return None
        return self._open(index, call, call_id)

    def _open(self, index: int, call: _Call, call_id: str) -> dict[str, Any]:
        call.id_sent, call.name = True, call.held_name
        self._ids[call_id] = index
        opening = {
            "index": index,
            "id": call_id,
            "type": call.held_type or "function",
            "function": {"name": call.held_name, "arguments": call.held_arguments},
        }
        call.held_name, call.held_arguments = "", ""
        return opening

    def _flush(self) -> list[dict[str, Any]]:
        out = []
        for index, call in sorted(self._calls.items()):
            if not call.id_sent:
                self._flag("tool_call_id_assigned")
                out.append(self._open(index, call, f"call_{uuid.uuid4().hex[:24]}"))
        return out


def _choice0(chunk: dict[str, Any]) -> dict[str, Any] | None:
    for choice in chunk.get("choices") or []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None
