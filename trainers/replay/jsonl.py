"""Move stored traces between stores as JSON Lines: one rollout per line, format ``agentforge.trace/1``.

Each line is one JSON object (keys in this order)::

    {"format": "agentforge.trace/1", "rollout": {...}, "attempts": [...], "spans": [...], "rewards": [...]}

``rollout``, ``attempts``, ``spans`` and ``rewards`` are the fields of
:class:`~agentforge.types.Rollout`, :class:`~agentforge.types.Attempt`, :class:`~agentforge.types.Span`
and :class:`~agentforge.types.Reward`. A line holds **all** of the rollout's attempts, spans and rewards
(also those of abandoned attempts: ``valid_only`` is recomputed from the attempts after import).
``sequence`` is renumbered ``0, 1, ...`` across the rollout's spans and rewards in store order, because
store sequence numbers are store-wide; on import the store assigns its own numbers in that order.
Orphan spans (no rollout) belong to no line and are not exported.

Encoding: ASCII-only JSON (every non-ASCII character, ``NUL`` and lone surrogate as ``\\uXXXX``),
floats as Python's shortest round-trip ``repr`` (token logprobs, rewards and timestamps come back
bit-exact), no whitespace between tokens, ``\\n`` after every line. ``NaN``/``Infinity`` inside
attributes or metadata are written as Python's ``json`` writes them (bare ``NaN``), which is not strict
JSON but reads back here. Export → import into an empty store → export gives a byte-identical file.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from agentforge.errors import AgentForgeError, StoreError, UserError
from agentforge.ports import TraceStore
from agentforge.privacy.ledger import record_export
from agentforge.trainers.replay.output import ExportReport, atomic_path, progress_bar
from agentforge.trainers.replay.select import EmptySelectionError, Selection, TraceFilter, select_traces
from agentforge.trainers.replay.trust import (
    DEFAULT_MAX_ABS_REWARD,
    MAX_DEPTH,
    depth_exceeds,
    inconsistency,
    untrusted_content,
)
from agentforge.types import Attempt, Reward, Rollout, Span

__all__ = [
    "FORMAT",
    "ExportReport",
    "ImportReport",
    "LineProblem",
    "ParsedTrace",
    "TraceFormatError",
    "export_jsonl",
    "import_jsonl",
    "parse_trace_line",
    "trace_line",
]

#: The format tag of every line.
FORMAT = "agentforge.trace/1"
_FIELDS = ("format", "rollout", "attempts", "spans", "rewards")


# --- writing --------------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=to_jsonable_python)


def trace_line(
    rollout: Rollout, attempts: Sequence[Attempt], spans: Sequence[Span], rewards: Sequence[Reward]
) -> bytes:
    """Encode one rollout as one line of the format (see the module docstring), ``\\n`` included.

    Args:
        rollout, attempts, spans, rewards: as stored; spans and rewards ordered by their store
            ``sequence`` (``None`` counts as after every number, in the order given).

    Returns:
        ASCII bytes ending in ``\\n``.
    """
    items: list[Span | Reward] = [*spans, *rewards]
    order = sorted(
        range(len(items)),
        key=lambda i: (items[i].sequence is None, items[i].sequence or 0, i),
    )
    rank = {i: n for n, i in enumerate(order)}
    obj = {
        "format": FORMAT,
        "rollout": rollout.model_dump(),
        "attempts": [a.model_dump() for a in attempts],
        "spans": [{**s.model_dump(), "sequence": rank[i]} for i, s in enumerate(spans)],
        "rewards": [{**r.model_dump(), "sequence": rank[len(spans) + i]} for i, r in enumerate(rewards)],
    }
    return (_dumps(obj) + "\n").encode("ascii")


def export_jsonl(
    store: TraceStore,
    path: str | os.PathLike[str],
    flt: TraceFilter = TraceFilter(),
    *,
    selection: Selection | None = None,
    progress: bool | None = None,
) -> ExportReport:
    """Write the traces ``flt`` selects to ``path`` as JSON Lines, all or nothing.

    The file is written to a temporary file in the same directory, flushed to disk and renamed onto
    ``path`` at the end; on any error ``path`` is left absent or unchanged.

    Args:
        store: the store to read.
        path: the ``.jsonl`` file to (over)write; its directory must exist.
        flt: which rollouts (ignored when ``selection`` is given).
        selection: an existing selection of ``store`` to write instead of selecting again.
        progress: show a progress bar on stderr; ``None`` shows it when stderr is a TTY.

    Returns:
        What was written: records, bytes and the selection's skip counts.

    Raises:
        EmptySelectionError: nothing matches (no file is created).
        UserError: the directory does not exist.
    """
    selection = selection if selection is not None else select_traces(store, flt)
    if not selection.records:
        raise EmptySelectionError(selection)
    target = Path(path)
    size = 0
    with atomic_path(target) as tmp, open(tmp, "wb") as f:
        with progress_bar(len(selection.records), f"export {target.name}", progress) as advance:
            for rec in selection.records:
                rid = rec.rollout_id
                line = trace_line(
                    rec.rollout,
                    store.list_attempts(rid),
                    store.list_spans(rollout_id=rid),
                    store.list_rewards(rid),
                )
                f.write(line)
                size += len(line)
                advance(1)
        f.flush()
        os.fsync(f.fileno())
    record_export(store, target, "jsonl", (rec.rollout_id for rec in selection.records))
    n = len(selection.records)
    return ExportReport(target, n, n, selection.considered, Counter(selection.skipped), size)


# --- reading --------------------------------------------------------------------------------------


class TraceFormatError(UserError):
    """A line of a trace file cannot be imported.

    Attributes:
        line: 1-based line number (0 when not known).
        reason: short category: ``"not utf-8"``, ``"invalid json"``, ``"too deeply nested"``,
            ``"wrong format"``, ``"missing fields"``, ``"invalid record"``, ``"inconsistent record"``,
            ``"unfinished rollout"``, ``"bad token ids"``, ``"bad reward"``, ``"duplicate"``.
    """

    def __init__(self, reason: str, detail: str, line: int = 0) -> None:
        self.reason, self.detail, self.line = reason, detail, line
        super().__init__(f"line {line}: {reason}: {detail}" if line else f"{reason}: {detail}")


@dataclass
class ParsedTrace:
    """One valid line: the rollout, its attempts, and its spans and rewards in original order."""

    rollout: Rollout
    attempts: list[Attempt]
    items: list[Span | Reward]


def _short(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{exc.title}.{loc}: {err['msg']}{more}"


def parse_trace_line(
    raw: bytes,
    line: int = 0,
    *,
    vocab_size: int | None = None,
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
) -> ParsedTrace | None:
    """Decode and validate one line of the format, then check it holds only what may be imported
    (finished data, token ids in range, finite rewards, bounded nesting: :mod:`~agentforge.trainers.replay.trust`).

    Args:
        raw: the line's bytes (trailing ``\\n`` optional).
        line: its 1-based number, for messages.
        vocab_size: token ids must be below it (``None``: only non-negative is checked).
        max_abs_reward: the largest ``|reward|`` accepted.

    Returns:
        The parsed trace, or ``None`` for a blank line.

    Raises:
        TraceFormatError: the line is not UTF-8, not JSON, not this format, or not a consistent record.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceFormatError("not utf-8", f"invalid byte at offset {exc.start}", line) from None
    if not text.strip():
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceFormatError("invalid json", f"{exc.msg} at column {exc.colno}", line) from None
    except RecursionError:
        raise TraceFormatError(
            "too deeply nested", "the JSON nests deeper than Python can parse", line
        ) from None
    if depth_exceeds(obj):
        raise TraceFormatError("too deeply nested", f"the JSON nests deeper than {MAX_DEPTH} levels", line)
    if not isinstance(obj, dict):
        raise TraceFormatError("invalid json", f"expected an object, got {type(obj).__name__}", line)
    missing = [k for k in _FIELDS if k not in obj]
    if "format" not in missing and obj["format"] != FORMAT:
        raise TraceFormatError("wrong format", f"format {obj['format']!r}, expected {FORMAT!r}", line)
    if missing:
        raise TraceFormatError("missing fields", ", ".join(missing), line)
    for key in ("attempts", "spans", "rewards"):
        if not isinstance(obj[key], list):
            raise TraceFormatError("invalid record", f"{key} is not a list", line)
    try:
        rollout = Rollout.model_validate(obj["rollout"])
        attempts = [Attempt.model_validate(a) for a in obj["attempts"]]
        spans = [Span.model_validate(s) for s in obj["spans"]]
        rewards = [Reward.model_validate(r) for r in obj["rewards"]]
    except ValidationError as exc:
        raise TraceFormatError("invalid record", _short(exc), line) from None
    untrusted = untrusted_content(
        rollout, attempts, spans, rewards, vocab_size=vocab_size, max_abs_reward=max_abs_reward
    )
    if untrusted is not None:
        raise TraceFormatError(*untrusted, line)
    problem = inconsistency(rollout, attempts, spans, rewards)
    if problem is not None:
        raise TraceFormatError("inconsistent record", problem, line)
    items: list[Span | Reward] = [*spans, *rewards]
    order = sorted(range(len(items)), key=lambda i: (items[i].sequence is None, items[i].sequence or 0, i))
    return ParsedTrace(rollout, attempts, [items[i] for i in order])


@dataclass
class LineProblem:
    """A line that was not imported: 1-based line number, short reason and details."""

    line: int
    reason: str
    detail: str


@dataclass
class ImportReport:
    """What an import did.

    Attributes:
        path: the file read.
        lines: non-blank lines read.
        imported: rollouts written.
        already_present: rollouts whose id the store already held (left unchanged; import is idempotent).
        skipped: lines not imported because they are invalid (each with its line number and reason).
        failed: valid lines whose store write failed (nothing of that record was written).
    """

    path: Path
    lines: int = 0
    imported: int = 0
    already_present: int = 0
    skipped: list[LineProblem] = field(default_factory=list)
    failed: list[LineProblem] = field(default_factory=list)

    @property
    def skip_counts(self) -> Counter[str]:
        """Count per reason of skipped and failed lines."""
        return Counter(p.reason for p in [*self.skipped, *self.failed])


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        yield from enumerate(f, start=1)


def _parsed(
    path: Path, report: ImportReport, **checks: Any
) -> Iterator[tuple[int, ParsedTrace | TraceFormatError]]:
    """Every non-blank line, parsed or with its error; a rollout id seen before is a ``duplicate``."""
    seen: dict[str, int] = {}
    for n, raw in _lines(path):
        try:
            parsed = parse_trace_line(raw, n, **checks)
        except TraceFormatError as exc:
            report.lines += 1
            yield n, exc
            continue
        if parsed is None:
            continue
        report.lines += 1
        rid = parsed.rollout.rollout_id
        if rid in seen:
            yield n, TraceFormatError("duplicate", f"rollout {rid!r} already on line {seen[rid]}", n)
            continue
        seen[rid] = n
        yield n, parsed


def import_jsonl(
    store: TraceStore,
    path: str | os.PathLike[str],
    *,
    on_error: Literal["skip", "raise"] = "skip",
    progress: bool | None = None,
    vocab_size: int | None = None,
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
) -> ImportReport:
    """Import a trace file, keeping ids, states, attempts, timestamps and versions as they were.

    Each rollout lands with its attempts, spans and rewards in one transaction (all or nothing);
    a rollout id the store already holds is left unchanged and counted, so importing a file twice
    stores nothing twice. The file is not trusted: only finished rollouts are imported (never work a
    runner would pick up), and token ids, rewards and nesting are checked line by line
    (:mod:`~agentforge.trainers.replay.trust`).

    Args:
        store: a store with an ``import_trace`` method (:class:`~agentforge.stores.SQLStore`).
        path: the ``.jsonl`` file.
        on_error: ``"skip"`` imports the valid lines and lists the others in the report;
            ``"raise"`` validates every line first and writes nothing if one is invalid.
        progress: show a progress bar on stderr; ``None`` shows it when stderr is a TTY.
        vocab_size: the vocabulary size of the model the traces will train (token ids must be below
            it); ``None`` checks only that ids are non-negative.
        max_abs_reward: the largest ``|reward|`` accepted (default ``1e6``).

    Returns:
        Counts of imported / already present rollouts and the problem lines.

    Raises:
        UserError: the file does not exist, the store cannot import, or ``on_error`` is unknown.
        TraceFormatError: with ``on_error="raise"``, some line is invalid (nothing was written).
        StoreError, UserError: with ``on_error="raise"``, a store write failed (earlier records are kept;
            re-running the import resumes, as present rollouts are skipped).
    """
    target = Path(path)
    if on_error not in ("skip", "raise"):
        raise UserError(f"on_error must be 'skip' or 'raise', got {on_error!r}")
    if target.is_dir():
        raise UserError(
            f"{target} is a directory (a Hugging Face export cannot be imported); give a .jsonl file written "
            "by export_jsonl"
        )
    if not target.is_file():
        raise UserError(f"trace file {target} does not exist")
    write = getattr(store, "import_trace", None)
    if write is None:
        raise UserError(
            f"{type(store).__name__} cannot import traces (no import_trace); import into the SQL store "
            "directly, e.g. SQLStore(url) with the database the store server uses"
        )
    if vocab_size is not None and vocab_size < 1:
        raise UserError(f"vocab_size must be a positive number of tokens, got {vocab_size}")
    if not max_abs_reward > 0:
        raise UserError(f"max_abs_reward must be > 0, got {max_abs_reward}")
    checks: dict[str, Any] = {"vocab_size": vocab_size, "max_abs_reward": max_abs_reward}
    if on_error == "raise":
        problems = [
            p for _, p in _parsed(target, ImportReport(target), **checks) if isinstance(p, TraceFormatError)
        ]
        if problems:
            shown = "; ".join(str(p) for p in problems[:5])
            raise TraceFormatError(
                "invalid file", f"{len(problems)} invalid line(s) in {target}, nothing imported: {shown}"
            )
    report = ImportReport(target)
    with progress_bar(None, f"import {target.name}", progress) as advance:
        for n, parsed in _parsed(target, report, **checks):
            advance(1)
            if isinstance(parsed, TraceFormatError):
                report.skipped.append(LineProblem(n, parsed.reason, parsed.detail))
                continue
            try:
                inserted = write(parsed.rollout, parsed.attempts, parsed.items)
            except AgentForgeError as exc:
                if on_error == "raise":
                    msg = (
                        f"line {n} of {target}: store write failed, this record not written "
                        f"({report.imported} earlier imported; re-run to resume): {exc}"
                    )
                    raise (UserError if isinstance(exc, UserError) else StoreError)(msg) from exc
                report.failed.append(LineProblem(n, "store write failed", str(exc)))
                continue
            report.imported += int(inserted)
            report.already_present += int(not inserted)
    return report
