"""Read-side queries over the trace store: one page of rollouts with what a person looks at first.

:meth:`agentforge.ports.TraceStore.page_rollouts` takes a :class:`RolloutQuery` and answers a
:class:`RolloutPage` of :class:`RolloutSummary` rows, newest first. Paging is by **keyset** (Winand, "Use The
Index, Luke", ch. "Paging Through Results": ``WHERE seq < :cursor ORDER BY seq DESC LIMIT n``), so page 2000
of 100,000 rollouts costs what page 1 costs, unlike ``OFFSET``. The dashboard's rollouts table and any
client that browses a big store use it; the HTTP store server carries the same models as JSON.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentforge.errors import UserError
from agentforge.types import Rollout, RolloutState

__all__ = ["RolloutQuery", "RolloutSummary", "RolloutPage", "MAX_PAGE"]

#: The most rows one page may ask for.
MAX_PAGE = 500


class RolloutQuery(BaseModel):
    """Which rollouts, and which page of them (all filters are optional and combine with AND).

    Attributes:
        agent: only this agent's rollouts.
        state: only rollouts in this state.
        min_reward: training reward (``final_reward``'s rule) at least this; unscored rollouts drop out.
        max_reward: training reward at most this; unscored rollouts drop out.
        version: served by this policy version (``policy@v3``): pinned in ``resources["policy"]`` or named on
            one of its LLM spans.
        since: created at or after this time (epoch seconds).
        until: created before this time (epoch seconds).
        trainer_run: only rollouts a training run enqueued (``metadata["trainer_run"]``).
        before: the keyset cursor: only rollouts enqueued before the one with this cursor
            (:attr:`RolloutPage.next`); ``None``: from the newest.
        limit: rows per page, 1 to :data:`MAX_PAGE`.
    """

    model_config = ConfigDict(extra="forbid")

    agent: str | None = None
    state: RolloutState | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    version: str | None = None
    since: float | None = None
    until: float | None = None
    trainer_run: str | None = None
    before: int | None = Field(default=None, ge=0)
    limit: int = Field(default=50, ge=1, le=MAX_PAGE)

    @model_validator(mode="after")
    def _ordered(self) -> RolloutQuery:
        if self.min_reward is not None and self.max_reward is not None and self.min_reward > self.max_reward:
            raise UserError(f"min_reward {self.min_reward} is above max_reward {self.max_reward}")
        return self


class RolloutSummary(BaseModel):
    """One row of a page: the rollout and what the table shows beside it.

    Attributes:
        rollout: the stored rollout.
        reward: its training reward (``final_reward``'s value; ``None`` when unscored or invalid).
        versions: policy versions named on its LLM spans, in order of first use (its pin when it made none).
        llm_calls: LLM spans recorded for it.
        cursor: its keyset position; pass it as :attr:`RolloutQuery.before` to continue after it.
    """

    rollout: Rollout
    reward: float | None = None
    versions: list[str] = Field(default_factory=list)
    llm_calls: int = 0
    cursor: int


class RolloutPage(BaseModel):
    """One page of rollouts, newest first.

    Attributes:
        items: the rows, at most ``limit``.
        next: the cursor of the next (older) page, ``None`` on the last page.
    """

    items: list[RolloutSummary] = Field(default_factory=list)
    next: int | None = None
