"""Where the customer-service data lives, and loaders for the intent (triage) data sets.

The data is third-party and is not shipped with the package (see ``../shared/data/README.md`` and
``PROVENANCE.json`` there). A folder is found, in order, at:

1. the ``data_dir`` argument (the data set's own folder, e.g. ``.../banking77``);
2. ``$AGENTFORGE_DATA_DIR/<name>`` when the environment variable is set;
3. ``../shared/data/<name>`` relative to the project root (the checkout holding ``pyproject.toml``),
   then relative to the current directory.

A missing folder raises :class:`~agentforge.errors.UserError` naming the paths tried and the variable to set.

Every loader returns :class:`~agentforge.types.Task` objects with ``input = {"text": utterance}`` and
``metadata = {"dataset", "split", "index", "intent", ...}``; gold intents are the data set's own labels,
except CLINC150's out-of-scope label ``oos``, which becomes :data:`ESCALATE` (hand over to a human).
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from agentforge.errors import UserError
from agentforge.types import Task

__all__ = [
    "DATA_DIR_ENV",
    "ESCALATE",
    "find_data_dir",
    "load_bitext",
    "load_banking77",
    "load_clinc150",
    "intent_labels",
    "bitext_triage_tasks",
]

#: Environment variable naming the folder that holds ``tau_retail/``, ``banking77/``, ….
DATA_DIR_ENV = "AGENTFORGE_DATA_DIR"
#: The triage label for "hand over to a human" (CLINC150's out-of-scope queries map to it).
ESCALATE = "escalate"
_CLINC_OOS = "oos"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


def find_data_dir(
    name: str, label: str, data_dir: str | Path | None = None, required: Sequence[str] = ()
) -> Path:
    """Resolve the folder of one data set.

    Args:
        name: the folder below the data root, e.g. ``"tau_retail/v1"`` or ``"clinc150"``.
        label: the human name used in the error message, e.g. ``"τ-retail"``.
        data_dir: the data set's own folder; when given, no other place is tried.
        required: file names that must exist in the folder.

    Returns:
        The first candidate folder that holds every ``required`` file.

    Raises:
        UserError: no candidate qualifies; the message lists the paths tried and says to set
            ``AGENTFORGE_DATA_DIR``.
    """
    if data_dir is not None:
        candidates = [Path(data_dir).expanduser()]
    elif os.environ.get(DATA_DIR_ENV):
        candidates = [Path(os.environ[DATA_DIR_ENV]).expanduser() / name]
    else:
        roots = [_PROJECT_ROOT] if (_PROJECT_ROOT / "pyproject.toml").is_file() else []
        roots.append(Path.cwd())
        candidates = list(dict.fromkeys((root.parent / "shared" / "data" / name).resolve() for root in roots))
    for folder in candidates:
        if folder.is_dir() and all((folder / f).is_file() for f in required):
            return folder
    tried = " or ".join(str(c) for c in candidates)
    raise UserError(
        f"{label} data not found at {tried}; set {DATA_DIR_ENV} to the folder that holds {name}/ "
        f"(with {', '.join(required) or 'its files'}) or pass data_dir="
    )


def _in_test_split(text: str, test_fraction: float) -> bool:
    # Deterministic split by content: the same utterance always lands in the same split.
    bucket = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "big") / 2**32
    return bucket < test_fraction


def load_bitext(
    split: Literal["all", "train", "test"] = "all",
    data_dir: str | Path | None = None,
    test_fraction: float = 0.1,
) -> list[Task]:
    """Load the Bitext customer-support sample: 4,514 utterances, 27 intents, entity spans.

    The upstream file has no split; ``"train"``/``"test"`` are a deterministic split by a hash of the
    utterance (``test_fraction`` of them in test). The gold entity is the span
    ``instruction[start_offset:end_offset]`` — the upstream ``entity_value`` column lost leading zeros
    and digits for 591 rows (e.g. span ``00004587345``, value ``4587345``).

    Args:
        split: which rows to return.
        data_dir: the ``bitext_customer_support`` folder (default: see the module docstring).
        test_fraction: share of rows in the test split, in (0, 1).

    Returns:
        Tasks with ``input={"text"}`` and metadata ``intent``, ``category``, ``entity_type``,
        ``entity`` (span text or ``None``), ``order_id`` (the span when the entity is an order id, else
        ``None``), ``response`` (reference reply), ``dataset``, ``split``, ``index`` (row number).

    Raises:
        UserError: the data is missing, or ``split``/``test_fraction`` is invalid.
    """
    if split not in ("all", "train", "test") or not 0 < test_fraction < 1:
        raise UserError(
            f"load_bitext: split must be all|train|test and 0<test_fraction<1; got {split!r}, {test_fraction}"
        )
    csv_name = "Bitext_Sample_Customer_Support_Training_Dataset.csv"
    folder = find_data_dir("bitext_customer_support", "Bitext customer-support", data_dir, [csv_name])
    tasks = []
    with open(folder / csv_name, newline="", encoding="utf-8") as fh:
        for index, row in enumerate(csv.DictReader(fh)):
            text = row["instruction"]
            row_split = "test" if _in_test_split(text, test_fraction) else "train"
            if split != "all" and row_split != split:
                continue
            entity = text[int(row["start_offset"]) : int(row["end_offset"])] if row["entity_type"] else None
            metadata = {
                "dataset": "bitext",
                "split": row_split,
                "index": index,
                "intent": row["intent"],
                "category": row["category"],
                "entity_type": row["entity_type"] or None,
                "entity": entity,
                "order_id": entity if row["entity_type"] == "order_id" else None,
                "response": row["response"],
            }
            tasks.append(Task(task_id=f"bitext/{index}", input={"text": text}, metadata=metadata))
    return tasks


def load_banking77(
    split: Literal["train", "test"] = "train", data_dir: str | Path | None = None
) -> list[Task]:
    """Load Banking77: banking queries labelled with 77 intents (train 10,003 / test 3,080).

    Args:
        split: ``"train"`` or ``"test"`` (the upstream files).
        data_dir: the ``banking77`` folder (default: see the module docstring).

    Returns:
        Tasks with ``input={"text"}`` and metadata ``intent``, ``dataset``, ``split``, ``index``.

    Raises:
        UserError: the data is missing or ``split`` is invalid.
    """
    if split not in ("train", "test"):
        raise UserError(f"load_banking77: split must be 'train' or 'test', got {split!r}")
    folder = find_data_dir("banking77", "Banking77", data_dir, [f"{split}.csv"])
    with open(folder / f"{split}.csv", newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return [
        Task(
            task_id=f"banking77/{split}/{i}",
            input={"text": row["text"]},
            metadata={"dataset": "banking77", "split": split, "index": i, "intent": row["category"]},
        )
        for i, row in enumerate(rows)
    ]


def load_clinc150(
    split: Literal["train", "val", "test"] = "train",
    data_dir: str | Path | None = None,
    include_oos: bool = True,
) -> list[Task]:
    """Load CLINC150 (``data_full``): 150 in-scope intents plus out-of-scope queries.

    Out-of-scope queries (upstream label ``oos``, kept in ``metadata["raw_intent"]``) get the intent
    :data:`ESCALATE`; they follow the in-scope rows of the same split.

    Args:
        split: ``"train"`` (15,000 + 100 oos), ``"val"`` (3,000 + 100) or ``"test"`` (4,500 + 1,000).
        data_dir: the ``clinc150`` folder (default: see the module docstring).
        include_oos: also return the out-of-scope rows.

    Returns:
        Tasks with ``input={"text"}`` and metadata ``intent``, ``raw_intent``, ``domain`` (``None`` for
        out-of-scope), ``dataset``, ``split``, ``index`` (position in the returned list).

    Raises:
        UserError: the data is missing or ``split`` is invalid.
    """
    if split not in ("train", "val", "test"):
        raise UserError(f"load_clinc150: split must be 'train', 'val' or 'test', got {split!r}")
    folder = find_data_dir("clinc150", "CLINC150", data_dir, ["data_full.json", "domains.json"])
    data = json.loads((folder / "data_full.json").read_text(encoding="utf-8"))
    domains = json.loads((folder / "domains.json").read_text(encoding="utf-8"))
    domain_of = {intent: domain for domain, intents in domains.items() for intent in intents}
    rows = list(data[split]) + (list(data[f"oos_{split}"]) if include_oos else [])
    tasks = []
    for i, (text, raw) in enumerate(rows):
        intent = ESCALATE if raw == _CLINC_OOS else raw
        metadata = {
            "dataset": "clinc150",
            "split": split,
            "index": i,
            "intent": intent,
            "raw_intent": raw,
            "domain": domain_of.get(raw),
        }
        tasks.append(Task(task_id=f"clinc150/{split}/{i}", input={"text": text}, metadata=metadata))
    return tasks


def intent_labels(
    dataset: Literal["bitext", "banking77", "clinc150"], data_dir: str | Path | None = None
) -> list[str]:
    """Return the sorted label set of a data set (CLINC150's includes :data:`ESCALATE`).

    Args:
        dataset: ``"bitext"``, ``"banking77"`` or ``"clinc150"``.
        data_dir: the data set's folder (default: see the module docstring).

    Returns:
        Sorted intent labels, e.g. 27 for Bitext, 77 for Banking77, 151 for CLINC150.

    Raises:
        UserError: unknown data set name or missing data.
    """
    if dataset == "bitext":
        return sorted({t.metadata["intent"] for t in load_bitext(data_dir=data_dir)})
    if dataset == "banking77":
        folder = find_data_dir("banking77", "Banking77", data_dir, ["categories.json"])
        return sorted(json.loads((folder / "categories.json").read_text(encoding="utf-8")))
    if dataset == "clinc150":
        folder = find_data_dir("clinc150", "CLINC150", data_dir, ["domains.json"])
        domains = json.loads((folder / "domains.json").read_text(encoding="utf-8"))
        return sorted({intent for intents in domains.values() for intent in intents} | {ESCALATE})
    raise UserError(f"unknown intent data set {dataset!r}; choose bitext, banking77 or clinc150")


def bitext_triage_tasks(
    train_size: int,
    eval_size: int,
    *,
    seed: int = 1234,
    train_temperature: float = 1.0,
    balanced: bool = False,
) -> tuple[list[Task], list[Task]]:
    """Bitext train/test splits (disjoint by construction) as category-triage tasks for ``triage_agent``.

    Args:
        train_size: training messages (sampled with ``input["temperature"] = train_temperature``).
        eval_size: held-out messages from the test split (greedy: ``input["temperature"] = 0.0``).
        seed: shuffling seed; the same seed gives the same tasks.
        train_temperature: sampling temperature of the training rollouts.
        balanced: draw the training messages round-robin over the categories, so each category has the
            same count (±1) as long as it has messages left. Bitext is skewed (``account`` is the largest
            category), and with an exact-match reward "always answer the largest category" is a
            zero-variance trap for GRPO; balancing makes that answer pay the least. The held-out set
            keeps the natural distribution.

    Returns:
        ``(train, held_out)``: tasks with ``task_id = "bitext-<index>"``, ``input = {"text",
        "temperature"}`` and ``metadata = {"label": <category, lower case>, "dataset", "split"}``.

    Raises:
        UserError: the Bitext folder is missing (see :func:`find_data_dir`).
    """
    import random

    def task(t: Task, temperature: float) -> Task:
        return Task(
            task_id=f"bitext-{t.metadata['index']}",
            input={"text": t.input["text"], "temperature": temperature},
            metadata={
                "label": str(t.metadata["category"]).lower(),
                "dataset": "bitext",
                "split": t.metadata["split"],
            },
        )

    rng = random.Random(seed)
    train, test = load_bitext("train"), load_bitext("test")
    rng.shuffle(train)
    rng.shuffle(test)
    if balanced:
        by_category: dict[str, list[Task]] = {}
        for t in train:
            by_category.setdefault(str(t.metadata["category"]), []).append(t)
        queues = [by_category[c] for c in sorted(by_category)]
        train = [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]
    return [task(t, train_temperature) for t in train[:train_size]], [task(t, 0.0) for t in test[:eval_size]]
