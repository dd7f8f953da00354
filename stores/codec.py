"""How the SQL trace store writes text and JSON (every backend alike), and the checks on scalar text and ids.

Every structured field (task input, attributes, the LLM call record, metadata, payloads) is a ``TEXT``
column holding JSON: ASCII-escaped by :func:`dumps`, or, on the span hot path (LLM call records and span
attributes), UTF-8 JSON by :func:`fast_dumps`, which escapes ``NUL`` and falls back to :func:`dumps` for
text UTF-8 cannot carry.

Text policy (the same on every backend):

* Structured fields round-trip byte-exact, whatever they hold: emoji, ZWJ sequences, CJK, curly
  quotes, ``NUL`` and even lone surrogates (``"\\ud800"``), because ``NUL`` and lone surrogates are
  stored as ``\\uXXXX`` escapes, which PostgreSQL ``TEXT`` accepts (it rejects raw ``NUL`` and is never handed unencodable
  text). Floats, including ``NaN`` and ``Infinity`` inside attributes, round-trip too.
* Ids (rollout, attempt, span, reward) must match :data:`ID_PATTERN` (:func:`ident`): at most 200
  characters that fit one URL path segment (no ``/``), so every stored object stays reachable over HTTP.
* Scalar text columns (names, ``agent``, ``worker_id``, ``error``, ...) must be encodable UTF-8
  without ``NUL``: a lone surrogate or ``NUL`` there raises :class:`~agentforge.errors.UserError`
  naming the field (put such text in ``attributes``/``metadata`` instead).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar, overload

import orjson
from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python

from agentforge.errors import UserError

M = TypeVar("M", bound=BaseModel)

__all__ = ["stamped", "dumps", "fast_json", "fast_dumps", "loads", "plain", "ident", "ID_PATTERN"]


def stamped(item: M, fields: dict[str, Any]) -> M:
    """A shallow copy of a stored item with the fields the store set (sequence number, rollout and attempt
    ids), without validating them again: what ``model_copy(update=...)`` builds (the same ``__dict__``,
    fields-set, extra and private slots pydantic's ``__copy__`` fills) at a fraction of its cost on the write
    path. ``fields`` must hold values of the fields' own types (the store's own stamps)."""
    cls = type(item)
    copied = cls.__new__(cls)
    values = item.__dict__.copy()
    values.update(fields)
    put = object.__setattr__
    put(copied, "__dict__", values)
    extra, private = item.__pydantic_extra__, item.__pydantic_private__
    put(copied, "__pydantic_extra__", None if extra is None else dict(extra))
    put(copied, "__pydantic_fields_set__", item.__pydantic_fields_set__ | fields.keys())
    put(copied, "__pydantic_private__", None if private is None else dict(private))
    return copied


def dumps(value: Any) -> str:
    """Serialise to ASCII-only JSON (non-ASCII, ``NUL`` and lone surrogates become ``\\uXXXX``)."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=to_jsonable_python)


def fast_json(value: Any) -> bytes:
    """Serialise plain data (dicts, lists, scalars: pass ``model.model_dump()``, since a model's own JSON
    writes ``NaN`` as ``null``) to compact JSON bytes (about 10× faster than :func:`dumps`): non-ASCII
    text stays UTF-8, ``NUL`` becomes ``\\u0000``, ``NaN``/``Infinity`` are kept as in :func:`dumps`.
    Values that UTF-8 cannot carry (lone surrogates) fall back to :func:`dumps` (ASCII). :func:`loads`
    reads both.

    orjson writes it when it can say the same thing: plain ``dict``/``list``/``str``/``int``/``float``/
    ``bool`` values whose output holds no ``null`` (orjson writes ``NaN`` and ``±Infinity`` as ``null``, so
    any ``null`` in its output, a real one or not, sends the value to pydantic-core, which keeps them).
    Anything orjson does not write natively (models, datetimes, sets, non-string keys, integers beyond
    64 bits) goes to pydantic-core as well, so the bytes never depend on which of the two wrote them
    beyond float and escape spelling that both read back alike.
    """
    try:
        out = orjson.dumps(value, default=_not_plain, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except (orjson.JSONEncodeError, TypeError):
        out = None
    if out is not None and b"null" not in out:
        return out
    try:
        return to_json(value, inf_nan_mode="constants")
    except (PydanticSerializationError, UnicodeError):
        return dumps(value).encode("ascii")


def _not_plain(value: Any) -> Any:
    """orjson's ``default``: refuse, so :func:`fast_json` hands the value to pydantic-core."""
    raise TypeError(type(value).__name__)


def fast_dumps(value: Any) -> str:
    """:func:`fast_json` as text, for a ``TEXT`` column."""
    return fast_json(value).decode("utf-8")


def loads(text: str | None) -> Any:
    """Inverse of :func:`dumps`; ``None`` (SQL ``NULL``) stays ``None``."""
    return None if text is None else json.loads(text)


@overload
def plain(field: str, value: str) -> str: ...


@overload
def plain(field: str, value: str | None) -> str | None: ...


def plain(field: str, value: str | None) -> str | None:
    """Check a value bound for a scalar text column (see the module's text policy).

    Raises:
        UserError: the value holds ``NUL`` or a lone surrogate.
    """
    if value is None:
        return None
    if "\x00" in value:
        raise UserError(
            f"{field} contains a NUL character, which SQL text columns cannot store; "
            "remove it or put the text in attributes/metadata (stored as escaped JSON)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(
            f"{field} contains a lone surrogate at position {exc.start}, which is not valid "
            "UTF-8; put such text in attributes/metadata (stored as escaped JSON)"
        ) from None
    return value


#: What a rollout, attempt, span or reward id may be: 1-200 ASCII letters, digits and ``. _ : @ ~ + = -``,
#: starting with a letter or digit, so it fits its column and one URL path segment of the store API.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@~+=-]{0,199}")


@overload
def ident(field: str, value: str) -> str: ...


@overload
def ident(field: str, value: str | None) -> str | None: ...


def ident(field: str, value: str | None) -> str | None:
    """Check an id bound for an id column against :data:`ID_PATTERN` (``None`` passes).

    Raises:
        UserError: naming the field, the id (shortened) and the rule.
    """
    if value is None or ID_PATTERN.fullmatch(value):
        return value
    raise UserError(
        f"{field} {value[:80]!r} is not a valid id: use 1-200 ASCII letters, digits or . _ : @ ~ + = - "
        "(starting with a letter or digit); '/', '?', '#', '%' and blanks cannot travel in a URL path"
    )
