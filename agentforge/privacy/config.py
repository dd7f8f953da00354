"""The privacy policy of a deployment: its mode, the detectors it runs and its own patterns and allow-list."""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentforge.errors import UserError

__all__ = ["PrivacyMode", "PrivacyConfig", "CATEGORIES", "PLACEHOLDER_RE"]

#: The built-in detector categories (each names its placeholders: ``<CARD_1>``, ``<EMAIL_2>``, ...).
CATEGORIES = ("EMAIL", "PHONE", "CARD", "IBAN", "SSN", "SECRET", "ADDRESS", "DOB")

#: A placeholder as the masker writes it: ``<CATEGORY_n>`` (category: upper-case letters, digits, ``_``).
PLACEHOLDER_RE = re.compile(r"<([A-Z][A-Z0-9_]*)_(\d+)>")

_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


class PrivacyMode(StrEnum):
    """What the gateway does with personal data (docs/privacy.md).

    * ``off``: nothing (the request is forwarded and stored as sent).
    * ``mask``: mask in flight: detected values become typed placeholders before the engine sees the request
      and are restored in what the client receives; stored text and token ids hold only placeholders, so the
      span stays trainable. The default for self-hosted engines.
    * ``redact``: redact at rest: the engine sees the real values (a hosted upstream, or a model that must
      read them); stored text is redacted, token ids of a call that carried personal data are withheld and
      the span is marked not trainable (``privacy_redacted``).
    """

    off = "off"
    mask = "mask"
    redact = "redact"


class PrivacyConfig(BaseModel):
    """One deployment's privacy policy, validated when built.

    Attributes:
        mode: see :class:`PrivacyMode`.
        categories: the built-in detectors to run (a subset of :data:`CATEGORIES`).
        patterns: the deployment's own detectors, ``{CATEGORY: regex}`` (e.g. ``{"ACCOUNT": r"ACME-\\d{8}"}``);
            a category is upper-case letters, digits and ``_``.
        allow: values never masked (exact strings, e.g. the shop's own support address).
        phone_regions: ISO country codes whose national phone formats are recognised (``phonenumbers``);
            numbers written with a ``+`` country code are recognised whatever the region.
        exportable: whether spans in which something was masked or redacted may leave the store; ``False``
            marks them ``attributes["privacy"]["exportable"] = False`` and exports refuse their rollouts.
        max_scan_s: the longest scan of one request the gateway takes on, seconds of one core, *estimated*
            from the request's characters and digits before scanning (``agentforge.privacy.flight.scan_cost_us``:
            the phone detector tries every window of a digit run, up to ~40 µs a digit). A request over it gets a 413
            naming this limit and is neither forwarded nor stored: a 4 MiB body of ``"4111 "`` would otherwise hold a
            scan thread for minutes (``python benchmarks/privacy_detection.py --scaling``).
        max_rollouts: how many rollouts' mappings the gateway keeps in memory (least recently used go first;
            a rollout evicted mid-way gets new placeholder numbers).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: PrivacyMode = PrivacyMode.mask
    categories: tuple[str, ...] = CATEGORIES
    patterns: dict[str, str] = Field(default_factory=dict)
    allow: tuple[str, ...] = ()
    phone_regions: tuple[str, ...] = ("US", "GB", "DE", "FR")
    exportable: bool = True
    max_scan_s: float = 5.0
    max_rollouts: int = 4096

    @field_validator("categories")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(CATEGORIES))
        if unknown:
            raise UserError(f"unknown privacy categories {unknown}; known: {list(CATEGORIES)}")
        return value

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: dict[str, str]) -> dict[str, str]:
        for name, pattern in value.items():
            if not _NAME_RE.match(name):
                raise UserError(
                    f"privacy pattern name {name!r} must be upper-case letters, digits and '_' (e.g. ACCOUNT)"
                )
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise UserError(f"privacy pattern {name}={pattern!r} is not a valid regex: {exc}") from exc
            if compiled.match(""):
                raise UserError(f"privacy pattern {name}={pattern!r} matches the empty string")
        return value

    @field_validator("max_scan_s")
    @classmethod
    def _positive_seconds(cls, value: float) -> float:
        if not value > 0:
            raise UserError(f"max_scan_s must be a positive number of seconds, got {value}")
        return value

    @field_validator("max_rollouts")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value < 1:
            raise UserError(f"max_rollouts must be at least 1, got {value}")
        return value

    @classmethod
    def from_options(
        cls, mode: str, patterns: list[str] | None = None, allow: list[str] | None = None
    ) -> PrivacyConfig:
        """Build a policy from command-line options.

        Args:
            mode: ``off``, ``mask`` or ``redact``.
            patterns: ``NAME=REGEX`` items (``--privacy-pattern 'ACCOUNT=ACME-\\d{8}'``).
            allow: values never masked.

        Returns:
            The validated policy.

        Raises:
            UserError: an unknown mode, a pattern item without ``=``, or a pattern that does not compile.
        """
        try:
            parsed = PrivacyMode(mode)
        except ValueError:
            raise UserError(f"unknown privacy mode {mode!r}; use one of off, mask, redact") from None
        table: dict[str, str] = {}
        for item in patterns or []:
            name, sep, regex = item.partition("=")
            if not sep or not name or not regex:
                raise UserError(
                    f"privacy pattern {item!r} must read NAME=REGEX (e.g. 'ACCOUNT=ACME-\\d{{8}}')"
                )
            table[name.strip()] = regex
        return cls(mode=parsed, patterns=table, allow=tuple(allow or ()))
