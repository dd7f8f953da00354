"""Load the τ-retail v1 environment (database, policy, tasks) from the shared data folder.

The data is third-party (τ-bench, MIT (c) 2024 Sierra) and not shipped with the package; see
:func:`~agentforge.agents.customer_service.datasets.find_data_dir` for where it is looked up.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from agentforge.agents.customer_service.datasets import find_data_dir
from agentforge.agents.customer_service.tau_retail.db import TABLES, RetailData, RetailDB
from agentforge.agents.customer_service.tau_retail.tools import tool_schemas
from agentforge.errors import UserError
from agentforge.types import Task

__all__ = ["TauRetail", "load_tau_retail", "load_tau_tasks", "SPLITS", "DATASET"]

#: The task files of τ-retail v1, by split.
SPLITS: dict[str, str] = {"train": "tasks_train.json", "dev": "tasks_dev.json", "test": "tasks_test.json"}
#: ``metadata["dataset"]`` of every τ-retail v1 task.
DATASET = "tau_retail_v1"
Split = Literal["train", "dev", "test"]


def _folder(data_dir: str | Path | None, required: list[str]) -> Path:
    return find_data_dir("tau_retail/v1", "τ-retail", data_dir, required)


def load_tau_tasks(split: Split = "train", data_dir: str | Path | None = None) -> list[Task]:
    """Load one split of the τ-retail v1 tasks as :class:`~agentforge.types.Task` objects.

    Args:
        split: ``"train"`` (500, synthetic, write actions only), ``"dev"`` (20) or ``"test"`` (115).
        data_dir: the ``tau_retail/v1`` folder (default: ``$AGENTFORGE_DATA_DIR/tau_retail/v1`` or
            ``../shared/data/tau_retail/v1`` relative to the project root).

    Returns:
        Tasks with ``task_id = "tau_retail_v1/<split>/<index>"``, ``input = {"instruction", "user_id"}``
        (the simulated customer's brief and the customer's user id) and ``metadata = {"actions"`` (gold
        tool calls ``[{"name", "kwargs"}]``), ``"outputs"`` (strings the agent must say), ``"split"``,
        ``"index"``, ``"annotator"``, ``"dataset"}``.

    Raises:
        UserError: the data is missing or ``split`` is unknown.
    """
    if split not in SPLITS:
        raise UserError(f"unknown τ-retail split {split!r}; choose one of {', '.join(SPLITS)}")
    folder = _folder(data_dir, [SPLITS[split]])
    raw = json.loads((folder / SPLITS[split]).read_text(encoding="utf-8"))
    return [
        Task(
            task_id=f"{DATASET}/{split}/{index}",
            input={"instruction": item["instruction"], "user_id": item["user_id"]},
            metadata={
                "actions": item["actions"],
                "outputs": item.get("outputs", []),
                "split": split,
                "index": index,
                "annotator": item.get("annotator"),
                "dataset": DATASET,
            },
        )
        for index, item in enumerate(raw)
    ]


@dataclass(frozen=True, eq=False)
class TauRetail:
    """The loaded τ-retail v1 environment. One per process; every rollout takes its own :meth:`new_db`.

    Attributes:
        data_dir: the folder it was loaded from.
        data: the read-only database snapshot shared by all rollouts.
        wiki: the agent policy (``wiki.md``), for the system prompt or retrieval.
        rules: the short rule list (``rules.json``).
    """

    data_dir: Path
    data: RetailData
    wiki: str
    rules: list[str]
    _tasks: dict[str, list[Task]] = field(default_factory=dict, repr=False)

    def new_db(self) -> RetailDB:
        """Return a fresh, private database view for one rollout (O(1), copy-on-write)."""
        return RetailDB(self.data)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The 16 OpenAI function schemas (``tools.json``)."""
        return tool_schemas()

    def tasks(self, split: Split = "train") -> list[Task]:
        """The tasks of one split (loaded once, then cached; see :func:`load_tau_tasks`)."""
        if split not in self._tasks:
            self._tasks[split] = load_tau_tasks(split, self.data_dir)
        return list(self._tasks[split])


@functools.lru_cache(maxsize=4)
def _load(folder: Path) -> TauRetail:
    tables = {name: json.loads((folder / f"{name}.json").read_text(encoding="utf-8")) for name in TABLES}
    rules_path = folder / "rules.json"
    wiki_path = folder / "wiki.md"
    return TauRetail(
        data_dir=folder,
        data=RetailData(tables),
        wiki=wiki_path.read_text(encoding="utf-8") if wiki_path.is_file() else "",
        rules=json.loads(rules_path.read_text(encoding="utf-8")) if rules_path.is_file() else [],
    )


def load_tau_retail(data_dir: str | Path | None = None) -> TauRetail:
    """Load the τ-retail v1 environment once per folder and process (about 0.15 s the first time).

    Args:
        data_dir: the ``tau_retail/v1`` folder holding ``users.json``, ``orders.json``,
            ``products.json`` (default: ``$AGENTFORGE_DATA_DIR/tau_retail/v1``, else
            ``../shared/data/tau_retail/v1`` relative to the project root).

    Returns:
        The shared :class:`TauRetail` (the same object on every call with the same folder).

    Raises:
        UserError: "τ-retail data not found at ...; set AGENTFORGE_DATA_DIR".
    """
    folder = _folder(data_dir, [f"{name}.json" for name in TABLES])
    return _load(folder.resolve())
