"""The offline detectors (agentforge/privacy/detect.py) and a rollout's placeholders (mapping.py)."""

from __future__ import annotations

import pytest

from agentforge.errors import UserError
from agentforge.privacy import Detector, Mapping, PrivacyConfig

VISA = "4111 1111 1111 1111"  # Luhn-valid
IBAN = "DE89 3704 0044 0532 0130 00"  # mod-97-valid


@pytest.fixture(scope="module")
def detector() -> Detector:
    return Detector(PrivacyConfig(patterns={"ACCOUNT": r"ACME-\d{8}"}, allow=("help@shop.example",)))


def _found(detector: Detector, text: str) -> list[tuple[str, str]]:
    return [(f.category, f.value) for f in detector.find(text)]


def test_each_category_is_found(detector: Detector) -> None:
    text = (
        f"card {VISA}, IBAN {IBAN}, account ACME-12345678, mail jane.doe@example.com, "
        "phone +1 415-555-0132, SSN 536-22-8726"
    )
    assert _found(detector, text) == [
        ("CARD", VISA),
        ("IBAN", IBAN),
        ("ACCOUNT", "ACME-12345678"),
        ("EMAIL", "jane.doe@example.com"),
        ("PHONE", "+1 415-555-0132"),
        ("SSN", "536-22-8726"),
    ]
    tool = '{"address": "445 Maple Drive, Suite 394, Fort Worth, TX 76165", "date_of_birth": "1985-03-14"}'
    assert _found(detector, tool) == [
        ("ADDRESS", "445 Maple Drive, Suite 394, Fort Worth, TX 76165"),
        ("DOB", "1985-03-14"),
    ]
    secrets = 'password = "hunter2xyz" and AKIAIOSFODNN7EXAMPLE'
    assert _found(detector, secrets) == [("SECRET", "hunter2xyz"), ("SECRET", "AKIAIOSFODNN7EXAMPLE")]


def test_look_alikes_and_allowed_values_are_not_found(detector: Detector) -> None:
    assert _found(detector, "order #12345678 placed on 2024-05-03 costs $129.99, ships by 05/10/2024") == []
    assert (
        _found(detector, "card 4111 1111 1111 1112 is not Luhn-valid; DE89 3704 0044 0532 0130 01 neither")
        == []
    )
    assert _found(detector, "write to help@shop.example") == []


def test_same_value_same_placeholder_and_known_values_masked_anywhere(detector: Detector) -> None:
    mapping = Mapping(detector)
    masked, counts = mapping.mask(f"pay with {VISA} or {IBAN}; again {VISA}")
    assert masked == "pay with <CARD_1> or <IBAN_1>; again <CARD_1>"
    assert dict(counts) == {"CARD": 2, "IBAN": 1}
    other, _ = mapping.mask('{"date_of_birth": "1985-03-14"}')
    assert other == '{"date_of_birth": "<DOB_1>"}'
    # a known value is masked where the detector alone would not find it (no birth word near it)
    assert mapping.mask("so 1985-03-14 it is")[0] == "so <DOB_1> it is"
    assert mapping.restore("<CARD_1>, <DOB_1> and <CARD_9>") == f"{VISA}, 1985-03-14 and <CARD_9>"
    assert mapping.restore('{"a": "<CARD_1>"}', in_json=True) == f'{{"a": "{VISA}"}}'


def test_bad_policies_are_refused() -> None:
    with pytest.raises(UserError, match="not a valid regex"):
        PrivacyConfig(patterns={"ACCOUNT": "ACME-("})
    with pytest.raises(UserError, match="upper-case"):
        PrivacyConfig(patterns={"account": r"\d+"})
    with pytest.raises(UserError, match="unknown privacy categories"):
        PrivacyConfig(categories=("EMAIL", "NAME"))
    with pytest.raises(UserError, match="NAME=REGEX"):
        PrivacyConfig.from_options("mask", ["ACME-\\d{8}"])
    with pytest.raises(UserError, match="unknown privacy mode"):
        PrivacyConfig.from_options("hide")


PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c3b0dYt9xQzR8mVqPkq2X9nq7mJ0s8w0aVbY2fN3Lr1Ht7eF\n"
    "k9Xw3mJpQ2rT5sVbN8cYdZ1aWq4Lp7oK3nR6tU9vX2yZ0bC5dE8fG1hI4jK7lM0n\n-----END RSA PRIVATE KEY-----"
)
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    ("text", "category", "value"),
    [
        (f"my key:\n{PEM}\nthanks", "SECRET", PEM),  # the body too, not only the BEGIN line
        (f"token {JWT} ok", "SECRET", JWT),  # the signature too
        ("login with password=hunter2butlonger and user=bob", "SECRET", "hunter2butlonger"),  # unquoted
        (
            "use sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH now",
            "SECRET",
            "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdEFGH",
        ),
        (f"aws_secret_access_key={AWS_SECRET}", "SECRET", AWS_SECRET),
        (f"the secret is {AWS_SECRET}", "SECRET", AWS_SECRET),
        ("card 4111.1111.1111.1111 exp 12/27", "CARD", "4111.1111.1111.1111"),
        ("card 4111\u00a01111\u00a01111\u00a01111", "CARD", "4111\u00a01111\u00a01111\u00a01111"),
        ("card 4111\u200b1111\u200b1111\u200b1111", "CARD", "4111\u200b1111\u200b1111\u200b1111"),
        (
            "card \uff14\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11",
            "CARD",
            "\uff14\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11 \uff11\uff11\uff11\uff11",
        ),
    ],
)
def test_the_reported_bypasses_are_found_whole(
    detector: Detector, text: str, category: str, value: str
) -> None:
    """Issue 36, Medium: each of these kept (part of) its value in clear; offsets are the original text's."""
    found = [f for f in detector.find(text) if f.category == category]
    assert [f.value for f in found] == [value]
    assert text[found[0].start : found[0].end] == value
    masked, _ = Mapping(detector).mask(text)
    assert value not in masked


def test_normalising_keeps_dotted_dates_and_prices(detector: Detector) -> None:
    assert _found(detector, "DOB: 04.05.1965, paid 1234.56 on 2024.01.15, version 1.2.3.4") == [
        ("DOB", "04.05.1965")
    ]


def _resolve_by_scan(found: list) -> list:
    """The overlap rule as first written: keep a finding when it overlaps none kept so far (quadratic)."""
    from agentforge.privacy.detect import _RANK

    found = sorted(found, key=lambda f: (-(f.end - f.start), _RANK.get(f.category, 99), f.start))
    kept: list = []
    for f in found:
        if all(f.end <= k.start or f.start >= k.end for k in kept):
            kept.append(f)
    return sorted(kept, key=lambda f: f.start)


def test_overlaps_are_resolved_as_before_in_n_log_n() -> None:
    """``_resolve`` keeps the same findings as the plain scan of the kept ones, on random overlapping spans of
    every category (a 128 KB body of digit groups has thousands of findings: the scan was quadratic)."""
    import random

    from agentforge.privacy.config import CATEGORIES
    from agentforge.privacy.detect import Finding

    rng = random.Random(0)
    for _ in range(300):
        found = []
        for _ in range(rng.randint(0, 40)):
            start = rng.randint(0, 120)
            end = start + rng.randint(1, 25)
            found.append(Finding(start, end, rng.choice(CATEGORIES + ("ACCOUNT",)), "x" * (end - start)))
        assert Detector._resolve(list(found)) == _resolve_by_scan(found)


def test_known_values_find_every_occurrence_before_and_after_the_automaton_is_built() -> None:
    """``KnownValues`` (the rollout's revealed values, searched in one pass) reports what one ``str.find`` per
    value reports, overlaps included, with few values (searched one by one) and with many (the automaton
    plus the values waiting beside it), on random texts over a small alphabet, so values overlap and nest."""
    import random

    from agentforge.privacy.mapping import KnownValues

    rng = random.Random(0)
    known, values = KnownValues(), []
    for _ in range(400):
        value = "".join(rng.choice("ab@1 ü") for _ in range(rng.randint(1, 6)))
        if value not in values:
            values.append(value)
            known.add(value)
        text = "".join(rng.choice("ab@1 üx") for _ in range(rng.randint(0, 60)))
        expected = sorted((at, v) for v in values for at in range(len(text)) if text.startswith(v, at))
        assert sorted(known.occurrences(text)) == expected
        assert known.any_in(text) == bool(expected)
    assert len(known) == len(values) and known._automaton is not None
    known.add("")  # ignored: an empty value would match everywhere
    assert len(known) == len(values)


def test_a_birth_date_needs_the_birth_hint_that_gates_the_date_patterns(detector: Detector) -> None:
    """The date patterns run only on texts the cheap hint matches (``born``, ``birth``, ``dob``, ``d.o.b``
    anywhere); every text whose dates the full check keeps must match the hint, so the gate drops none."""
    import random

    from agentforge.privacy.detect import _BIRTH_HINT_RE

    rng = random.Random(1)
    dates = ["1985-03-14", "03/14/1985", "14.03.1985", "March 14, 1985", "2024-01-02"]
    words = ["born", "Birth", "DOB", "d.o.b.", "dobby", "on", "order", "due", ":", " ", "x", *dates]
    kept = 0
    for _ in range(2000):
        text = "".join(rng.choice(words) + rng.choice(["", " "]) for _ in range(rng.randint(1, 8)))
        if detector._birth_dates(text):
            kept += 1
            assert _BIRTH_HINT_RE.search(text), text
        if not _BIRTH_HINT_RE.search(text):
            assert not [f for f in detector.find(text) if f.category == "DOB"]
    assert kept > 100
    assert _found(detector, "Order of 1985-03-14; DOB: 1985-03-14") == [("DOB", "1985-03-14")]
