"""The store API's batch wire format, shared by the server (:mod:`agentforge.stores.server`) and its client
(:mod:`agentforge.stores.http`), which never imports the server.

``POST /api/batch`` carries :class:`BatchRequest` and answers :class:`BatchResults`, one result per item in
order. With ``ack="patch"`` (what :class:`~agentforge.stores.http.HTTPStore` sends) a stored item comes back
as the few fields the store set on it (sequence number, rollout and attempt stamps, quarantine attributes)
rather than the whole span: the client applies them to the item it sent, and neither side serialises or
validates the token ids and the request a second time. Both directions are encoded by pydantic-core (:func:`json_bytes`) and parsed with
``model_validate_json``, several times faster than ``json`` plus per-item validation; text that UTF-8
cannot carry (lone surrogates) falls back to ASCII-escaped JSON, which parses the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticSerializationError, to_json

from agentforge.bodylimit import API_MAX_BODY_BYTES
from agentforge.stores.tables import fast_json
from agentforge.types import Reward, Span

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = [
    "NEXT_AFTER_SEQUENCE",
    "SPAN_PAGE",
    "ROLLOUT_PAGE",
    "NEXT_AFTER_ROLLOUT",
    "REWARD_PAGE",
    "RESOURCE_PAGE",
    "NEXT_AFTER_RESOURCE",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "BATCH_BYTES",
    "PATCH_FIELDS",
    "BatchItem",
    "BatchRequest",
    "BatchResult",
    "BatchResults",
    "patch_of",
    "json_bytes",
    "parse",
    "Encoded",
    "encode_item",
    "batch_body",
    "write_accepted",
]

#: Most spans one ``GET /api/spans`` answers when it lists beyond one rollout (issue 36: listings are bounded).
SPAN_PAGE = 1000
#: Response header of a full span page: the ``after_sequence`` of the next page.
NEXT_AFTER_SEQUENCE = "X-Next-After-Sequence"
#: Most rollouts one ``GET /api/rollouts`` answers.
ROLLOUT_PAGE = 1000
#: Response header of a full rollout page: the ``after`` (last rollout id) of the next page.
NEXT_AFTER_ROLLOUT = "X-Next-After-Rollout"
#: Most rewards one ``GET /api/rollouts/{id}/rewards`` answers (a full page names the next in
#: :data:`NEXT_AFTER_SEQUENCE`).
REWARD_PAGE = 1000
#: Most resource versions one ``GET /api/resources`` answers.
RESOURCE_PAGE = 1000
#: Response header of a full resource page: the next page's ``after``, ``[name, version]`` as ASCII JSON.
NEXT_AFTER_RESOURCE = "X-Next-After-Resource"

M = TypeVar("M", bound=BaseModel)
E = TypeVar("E")

#: Most items one ``POST /api/batch`` may carry.
MAX_BATCH = 4096

#: The largest request body the store API takes (bytes; :class:`agentforge.bodylimit.BodyLimit` answers a
#: larger one 413).
MAX_BODY_BYTES = API_MAX_BODY_BYTES

#: About how many bytes :class:`~agentforge.stores.http.HTTPStore` puts in one ``POST /api/batch``.
BATCH_BYTES = 4 * 1024 * 1024


class BatchItem(BaseModel):
    """One entry of ``POST /api/batch``: exactly one of ``span`` or ``reward``."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    span: Span | None = None
    reward: Reward | None = None


#: The fields a ``patch`` acknowledgement may carry: plain JSON values, set on the sent item as they are.
PATCH_FIELDS = frozenset({"sequence", "rollout_id", "attempt_id", "span_id", "attributes", "value", "valid"})


class BatchRequest(BaseModel):
    """The body of ``POST /api/batch``: at most :data:`MAX_BATCH` items, written in order; ``ack`` says how
    stored items come back (``"full"``: the whole item; ``"patch"``: only what the store changed)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")

    items: list[BatchItem] = Field(max_length=MAX_BATCH)
    ack: Literal["full", "patch"] = "full"


class BatchResult(BaseModel):
    """One item's outcome: the stored ``span`` or ``reward`` (or, with ``ack="patch"``, the ``patch`` of
    :data:`PATCH_FIELDS` to apply to the item sent), or the ``error`` class name and ``message`` of a store
    error that item alone failed with."""

    span: Span | None = None
    reward: Reward | None = None
    patch: dict[str, Any] | None = None
    error: str | None = None
    message: str | None = None


class BatchResults(BaseModel):
    """The answer of ``POST /api/batch``."""

    results: list[BatchResult]


def patch_of(sent: Span | Reward, stored: Span | Reward) -> dict[str, Any] | None:
    """The fields of ``stored`` that differ from ``sent``, when all are :data:`PATCH_FIELDS`; ``None`` when
    another field differs (e.g. an id that was already stored with other content: send it whole)."""
    if type(sent) is not type(stored):
        return None
    patch: dict[str, Any] = {}
    for name in type(stored).model_fields:
        value, before = getattr(stored, name), getattr(sent, name)
        if value is before or value == before or (_nan(value) and _nan(before)):
            continue
        if name not in PATCH_FIELDS:
            return None
        patch[name] = value
    return patch


def _nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


def json_bytes(value: Any) -> bytes:
    """Compact JSON of ``value`` (models included), ``NaN``/``Infinity`` kept; ASCII-escaped JSON when the
    value holds text UTF-8 cannot carry. A batch of spans goes straight through pydantic-core's serializer
    (spans and LLM calls keep ``NaN`` themselves, see :class:`~agentforge.types.Span`): four times faster
    than dumping it to dicts first."""
    if isinstance(value, BatchRequest) and all(item.reward is None for item in value.items):
        try:
            return to_json(value)
        except (PydanticSerializationError, UnicodeError):
            pass
    return fast_json(value.model_dump() if isinstance(value, BaseModel) else value)


def parse(model: type[M], data: bytes) -> M:
    """``model`` from JSON bytes: pydantic-core's parser, or Python's ``json`` for what only it reads
    (``\\ud800``-style escapes of lone surrogates, as :func:`json_bytes` writes them).

    Raises:
        pydantic.ValidationError: the JSON does not fit ``model``.
        ValueError: not JSON.
    """
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        if not any(e["type"] == "json_invalid" for e in exc.errors()):
            raise
    try:
        return model.model_validate(json.loads(data))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


class Encoded(NamedTuple):
    """An item with its :data:`BatchItem` JSON made ahead of its request (:func:`encode_item`), e.g. in the
    thread of a caller of :meth:`~agentforge.stores.http.HTTPStore.submit_many`; ``keep``: whether its caller
    wants the stored copy (``False``: ``None`` once it is written)."""

    item: Span | Reward
    json: bytes
    keep: bool = True


def encode_item(item: Span | Reward) -> bytes:
    """One :class:`BatchItem`'s JSON: ``{"span": ...}`` or ``{"reward": ...}``, as :func:`json_bytes` writes
    it inside a whole request (a span through pydantic-core, ``NaN`` kept; ASCII-escaped JSON for text UTF-8
    cannot carry; a reward through :func:`fast_json`)."""
    if isinstance(item, Span):
        try:
            return b'{"span":' + Span.__pydantic_serializer__.to_json(item) + b"}"
        except (PydanticSerializationError, UnicodeError):
            return b'{"span":' + fast_json(item.model_dump()) + b"}"
    return b'{"reward":' + fast_json(item.model_dump()) + b"}"


def batch_body(items: list[bytes], ack: Literal["full", "patch"] = "patch") -> bytes:
    """The body of ``POST /api/batch`` from items encoded by :func:`encode_item` (at most :data:`MAX_BATCH`)."""
    return b'{"items":[' + b",".join(items) + b'],"ack":"' + ack.encode("ascii") + b'"}'


def write_accepted(
    store: TraceStore, entries: Sequence[Span | Reward | E]
) -> list[Span | Reward | Exception | E]:
    """Write the spans and rewards among ``entries`` in one ``store.write_batch``; answer every entry, in order.

    The server's ``/api/batch`` and a tenant's view both refuse some items before writing (an item that did not
    validate, one naming another tenant's rollout): those fail alone and the others are written together.

    Args:
        store: the store to write to.
        entries: per item, the span or reward to write, or what refused it (an error, a message).

    Returns:
        Per entry: what the store returned for a written one (the stored item, or the error it rejected that
        item alone with); a refused entry itself.

    Raises:
        StoreError: the batch failed as a whole (``store.write_batch``).
    """
    accepted = [e for e in entries if isinstance(e, Span | Reward)]
    written = iter(store.write_batch(accepted) if accepted else [])
    return [next(written) if isinstance(e, Span | Reward) else e for e in entries]
