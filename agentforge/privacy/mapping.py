"""One rollout's placeholders: real value <-> ``<CATEGORY_n>``, kept only in memory (never stored)."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import ahocorasick

from agentforge.privacy.config import PLACEHOLDER_RE
from agentforge.privacy.detect import Detector, Finding

__all__ = ["Mapping", "json_escaped"]

#: a text tail that may be the start of a placeholder still being streamed (``<CA``, ``<CARD_``)
_OPEN_TAIL_RE = re.compile(r"<[A-Z0-9_]{0,40}$")
# masked texts remembered per rollout (a chat resends its whole history every turn): at most this many, of at
# most _CACHED_TEXT_CHARS each and _CACHE_CHARS in all, so a rollout of 1 MB messages keeps a few MB, not 128 of them
_TEXT_CACHE = 128
_CACHED_TEXT_CHARS = 64 * 1024
_CACHE_CHARS = 1024 * 1024


#: characters scanned on each side of the boundary between two messages for a value split across them
SPLIT_WINDOW = 64
#: boundaries remembered per rollout (a chat resends its history every turn)
_SPLIT_CACHE = 256


class KnownValues:
    """Every occurrence of any of a growing set of values in a text, in time linear in the text.

    A rollout's mapping searches each text it masks for every value the rollout revealed before. One
    ``str.find`` per value made that O(values) per text, and a long rollout O(calls²): after 1,000 calls with a
    new email each, 160 µs of every call (the gateway benchmark's rollouts run thousands of calls). Values are
    kept in an Aho-Corasick automaton (``pyahocorasick``; A. V. Aho and M. J. Corasick, "Efficient string
    matching", CACM 18(6), 1975) rebuilt from all values once more than ``max(16, n / 8)`` wait beside it;
    the waiting ones are searched one by one. A rebuild costs about 0.9 µs per value, so its share per added
    value stays about 7 µs, and a rollout with at most 16 values never builds one.

    Not thread-safe for writers (the mapping's lock serialises :meth:`add`); a reader may search while a writer
    adds: it sees an automaton that is never changed once built, and a copy of the waiting values.
    """

    MIN_WAITING = 16

    def __init__(self) -> None:
        self._automaton: Any = None
        self._built: list[str] = []
        self._waiting: list[str] = []

    def __len__(self) -> int:
        return len(self._built) + len(self._waiting)

    def add(self, value: str) -> None:
        """Add ``value`` (each value once; an empty one is ignored)."""
        if not value:
            return
        self._waiting.append(value)
        if len(self._waiting) > max(self.MIN_WAITING, len(self._built) // 8):
            values = self._built + self._waiting
            automaton = ahocorasick.Automaton()
            for v in values:
                automaton.add_word(v, v)
            automaton.make_automaton()
            self._automaton, self._built, self._waiting = automaton, values, []

    def occurrences(self, text: str) -> Iterator[tuple[int, str]]:
        """``(start, value)`` for every occurrence of every value in ``text`` (overlapping ones too), unordered."""
        automaton = self._automaton
        if automaton is not None:
            for end, value in automaton.iter(text):
                yield end - len(value) + 1, value
        for value in list(self._waiting):
            at = text.find(value)
            while at >= 0:
                yield at, value
                at = text.find(value, at + 1)

    def any_in(self, text: str) -> bool:
        """Whether ``text`` holds any of the values."""
        return next(self.occurrences(text), None) is not None


def json_escaped(value: str) -> str:
    """``value`` as it reads inside a JSON string (tool-call arguments)."""
    return json.dumps(value, ensure_ascii=False)[1:-1]


class Mapping:
    """The placeholders of one rollout (or of one unattributed call).

    The same value always gets the same placeholder; numbers count per category from 1. Values the
    rollout already revealed are masked wherever they occur again, detected or not (the client sends back
    what it was given: restored answers, tool-call arguments).

    Args:
        detector: the configured detectors.
    """

    def __init__(self, detector: Detector) -> None:
        self.detector = detector
        self.by_value: dict[str, str] = {}
        self.by_placeholder: dict[str, str] = {}
        self._known = KnownValues()  # the keys of by_value, searchable in one pass over a text
        self._numbers: Counter[str] = Counter()
        self._texts: dict[str, tuple[str, Counter[str]]] = {}
        self._cached_chars = 0
        self.lock = threading.Lock()  #: held by whoever masks with this mapping (calls run in worker threads)
        self._splits: dict[tuple[str, str], tuple[str, int, int] | None] = {}

    def placeholder(self, category: str, value: str) -> str:
        """The placeholder of ``value`` (a new one, numbered next in ``category``, if unseen)."""
        found = self.by_value.get(value)
        if found is None:
            self._numbers[category] += 1
            found = f"<{category}_{self._numbers[category]}>"
            self.by_value[value] = found
            self.by_placeholder[found] = value
            self._known.add(value)
            escaped = json_escaped(value)
            if escaped != value and escaped not in self.by_value:
                self.by_value[escaped] = found
                self._known.add(escaped)
        return found

    def is_cached(self, text: str) -> bool:
        """Whether :meth:`mask` remembers ``text`` (masking it again costs no detection)."""
        return text in self._texts

    def mask(self, text: str) -> tuple[str, Counter[str]]:
        """``text`` with every detected or already known value replaced by its placeholder.

        Returns:
            The masked text and the count of replacements per category.
        """
        cached = self._texts.get(text)
        if cached is not None:
            return cached[0], Counter(cached[1])
        findings = self._known_findings(text) + self.detector.find(text)
        out: list[str] = []
        counts: Counter[str] = Counter()
        at = 0
        for f in sorted(findings, key=lambda f: f.start):  # known values first (stable sort), then new ones
            if f.start < at:
                continue
            out.append(text[at : f.start])
            ph = self.placeholder(f.category, f.value)
            out.append(ph)
            counts[ph[1:].rsplit("_", 1)[0]] += 1
            at = f.end
        out.append(text[at:])
        masked = "".join(out)
        if len(text) <= _CACHED_TEXT_CHARS:
            while self._texts and (
                len(self._texts) >= _TEXT_CACHE or self._cached_chars + len(text) + len(masked) > _CACHE_CHARS
            ):
                old = next(iter(self._texts))
                self._cached_chars -= len(old) + len(self._texts.pop(old)[0])
            self._texts[text] = (masked, Counter(counts))
            self._cached_chars += len(text) + len(masked)
        return masked, counts

    def split_value(self, first: str, second: str) -> tuple[str, int, int] | None:
        """A value a person split across two messages (``4111 1111`` then ``1111 1111``; a street address cut
        after its street name): the last :data:`SPLIT_WINDOW` characters of ``first`` and the first ones of
        ``second`` are scanned joined by a space, and only a finding that crosses the space counts. (Joined
        directly, any two words would make one, so a value cut inside a word, ``bob.smith@`` then
        ``example.org``, is not found.)

        Args:
            first, second: the two (already masked) message texts.

        Returns:
            ``(placeholder, keep, skip)``: ``first[:keep] + placeholder`` and ``placeholder + second[skip:]`` are
            the masked texts; ``None`` when no value crosses the boundary. Remembered per pair of texts.
        """
        key = (first[-SPLIT_WINDOW:], second[:SPLIT_WINDOW])
        if key in self._splits:
            return self._splits[key]
        tail, head = key
        cut = len(tail)
        found: tuple[str, int, int] | None = None
        crossing = [f for f in self.detector.find(f"{tail} {head}") if f.start < cut and f.end > cut + 1]
        if crossing:
            f = crossing[0]
            found = (self.placeholder(f.category, f.value), len(first) - (cut - f.start), f.end - cut - 1)
        while len(self._splits) >= _SPLIT_CACHE:
            self._splits.pop(next(iter(self._splits)))
        self._splits[key] = found
        return found

    def known_in(self, text: str) -> bool:
        """Whether ``text`` holds a value this rollout already masked (:class:`KnownValues`)."""
        return self._known.any_in(text)

    def _known_findings(self, text: str) -> list[Finding]:
        """Occurrences of values this rollout already masked (:class:`KnownValues`: one pass over the text,
        whatever the number of values), in text order, the longer first where two start together, so the
        overlap rule of :meth:`mask` keeps the longer."""
        found = []
        for at, value in self._known.occurrences(text):
            found.append(Finding(at, at + len(value), self.by_value[value][1:].rsplit("_", 1)[0], value))
        found.sort(key=lambda f: (f.start, -(f.end - f.start)))
        return found

    def restore(self, text: str, *, in_json: bool = False, only: frozenset[str] | None = None) -> str:
        """``text`` with this rollout's placeholders replaced by their real values (JSON-escaped when
        ``in_json``: tool-call arguments); placeholders it never issued, or not in ``only`` when given, stay
        as they are."""
        if "<" not in text:
            return text

        def real(m: re.Match[str]) -> str:
            if only is not None and m.group(0) not in only:
                return m.group(0)
            value = self.by_placeholder.get(m.group(0))
            if value is None:
                return m.group(0)
            return json_escaped(value) if in_json else value

        return PLACEHOLDER_RE.sub(real, text)

    def restore_value(self, value: Any) -> Any:
        """A JSON value with placeholders restored in every string (a deep copy where anything changed)."""
        if isinstance(value, str):
            return self.restore(value)
        if isinstance(value, list):
            return [self.restore_value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.restore_value(v) for k, v in value.items()}
        return value


def split_open_tail(text: str) -> tuple[str, str]:
    """``(ready, held)``: ``held`` is a tail of ``text`` that may be the start of a placeholder."""
    m = _OPEN_TAIL_RE.search(text)
    if m is None:
        return text, ""
    return text[: m.start()], text[m.start() :]
