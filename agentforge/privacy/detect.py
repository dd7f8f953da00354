"""Finding personal data and secrets in text, offline, with well-kept libraries.

Detectors per category (all run without a model or a network):

* ``CARD``, ``IBAN``, ``EMAIL``, ``SSN``: Microsoft Presidio's pattern recognizers (``presidio-analyzer``:
  ``CreditCardRecognizer`` validates the Luhn checksum, ``IbanRecognizer`` the ISO 13616 mod-97 checksum),
  called directly, so no spaCy model is loaded; a card must also start with 2-6 (ISO/IEC 7812-1 major
  industry identifiers of payment networks), so Luhn-valid order numbers are not taken for cards. Email
  domains are checked against ``tldextract``'s bundled public-suffix snapshot (never fetched).
* ``PHONE``: Google's libphonenumber port ``phonenumbers`` (``PhoneNumberMatcher``, leniency ``VALID``), kept
  with 7 to 15 digits (ITU-T E.164 allows at most 15) and not glued to an identifier (``#`` or ``X-`` right
  before it), so 16-digit invoice numbers, 6-digit order numbers and ``TICKET-0308558`` that some region's
  numbering plan accepts are not taken for phones.
* ``SECRET``: Yelp's ``detect-secrets`` plugins: its known-prefix detectors (AWS, GitHub, OpenAI, Stripe,
  Slack, JWT, private keys, ...), its keyword detector (``password=...``, ``"api_key": "..."``) and its
  base64/hex entropy detectors (quoted strings above 4.5 / 3.0 bits per character, detect-secrets' defaults).
* ``ADDRESS``: Presidio has no street-address recognizer without NER, so this is a Presidio
  ``PatternRecognizer`` with one documented pattern for US/UK-style street lines: a house number, one to
  four capitalised or ordinal words and a street suffix from USPS Publication 28 appendix C1 (``Street``,
  ``Ave``, ``Drive``, ...), then optionally a unit (``Apt 4``, ``Suite 394``), a city, a state and a ZIP code.
* ``DOB``: Presidio's ``DateRecognizer`` patterns (plus ``March 14, 1985`` forms) kept only when a birth
  word (``born``, ``birth``, ``DOB``) stands within 40 characters before the date, so order and delivery
  dates are not masked.
* the deployment's own regexes (:attr:`~agentforge.privacy.config.PrivacyConfig.patterns`).

Values on the allow-list are never reported.
"""

from __future__ import annotations

import bisect
import importlib.abc
import math
import re
import sys
import threading
import unicodedata
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

from agentforge.errors import MissingExtraError
from agentforge.privacy.config import PrivacyConfig

__all__ = ["Finding", "Detector", "digit_count"]

_STREET_SUFFIX = (
    "Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Lane|Ln|Drive|Dr|Court|Ct|Place|Pl|Way|Terrace|Ter|"
    "Circle|Cir|Parkway|Pkwy|Highway|Hwy|Square|Sq|Trail|Trl|Crescent|Close|Row|Alley|Aly|Plaza|Plz"
)
#: The ``ADDRESS`` pattern (see the module docstring).
ADDRESS_PATTERN = (
    r"\b\d{1,6}[A-Z]?\s+(?:(?:N|S|E|W|NE|NW|SE|SW|North|South|East|West)\.?\s+)?"
    r"(?:(?:[A-Z][a-zA-Z'-]+|\d{1,3}(?:st|nd|rd|th))\s+){1,4}"
    rf"(?:{_STREET_SUFFIX})\b\.?"
    r"(?:,?\s+(?:Apt|Apartment|Suite|Ste|Unit|Flat|#)\.?\s*[\w-]+)?"
    r"(?:,\s*[A-Z][a-zA-Z'.-]+(?:\s+[A-Z][a-zA-Z'.-]+){0,2})?"
    r"(?:,\s*[A-Z]{2})?(?:,?\s+\d{5}(?:-\d{4})?)?"
)
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_LONG_DATES = (
    rf"\b(?:{_MONTHS})\.?\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}\b",
    rf"\b\d{{1,2}}\s+(?:{_MONTHS}),?\s+\d{{4}}\b",
)
_BIRTH_RE = re.compile(r"(?i)(?:born|birth|\bdob\b|d\.o\.b)")
#: a necessary condition for any :data:`_BIRTH_RE` match in any window of a text (its words, no boundaries):
#: a text without one has no birth date, and the date regexes need not run (most texts)
_BIRTH_HINT_RE = re.compile(r"(?i)born|birth|dob|d\.o\.b")
_BIRTH_WINDOW = 40
# cheap triggers: most detectors need a digit, emails an '@', secrets a keyword or a long token
_NO_DIGITS = str.maketrans("", "", "0123456789")
# the fewest digits a value of each built-in category has (cards 12+ in Presidio's pattern, IBANs 8+ in the
# shortest national layouts, SSNs 9, a house number 1); deployment patterns always run
_MIN_DIGITS = {"CARD": 12, "IBAN": 8, "SSN": 9, "ADDRESS": 1}
_ID_PREFIX_RE = re.compile(r"(?:#|[A-Za-z0-9]-)$")
_SECRET_HINT_RE = re.compile(
    r"(?i)(?:pass|secret|token|key|auth|cred|pwd|bearer|-----BEGIN)|[A-Za-z0-9_\-+/=]{20,}"
)
_SECRET_PLUGINS = (
    "ArtifactoryDetector",
    "AWSKeyDetector",
    "AzureStorageKeyDetector",
    "BasicAuthDetector",
    "CloudantDetector",
    "DiscordBotTokenDetector",
    "GitHubTokenDetector",
    "GitLabTokenDetector",
    "IbmCloudIamDetector",
    "IbmCosHmacDetector",
    "JwtTokenDetector",
    "MailchimpDetector",
    "NpmDetector",
    "OpenAIDetector",
    "PrivateKeyDetector",
    "PypiTokenDetector",
    "SendGridDetector",
    "SlackDetector",
    "SoftlayerDetector",
    "SquareOAuthDetector",
    "StripeDetector",
    "TelegramBotTokenDetector",
    "TwilioKeyDetector",
)
# ISO/IEC 7812-1: a payment card's first digit (major industry identifier) is 2-6; 1 (airlines), 7-9 and 0 are
# not payment networks, and Luhn-valid order numbers starting with them are common (Bitext's 113542617735902)
_CARD_FIRST_DIGITS = frozenset("23456")
# secrets detect-secrets misses or cuts short (issue 36): a PEM private key with its body (detect-secrets flags only
# the BEGIN line), a whole JWT (its signature too), OpenAI project/service keys, unquoted ``password=...`` style
# assignments (the value: group ``v``); bounded repeats, so each costs linear time per character
_EXTRA_SECRETS = tuple(
    re.compile(p)
    for p in (
        r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----\s*(?:(?:Proc-Type|DEK-Info):[^\n]{0,200}\n\s*)*"
        r"[A-Za-z0-9+/=\s]{0,16384}(?:-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
        r"\beyJ[A-Za-z0-9_-]{4,4096}\.eyJ[A-Za-z0-9_-]{4,8192}\.[A-Za-z0-9_-]{0,1024}",
        r"\bsk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,512}",
        r"(?i)\b[a-z0-9_.-]{0,40}?(?:password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?key|auth[_-]?token"
        r"|access[_-]?token|private[_-]?key|client[_-]?secret)\s{0,5}[:=]\s{0,5}(?P<v>[^\s'\"<>,;&]{4,512})",
    )
)
# a bare AWS-style secret access key: 40 base64 characters, mixed case, a digit, high entropy
_BARE_KEY_RE = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
# characters that hide a value from the patterns without changing how it reads (issue 36): zero-width ones are
# dropped, other spaces become " ", any decimal digit its ASCII digit, and the dots of a card written in dotted
# groups (4111.1111.1111.1111) spaces; offsets are mapped back to the original text
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u00ad")
_DIGIT_DOT_RE = re.compile(r"\b\d{4}(?:\.\d{4}){2,3}\b|\b\d{4}\.\d{6}\.\d{4,5}\b")  # card groups only
# a category's rank when two findings overlap (lower wins; then the longer one)
_RANK = {"SECRET": 0, "CARD": 1, "IBAN": 2, "EMAIL": 3, "SSN": 4, "DOB": 5, "PHONE": 6, "ADDRESS": 7}


@dataclass(frozen=True)
class Finding:
    """One detected value: ``text[start:end]`` is of ``category``.

    Attributes:
        start: offset of the first character (Python string index).
        end: offset one past the last character.
        category: e.g. ``CARD``, ``EMAIL`` or a deployment pattern's name.
        value: the detected text.
    """

    start: int
    end: int
    category: str
    value: str


def digit_count(text: str) -> int:
    """How many ASCII digits ``text`` holds (one C-speed pass: the detectors' cheap gates and cost estimate)."""
    return len(text) - len(text.translate(_NO_DIGITS))


def _need(module: str) -> Any:
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as exc:  # a core dependency; a broken install gets the fix named
        raise MissingExtraError(exc.name or module, None, "privacy detection") from exc


#: Packages Presidio's NLP engines import when they are installed, which pattern recognizers never use.
_UNUSED_BY_PATTERNS = frozenset({"torch", "transformers"})


class _SkipUnused(importlib.abc.MetaPathFinder):
    """Makes ``import torch`` / ``import transformers`` fail *in one thread only* while it imports Presidio.

    ``presidio_analyzer/__init__`` imports its NLP engines, and those import transformers and (through thinc)
    torch where installed: 4-5 of the 6 s its import takes on 2 cores, and some 300 MB of a gateway's memory,
    for code the pattern recognizers never run. Presidio and thinc import both inside ``try: ... except
    ImportError`` (Presidio's Hugging Face engine is then unavailable in the process; agentforge never uses
    it). Other threads import as usual; a package already imported is taken from ``sys.modules`` as usual.
    """

    def __init__(self) -> None:
        self.thread = threading.get_ident()

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if threading.get_ident() == self.thread and name.partition(".")[0] in _UNUSED_BY_PATTERNS:
            raise ImportError(f"{name} is not imported for pattern recognizers", name=name)
        return None


def _import_presidio() -> tuple[Any, Any]:
    """``(presidio_analyzer, presidio_analyzer.predefined_recognizers)``, imported without the NLP engines'
    optional torch and transformers (:class:`_SkipUnused`) unless they are imported already."""
    if "presidio_analyzer.predefined_recognizers" in sys.modules:
        return _need("presidio_analyzer"), _need("presidio_analyzer.predefined_recognizers")
    skip = _SkipUnused()
    sys.meta_path.insert(0, skip)
    try:
        return _need("presidio_analyzer"), _need("presidio_analyzer.predefined_recognizers")
    finally:
        sys.meta_path.remove(skip)


class Detector:
    """The configured detectors over one policy (build once per process: Presidio's import takes seconds).

    Args:
        config: the policy (categories, deployment patterns, allow-list, phone regions).

    Raises:
        MissingExtraError: ``presidio-analyzer``, ``phonenumbers`` or ``detect-secrets`` is missing.
    """

    def __init__(self, config: PrivacyConfig) -> None:
        self.config = config
        wanted = set(config.categories)
        presidio, rec = _import_presidio()
        self._pattern_recognizers: list[tuple[str, Any]] = []
        if "CARD" in wanted:
            self._pattern_recognizers.append(("CARD", rec.CreditCardRecognizer()))
        if "IBAN" in wanted:
            self._pattern_recognizers.append(("IBAN", rec.IbanRecognizer()))
        if "EMAIL" in wanted:
            self._pattern_recognizers.append(("EMAIL", _offline_email_recognizer(rec)))
        if "SSN" in wanted:
            self._pattern_recognizers.append(("SSN", rec.UsSsnRecognizer()))
        if "ADDRESS" in wanted:
            pattern = presidio.Pattern("street address", ADDRESS_PATTERN, 0.5)
            self._pattern_recognizers.append(
                ("ADDRESS", presidio.PatternRecognizer(supported_entity="ADDRESS", patterns=[pattern]))
            )
        for name, regex in config.patterns.items():
            recognizer = presidio.PatternRecognizer(
                supported_entity=name, patterns=[presidio.Pattern(name, regex, 1.0)]
            )
            self._pattern_recognizers.append((name, recognizer))
        self._dates: list[re.Pattern[str]] = []
        if "DOB" in wanted:
            self._dates = [re.compile(p.regex, re.IGNORECASE) for p in rec.DateRecognizer.PATTERNS]
            self._dates += [re.compile(p) for p in _LONG_DATES]
        self._phonenumbers = _need("phonenumbers") if "PHONE" in wanted else None
        self._secret_regexes: list[re.Pattern[str]] = []
        self._secret_plugins: list[Any] = []
        if "SECRET" in wanted:
            plugins = _need("detect_secrets.core.plugins.util").get_mapping_from_secret_type_to_class()
            by_name = {cls.__name__: cls for cls in plugins.values()}
            for name in _SECRET_PLUGINS:
                self._secret_regexes.extend(by_name[name]().denylist)
            entropy = _need("detect_secrets.plugins.high_entropy_strings")
            keyword = _need("detect_secrets.plugins.keyword")
            self._secret_plugins = [
                keyword.KeywordDetector(),
                entropy.Base64HighEntropyString(limit=4.5),
                entropy.HexHighEntropyString(limit=3.0),
            ]
        self._allow = frozenset(config.allow)

    def find(self, text: str) -> list[Finding]:
        """The non-overlapping findings in ``text``, in order.

        The text is first normalised (:func:`_normalise`: zero-width characters out, Unicode spaces and digits
        to ASCII, the dots of card-shaped digit groups to spaces), so ``4111\u200b1111...`` or full-width digits are found like
        plain ones; offsets and values are the original text's.

        Args:
            text: any text (a message, a tool result, tool-call arguments as JSON).

        Returns:
            Findings sorted by ``start``; where two overlap, the longer one is kept (an IBAN over the card
            number inside it, ``ACME-12345678`` over the phone-like digits in it), at equal length the
            higher-ranked category (secrets, cards, IBANs, emails, SSNs, birth dates, phones, addresses,
            then deployment patterns).
        """
        norm, where = _normalise(text)
        found = self._find(norm)
        if norm is not text:
            found = [_mapped(f, text, where) for f in found]
        return [f for f in found if f.value not in self._allow and f.value.strip()]

    def _find(self, text: str) -> list[Finding]:
        found: list[Finding] = []
        digits = digit_count(text)  # cheap gates: most values need digits
        for category, recognizer in self._pattern_recognizers:
            need = _MIN_DIGITS.get(category, 0)
            if digits < need or (category == "EMAIL" and "@" not in text):
                continue
            for result in recognizer.analyze(text, [recognizer.supported_entities[0]]):
                value = text[result.start : result.end]
                if category == "CARD" and value.lstrip()[:1] not in _CARD_FIRST_DIGITS:
                    continue  # a Luhn-valid order number, not a payment card
                found.append(Finding(result.start, result.end, category, value))
        if digits >= 4 and _BIRTH_HINT_RE.search(text):  # a year, and a birth word somewhere
            found.extend(self._birth_dates(text))
        if digits >= 7 and self._phonenumbers is not None:
            rest = _blank(text, found)  # digits already taken (a card, an IBAN) are no phone candidates
            if digit_count(rest) >= 7:
                found.extend(self._phones(rest))
        if self._secret_regexes and _SECRET_HINT_RE.search(text):
            found.extend(self._secrets(text))
        return self._resolve([f for f in found if f.value.strip()])

    def _birth_dates(self, text: str) -> list[Finding]:
        out: list[Finding] = []
        for regex in self._dates:
            for m in regex.finditer(text):
                if _BIRTH_RE.search(text, max(0, m.start() - _BIRTH_WINDOW), m.start()):
                    out.append(Finding(m.start(), m.end(), "DOB", m.group(0)))
        return out

    def _phones(self, text: str) -> list[Finding]:
        pn = self._phonenumbers
        if pn is None:
            return []
        out: list[Finding] = []
        for region in self.config.phone_regions:
            for match in pn.PhoneNumberMatcher(text, region, leniency=pn.Leniency.VALID):
                glued = _ID_PREFIX_RE.search(text, max(0, match.start - 2), match.start) is not None
                if 7 <= sum(c.isdigit() for c in match.raw_string) <= 15 and not glued:
                    out.append(Finding(match.start, match.end, "PHONE", match.raw_string))
        return out

    def _secrets(self, text: str) -> list[Finding]:
        out: list[Finding] = []
        for regex in self._secret_regexes:
            for m in regex.finditer(text):
                out.append(Finding(m.start(), m.end(), "SECRET", m.group(0)))
        for regex in _EXTRA_SECRETS:
            for m in regex.finditer(text):
                g = "v" if "v" in regex.groupindex else 0
                out.append(Finding(m.start(g), m.end(g), "SECRET", m.group(g).rstrip()))
        for m in _BARE_KEY_RE.finditer(text):
            if _looks_random(m.group(0)):
                out.append(Finding(m.start(), m.end(), "SECRET", m.group(0)))
        for line_start, line in _lines(text):
            for plugin in self._secret_plugins:
                for secret in plugin.analyze_line(filename="message.txt", line=line, line_number=0):
                    value = secret.secret_value or ""
                    at = line.find(value) if value else -1
                    if at >= 0:
                        out.append(Finding(line_start + at, line_start + at + len(value), "SECRET", value))
        return out

    @staticmethod
    def _resolve(found: list[Finding]) -> list[Finding]:
        """The non-overlapping findings, longest first (then by category rank, then by start), in text order.

        The kept spans are disjoint, so they are held sorted by start (and thereby by end): a new span can only
        overlap its two neighbours there, found by bisection. O(n log n) in the findings (a linear scan of the
        kept spans made a 128 KB body of digit groups, 8,722 findings, spend 9 of its 25 s here).
        """
        found.sort(key=lambda f: (-(f.end - f.start), _RANK.get(f.category, 99), f.start))
        starts: list[int] = []
        ends: list[int] = []
        kept: list[Finding] = []
        for f in found:
            i = bisect.bisect_left(starts, f.start)
            if (i > 0 and ends[i - 1] > f.start) or (i < len(starts) and starts[i] < f.end):
                continue
            starts.insert(i, f.start)
            ends.insert(i, f.end)
            kept.append(f)
        return sorted(kept, key=lambda f: f.start)


def _normalise(text: str) -> tuple[str, list[int] | None]:
    """``(normalised text, original index of each of its characters)``; the index list is ``None`` when the
    offsets did not change (the text itself, or the dots of card-shaped digit groups replaced one for one)."""
    if text.isascii():
        if "." in text and _DIGIT_DOT_RE.search(text):
            return _DIGIT_DOT_RE.sub(_undot, text), None
        return text, None
    chars: list[str] = []
    where: list[int] = []
    for i, ch in enumerate(text):
        if ch in _ZERO_WIDTH:
            continue
        if not ch.isascii():
            if ch.isspace():
                ch = " "
            elif ch.isdigit():
                digit = unicodedata.decimal(ch, None)
                ch = str(digit) if digit is not None else ch
        chars.append(ch)
        where.append(i)
    norm = _DIGIT_DOT_RE.sub(_undot, "".join(chars))
    return norm, where


def _undot(m: re.Match[str]) -> str:
    return m.group(0).replace(".", " ")


def _mapped(f: Finding, text: str, where: list[int] | None) -> Finding:
    """``f`` (found in the normalised text) with the original text's offsets and value."""
    if where is None:
        return replace(f, value=text[f.start : f.end])
    start, end = where[f.start], where[f.end - 1] + 1
    return Finding(start, end, f.category, text[start:end])


def _looks_random(token: str) -> bool:
    """A 40-character token with upper and lower case and a digit, above 4.5 bits of entropy per character."""
    if not (
        any(c.isupper() for c in token)
        and any(c.islower() for c in token)
        and any(c.isdigit() for c in token)
    ):
        return False
    counts = Counter(token)
    return -sum(n / 40 * math.log2(n / 40) for n in counts.values()) > 4.5


def _blank(text: str, found: list[Finding]) -> str:
    """``text`` with each finding's span replaced by spaces (offsets unchanged)."""
    if not found:
        return text
    chars = list(text)
    for f in found:
        chars[f.start : f.end] = " " * (f.end - f.start)
    return "".join(chars)


def _lines(text: str) -> list[tuple[int, str]]:
    out, at = [], 0
    for line in text.split("\n"):
        out.append((at, line))
        at += len(line) + 1
    return out


def _offline_email_recognizer(rec: Any) -> Any:
    """Presidio's ``EmailRecognizer`` whose domain check reads tldextract's bundled suffix list: the stock
    one calls ``tldextract.extract``, which fetches the list from the network on first use."""
    tldextract = _need("tldextract")
    extract = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    class OfflineEmailRecognizer(rec.EmailRecognizer):
        def validate_result(self, pattern_text: str) -> bool:
            return bool(extract(pattern_text.rsplit("@", 1)[-1]).suffix)

    return OfflineEmailRecognizer()
