"""The read side of the SQL store: one keyset page of rollouts with their training reward and versions.

:meth:`RolloutPages.page_rollouts` answers :meth:`agentforge.ports.TraceStore.page_rollouts` with two
statements whatever the page: the page's rollouts (``WHERE seq < :before ORDER BY seq DESC LIMIT n``, each
with its training reward as a correlated subquery on the rewards' ``rollout_id`` index), then the LLM spans
of those rollouts only. Keyset paging after Winand, "Use The Index, Luke" ("Paging Through Results").

Filters on JSON columns (``version``, ``trainer_run``) match the compact JSON text the store writes
(``"policy":"policy@v3"``) with ``LIKE`` on both SQLite and PostgreSQL, then every matched row is checked on
the parsed value, so a look-alike inside another field never passes; such a page may hold fewer rows than
``limit`` (``next`` still continues after it).
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import and_, exists, or_
from sqlmodel import Session, col, select

from agentforge.queries import RolloutPage, RolloutQuery, RolloutSummary
from agentforge.stores.engine import Transactor
from agentforge.stores.tables import RewardRow, RolloutRow, SpanRow, row_to_rollout
from agentforge.types import Rollout, RolloutState

__all__ = ["RolloutPages"]


def _json_pair(key: str, value: str) -> str:
    """The text ``"key":"value"`` as the store's compact JSON writes it (ASCII-escaped like ``dumps``)."""
    return f"{json.dumps(key)}:{json.dumps(value)}"


def _reward_of_rollout() -> Any:
    """The training reward of the outer rollout row: the last ``final`` reward by sequence, else the last
    (the rule of ``final_reward``); ``NULL`` when it has none or it is invalid."""
    return (
        select(RewardRow.value)
        .where(RewardRow.rollout_id == RolloutRow.rollout_id)
        .order_by(col(RewardRow.final).desc(), col(RewardRow.seq).desc())
        .limit(1)
        .correlate(RolloutRow)
        .scalar_subquery()
    )


def _where(query: RolloutQuery, reward: Any) -> list[Any]:
    conds: list[Any] = []
    if query.before is not None:
        conds.append(col(RolloutRow.seq) < query.before)
    if query.agent is not None:
        conds.append(RolloutRow.agent == query.agent)
    if query.state is not None:
        conds.append(RolloutRow.state == RolloutState(query.state).value)
    if query.since is not None:
        conds.append(RolloutRow.created_at >= query.since)
    if query.until is not None:
        conds.append(RolloutRow.created_at < query.until)
    if query.min_reward is not None:
        conds.append(reward >= query.min_reward)
    if query.max_reward is not None:
        conds.append(reward <= query.max_reward)
    if query.trainer_run is not None:
        meta = col(RolloutRow.metadata_json)
        conds.append(meta.contains(_json_pair("trainer_run", query.trainer_run), autoescape=True))
    if query.version is not None:
        served = exists().where(
            and_(
                col(SpanRow.rollout_id) == col(RolloutRow.rollout_id),
                col(SpanRow.kind) == "llm",
                col(SpanRow.llm_json).contains(_json_pair("version", query.version), autoescape=True),
            )
        )
        pinned = col(RolloutRow.resources_json).contains(_json_pair("policy", query.version), autoescape=True)
        conds.append(or_(pinned, served))
    return conds


def _versions(s: Session, rollouts: list[Rollout]) -> dict[str, tuple[list[str], int]]:
    """Per rollout id: the versions of its LLM spans in order of first use, and how many it has."""
    ids = [r.rollout_id for r in rollouts]
    out: dict[str, tuple[list[str], int]] = {i: ([], 0) for i in ids}
    if not ids:
        return out
    q = (
        select(SpanRow.rollout_id, SpanRow.llm_json)
        .where(col(SpanRow.rollout_id).in_(ids), SpanRow.kind == "llm")
        .order_by(col(SpanRow.seq))
    )
    for rollout_id, llm_json in s.exec(q):
        assert rollout_id is not None  # one of ids
        seen, count = out[rollout_id]
        version = (json.loads(llm_json) if llm_json else {}).get("version") or ""
        if version and version not in seen:
            seen.append(version)
        out[rollout_id] = (seen, count + 1)
    return out


def _matches(query: RolloutQuery, row: RolloutSummary) -> bool:
    """The exact check of the JSON filters that SQL matched by text."""
    r = row.rollout
    if query.trainer_run is not None and r.metadata.get("trainer_run") != query.trainer_run:
        return False
    return (
        query.version is None or query.version in row.versions or r.resources.get("policy") == query.version
    )


class RolloutPages:
    """The page half of :class:`~agentforge.stores.sql.SQLStore` (which sets ``_tx``)."""

    _tx: Transactor

    def page_rollouts(self, query: RolloutQuery) -> RolloutPage:
        """See :meth:`agentforge.ports.TraceStore.page_rollouts` (keyset paging, newest first).

        Args:
            query: filters, cursor and page size.

        Returns:
            The page; ``next`` is ``None`` on the last one.
        """
        reward = _reward_of_rollout()

        def fn(s: Session) -> RolloutPage:
            q = select(RolloutRow, reward.label("reward")).where(*_where(query, reward))
            q = q.order_by(col(RolloutRow.seq).desc()).limit(query.limit + 1)
            rows = list(s.exec(q))
            more = len(rows) > query.limit
            rows = rows[: query.limit]
            rollouts = [row_to_rollout(row) for row, _ in rows]
            versions = _versions(s, rollouts)
            items = []
            for (row, value), rollout in zip(rows, rollouts, strict=True):
                assert row.seq is not None  # a stored row
                seen, calls = versions[rollout.rollout_id]
                if not seen and rollout.resources.get("policy"):
                    seen = [rollout.resources["policy"]]
                items.append(
                    RolloutSummary(
                        rollout=rollout, reward=value, versions=seen, llm_calls=calls, cursor=row.seq
                    )
                )
            nxt = rows[-1][0].seq if more and rows else None
            return RolloutPage(items=[i for i in items if _matches(query, i)], next=nxt)

        return self._tx.run(fn, write=False)
