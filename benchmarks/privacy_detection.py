"""Detection quality of the privacy detectors (agentforge/privacy/detect.py) on labelled customer messages.

The lines are real customer messages from the Bitext customer-support set (``../shared/data/
bitext_customer_support``, CDLA-Sharing-1.0), each with one inserted value of a category (Luhn-valid card
numbers, checksum-valid IBANs, emails, US phone numbers, SSNs, secrets with known prefixes or behind a
keyword, street addresses, dates of birth, a deployment pattern ``ACCOUNT = ACME-\\d{8}``), plus look-alike
lines that must NOT be masked: Bitext's own order numbers, prices, order and delivery dates, tracking numbers,
16-digit numbers that fail Luhn, 7-digit ACME numbers, quantities. Values are generated with a fixed seed.

A finding is a true positive when its category is the inserted one and its span overlaps the inserted
value; every other finding is a false positive of its category; an inserted value no finding overlaps is a
false negative. Printed: precision and recall per category, the look-alike lines with any finding, and the
detection time per line.

    python benchmarks/privacy_detection.py               # 25 lines per category + 100 look-alike lines
    python benchmarks/privacy_detection.py --per-category 50 --json
    python benchmarks/privacy_detection.py --scaling     # cost per byte of hostile bodies, 16 KB to 1 MiB

``--scaling`` times :meth:`Detector.find` on bodies built to be expensive (the issue's ``"4111 "`` repeated,
one long digit run, digits and separators mixed, e-mail-like fragments, a customer message repeated) at
growing sizes, and prints µs per KB for each: a detector whose cost is linear in the body shows a flat row, one
with a super-linear path a row that climbs. With the gateway's 4 MiB body limit, the largest figure bounds the
worst scan of one request.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import string
import sys
import time
from collections import Counter
from pathlib import Path

from agentforge.privacy import Detector, PrivacyConfig

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "bitext_customer_support"
CSV = DATA / "Bitext_Sample_Customer_Support_Training_Dataset.csv"

STREETS = [
    "Maple",
    "Oak",
    "Pine",
    "Cedar",
    "Elm",
    "Washington",
    "Lake",
    "Hill",
    "Park",
    "Main",
    "Sunset",
    "River",
]
SUFFIXES = ["Street", "St", "Avenue", "Ave", "Road", "Drive", "Lane", "Boulevard", "Court", "Way", "Place"]
CITIES = [
    ("Fort Worth", "TX", "76165"),
    ("Denver", "CO", "80202"),
    ("Austin", "TX", "78701"),
    ("Seattle", "WA", "98101"),
    ("Columbus", "OH", "43004"),
    ("Portland", "OR", "97201"),
    ("Boston", "MA", "02108"),
]
MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
AREA_CODES = ["212", "415", "646", "312", "617", "206", "303", "512", "713", "404", "305", "702"]


def luhn_digit(digits: str) -> str:
    """The check digit that makes ``digits + d`` pass Luhn (ISO/IEC 7812-1 annex B)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 == 0 else 1)
        total += d - 9 if d > 9 else d
    return str((10 - total % 10) % 10)


def card(rng: random.Random) -> str:
    prefix, length = rng.choice([("4", 16), ("51", 16), ("55", 16), ("37", 15), ("6011", 16)])
    body = prefix + "".join(rng.choice(string.digits) for _ in range(length - len(prefix) - 1))
    number = body + luhn_digit(body)
    style = rng.randrange(3)
    if style == 0:
        return number
    sep = " " if style == 1 else "-"
    groups = [number[i : i + 4] for i in range(0, len(number), 4)]
    return sep.join(groups)


def iban(rng: random.Random) -> str:
    """An ISO 13616 IBAN with valid mod-97 check digits (German, British or French layout)."""
    country, bban = rng.choice(
        [
            ("DE", "".join(rng.choice(string.digits) for _ in range(18))),
            ("GB", "NWBK" + "".join(rng.choice(string.digits) for _ in range(14))),
            ("FR", "".join(rng.choice(string.digits) for _ in range(23))),
        ]
    )
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = 98 - int(numeric) % 97
    raw = f"{country}{check:02d}{bban}"
    return " ".join(raw[i : i + 4] for i in range(0, len(raw), 4)) if rng.random() < 0.5 else raw


def email(rng: random.Random) -> str:
    user = rng.choice(["jane.doe", "mike_r", "s.khan", "lena1987", "tom.b", "ana-maria"]) + str(
        rng.randrange(100)
    )
    return f"{user}@{rng.choice(['gmail.com', 'example.org', 'outlook.com', 'mail.co.uk', 'company.io'])}"


def phone(rng: random.Random) -> str:
    area, exchange, line = rng.choice(AREA_CODES), rng.randrange(201, 990), rng.randrange(10000)
    if exchange == 555:
        exchange = 556
    return rng.choice(
        [
            f"({area}) {exchange}-{line:04d}",
            f"{area}-{exchange}-{line:04d}",
            f"+1 {area} {exchange} {line:04d}",
            f"{area}.{exchange}.{line:04d}",
        ]
    )


def ssn(rng: random.Random) -> str:
    return f"{rng.randrange(101, 665):03d}-{rng.randrange(10, 99):02d}-{rng.randrange(1000, 9999):04d}"


def secret(rng: random.Random) -> tuple[str, str]:
    """``(sentence, value)``."""
    alnum = string.ascii_letters + string.digits
    kind = rng.randrange(4)
    if kind == 0:
        value = "AKIA" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(16))
        return f"my AWS key {value} stopped working", value
    if kind == 1:
        value = "ghp_" + "".join(rng.choice(alnum) for _ in range(36))
        return f"the token {value} was rejected", value
    if kind == 2:
        value = "".join(rng.choice(alnum) for _ in range(12))
        return f'my login is password="{value}"', value
    value = "sk_live_" + "".join(rng.choice(alnum) for _ in range(24))
    return f"our Stripe key is {value}", value


def address(rng: random.Random) -> str:
    city, state, zipcode = rng.choice(CITIES)
    line = f"{rng.randrange(1, 9999)} {rng.choice(STREETS)} {rng.choice(SUFFIXES)}"
    if rng.random() < 0.4:
        line += f", {rng.choice(['Apt', 'Suite', 'Unit'])} {rng.randrange(1, 500)}"
    return line + (f", {city}, {state} {zipcode}" if rng.random() < 0.7 else "")


def birth(rng: random.Random) -> tuple[str, str]:
    y, m, d = rng.randrange(1940, 2005), rng.randrange(1, 13), rng.randrange(1, 29)
    value = rng.choice(
        [f"{y}-{m:02d}-{d:02d}", f"{m:02d}/{d:02d}/{y}", f"{MONTHS[m - 1]} {d}, {y}", f"{d:02d}.{m:02d}.{y}"]
    )
    lead = rng.choice(["I was born on", "my date of birth is", "DOB:", "birthday (born)"])
    return f"{lead} {value}", value


def build(per_category: int, look_alikes: int, seed: int = 0) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """Labelled lines: ``(text, [(category, start, end), ...])`` (look-alike lines have no labels)."""
    if not CSV.exists():
        raise SystemExit(f"data not found: {CSV} (the shared Bitext set; see ../shared/data/README.md)")
    rows = list(csv.DictReader(CSV.open(encoding="utf-8")))
    rng = random.Random(seed)
    base = [r["instruction"].strip() for r in rows if r["instruction"].strip()]
    makers = {
        "CARD": lambda: (lambda v: (f"please charge my card {v}", v))(card(rng)),
        "IBAN": lambda: (lambda v: (f"refund to IBAN {v}", v))(iban(rng)),
        "EMAIL": lambda: (lambda v: (f"write to me at {v}", v))(email(rng)),
        "PHONE": lambda: (lambda v: (f"call me on {v}", v))(phone(rng)),
        "SSN": lambda: (lambda v: (f"my SSN is {v}", v))(ssn(rng)),
        "SECRET": lambda: secret(rng),
        "ADDRESS": lambda: (lambda v: (f"ship it to {v}", v))(address(rng)),
        "DOB": lambda: birth(rng),
        "ACCOUNT": lambda: (lambda v: (f"my account is {v}", v))(f"ACME-{rng.randrange(10**8):08d}"),
    }
    lines: list[tuple[str, list[tuple[str, int, int]]]] = []
    for category, make in makers.items():
        for _ in range(per_category):
            sentence, value = make()
            message = rng.choice(base)
            text = (
                f"{message} {sentence}."
                if rng.random() < 0.5
                else f"{sentence[0].upper()}{sentence[1:]}. {message}"
            )
            start = text.index(value)
            lines.append((text, [(category, start, start + len(value))]))
    with_ids = [r for r in rows if r["entity_type"] == "order_id"]
    for i in range(look_alikes):
        kind = i % 8
        message = rng.choice(with_ids)["instruction"] if kind == 0 else rng.choice(base)
        digits = "4" + "".join(rng.choice(string.digits) for _ in range(14))
        not_luhn = digits + str((int(luhn_digit(digits)) + 1) % 10)
        extra = [
            "",
            f"it cost ${rng.randrange(5, 900)}.{rng.randrange(100):02d} and I paid twice",
            f"I ordered it on {rng.randrange(2022, 2026)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}",
            f"it was due on {MONTHS[rng.randrange(12)]} {rng.randrange(1, 29)}, 2025",
            f"tracking number 1Z{rng.randrange(10**15):015d}",
            f"the number {not_luhn} on my invoice",
            f"ticket ACME-{rng.randrange(10**7):07d} is still open",
            f"I bought {rng.randrange(2, 40)} items for order {rng.randrange(10**5, 10**6)}",
        ][kind]
        lines.append((f"{message} {extra}".strip(), []))
    return lines


def score(detector: Detector, lines: list[tuple[str, list[tuple[str, int, int]]]]) -> dict[str, object]:
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    look_alike_hits, examples = 0, []
    t0 = time.perf_counter()
    for text, gold in lines:
        found = detector.find(text)
        matched = set()
        for f in found:
            hit = next((g for g in gold if g[0] == f.category and f.start < g[2] and g[1] < f.end), None)
            if hit is None:
                fp[f.category] += 1
                if len(examples) < 8:
                    examples.append((f.category, f.value, text[:90]))
            else:
                matched.add(hit)
        for g in gold:
            (tp if g in matched else fn)[g[0]] += 1
        if not gold and found:
            look_alike_hits += 1
    elapsed = time.perf_counter() - t0
    table = {}
    for c in sorted(set(tp) | set(fp) | set(fn)):
        p = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else float("nan")
        r = tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else float("nan")
        table[c] = {"tp": tp[c], "fp": fp[c], "fn": fn[c], "precision": round(p, 3), "recall": round(r, 3)}
    total_tp, total_fp, total_fn = sum(tp.values()), sum(fp.values()), sum(fn.values())
    return {
        "lines": len(lines),
        "labelled": sum(1 for _, g in lines if g),
        "look_alike_lines": sum(1 for _, g in lines if not g),
        "look_alike_lines_with_findings": look_alike_hits,
        "per_category": table,
        "precision": round(total_tp / max(1, total_tp + total_fp), 3),
        "recall": round(total_tp / max(1, total_tp + total_fn), 3),
        "ms_per_line": round(elapsed * 1000 / len(lines), 3),
        "false_positive_examples": examples,
    }


#: bodies built to be expensive for the detectors, by name: each a function of the target size in bytes
HOSTILE = {
    "card-like '4111 ' repeated": lambda n: "4111 " * (n // 5),
    "one digit run": lambda n: "7" * n,
    "digits and separators": lambda n: ("12-34 56.78/90 " * (n // 15 + 1))[:n],
    "e-mail-like fragments": lambda n: ("a.b@c.d-e_f@g " * (n // 14 + 1))[:n],
    "a customer message": lambda n: (
        "Hi, my order #W2378156 placed on 2024-05-01 for $129.99 has not arrived; call me back please. "
        * (n // 96 + 1)
    )[:n],
}


def scaling(detector: Detector, sizes_kb: list[int]) -> dict[str, dict[int, float]]:
    """µs per KB of :meth:`Detector.find` on each :data:`HOSTILE` body at each size (best of 2 runs)."""
    table: dict[str, dict[int, float]] = {}
    for name, make in HOSTILE.items():
        row = {}
        for kb in sizes_kb:
            text = make(kb * 1024)
            best = float("inf")
            for _ in range(2):
                t0 = time.perf_counter()
                detector.find(text)
                best = min(best, time.perf_counter() - t0)
            row[kb] = best * 1e6 / kb
        table[name] = row
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-category", type=int, default=25)
    p.add_argument("--look-alikes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--scaling",
        action="store_true",
        help="µs per KB of hostile bodies at growing sizes (no precision table)",
    )
    p.add_argument("--sizes-kb", type=int, nargs="+", default=[16, 64, 256, 1024])
    args = p.parse_args(argv)
    if args.scaling:
        detector = Detector(PrivacyConfig())
        detector.find("warm up 4111 1111 1111 1111")
        table = scaling(detector, args.sizes_kb)
        print(f"{'body':>28} " + " ".join(f"{kb:>8} KB" for kb in args.sizes_kb) + "   largest/smallest")
        for name, row in table.items():
            cells = " ".join(f"{row[kb]:>8.0f} µs" for kb in args.sizes_kb)
            print(f"{name:>28} {cells}   {row[args.sizes_kb[-1]] / row[args.sizes_kb[0]]:>6.2f}x")
        worst = max(max(row.values()) for row in table.values())
        print(
            f"(µs per KB; worst {worst:.0f} µs/KB: a 4 MiB body would take about {worst * 4096 / 1e6:.1f} s)"
        )
        if args.json:
            print(json.dumps(table))
        return 0
    lines = build(args.per_category, args.look_alikes, args.seed)
    t0 = time.perf_counter()
    detector = Detector(PrivacyConfig(patterns={"ACCOUNT": r"ACME-\d{8}"}))
    build_s = time.perf_counter() - t0
    detector.find(lines[0][0])  # warm-up (phonenumbers loads its metadata lazily)
    result = score(detector, lines)
    result["detector_build_s"] = round(build_s, 1)
    print(
        f"{result['lines']} lines ({result['labelled']} labelled, {result['look_alike_lines']} look-alikes)"
    )
    print(f"{'category':>9} {'precision':>9} {'recall':>7} {'tp':>4} {'fp':>4} {'fn':>4}")
    for c, row in result["per_category"].items():  # type: ignore[union-attr]
        print(
            f"{c:>9} {row['precision']:>9.3f} {row['recall']:>7.3f} {row['tp']:>4} {row['fp']:>4} {row['fn']:>4}"
        )
    print(f"{'all':>9} {result['precision']:>9.3f} {result['recall']:>7.3f}")
    print(
        f"look-alike lines with any finding: {result['look_alike_lines_with_findings']} of {result['look_alike_lines']}"
    )
    print(f"detection: {result['ms_per_line']} ms per line; detector built in {result['detector_build_s']} s")
    for example in result["false_positive_examples"]:  # type: ignore[union-attr]
        print("false positive:", example)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
