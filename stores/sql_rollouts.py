"""The rollout queue of the SQL store: enqueue, claim, heartbeats, attempts and retries.

The state machine is :data:`agentforge.types.ROLLOUT_TRANSITIONS`; every state change here goes through
:func:`~agentforge.types.check_transition`. Locking and retries: :mod:`agentforge.stores.engine`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import update
from sqlmodel import Session, col, select

from agentforge.errors import InvalidTransitionError, NotFoundError, UserError
from agentforge.stores.engine import Transactor, attempt_row, rollout_row
from agentforge.stores.tables import (
    AttemptRow,
    RolloutRow,
    attempt_to_row,
    dumps,
    ident,
    plain,
    rollout_to_row,
    row_to_attempt,
    row_to_rollout,
)
from agentforge.types import Attempt, AttemptState, Reward, Rollout, RolloutState, Span, check_transition, now

if TYPE_CHECKING:
    from agentforge.stores.writer import GroupCommitWriter

__all__ = ["CommitListener", "RolloutQueue", "close_rollout"]

logger = logging.getLogger("agentforge.stores")

_UPDATABLE = {"metadata", "resources", "state", "error"}


class _RolloutUpdate(BaseModel):
    """The types :meth:`RolloutQueue.update_rollout` takes (strict: no ``1`` for ``"1"``)."""

    model_config = ConfigDict(strict=True)

    # defaults are never validated nor dumped (exclude_unset): only given fields are checked and applied
    state: Annotated[RolloutState, Field(strict=False)] = None  # type: ignore[assignment]  # or its name
    metadata: dict[str, Any] = None  # type: ignore[assignment]
    resources: dict[str, str] = None  # type: ignore[assignment]
    error: str | None = None


def close_rollout(ro: RolloutRow, att: AttemptRow, state: AttemptState, error: str | None, t: float) -> None:
    """Move the running rollout after its current attempt ended in ``state``."""
    if ro.state != RolloutState.running.value or att.number != ro.attempts:
        return
    if state is AttemptState.succeeded:
        target, ro.error = RolloutState.succeeded, None
    else:
        terminal = RolloutState.timed_out if state is AttemptState.timed_out else RolloutState.failed
        target = RolloutState.queued if ro.attempts < ro.max_attempts else terminal
        ro.error = error if error is not None else ro.error
    check_transition(RolloutState(ro.state), target)
    ro.state, ro.updated_at = target.value, t


class CommitListener(Protocol):
    """What a store tells after it committed (e.g. :class:`~agentforge.stores.otlp.OTLPExport`).

    Both methods are called on the committing thread (the writer thread, or the caller of a rollout method)
    after the commit: they must return at once (queue the work for a thread of their own) and not raise.
    """

    def committed(self, items: Sequence[Span | Reward]) -> None:
        """Spans and rewards of one committed batch, as stored (``sequence`` and ``attempt_id`` set)."""
        ...

    def rollouts_changed(self, rollout_ids: Sequence[str]) -> None:
        """Rollouts whose attempts or state may have changed (``finish_attempt``, ``update_rollout`` of a state,
        ``requeue_stale``); the listener reads them itself if it needs to."""
        ...

    def close(self) -> None:
        """The store is closing (its writer has written everything): finish up within a bounded time."""
        ...


class RolloutQueue:
    """The rollout half of :class:`~agentforge.stores.sql.SQLStore` (which sets ``_tx`` and ``_writer``)."""

    _tx: Transactor
    _writer: GroupCommitWriter[Span | Reward, Span | Reward]
    #: Told after every commit of this store; ``None`` (default): nobody (see :meth:`listen`).
    listener: CommitListener | None = None

    def listen(self, listener: CommitListener | None) -> None:
        """Tell ``listener`` what this store commits from now on (``None``: stop telling anyone).

        Args:
            listener: gets each committed batch of spans and rewards (on the writer thread) and the ids of
                rollouts whose attempts or state changed (on the caller's thread, after the commit).
        """
        self.listener = listener
        self._writer.on_commit = None if listener is None else listener.committed

    def _changed(self, rollout_ids: Sequence[str]) -> None:
        if (listener := self.listener) is not None and rollout_ids:
            try:
                listener.rollouts_changed(rollout_ids)
            except Exception:
                logger.exception(
                    "the commit listener failed on rollouts %s (they are committed)", rollout_ids
                )

    # --- rollouts ---------------------------------------------------------------------------------
    def enqueue_rollout(self, rollout: Rollout) -> Rollout:
        """Store ``rollout`` in state ``queued`` with 0 attempts; idempotent by ``rollout_id``.

        Returns:
            The stored rollout (the existing one, unchanged, if the id was already present).

        Raises:
            UserError: a scalar field holds ``NUL`` or a lone surrogate.
        """
        fresh = rollout.model_copy(update={"state": RolloutState.queued, "attempts": 0})
        row = rollout_to_row(fresh)

        def fn(s: Session) -> Rollout:
            existing = s.exec(select(RolloutRow).where(RolloutRow.rollout_id == rollout.rollout_id)).first()
            if existing is not None:
                return row_to_rollout(existing)
            s.add(row)
            s.flush()
            return row_to_rollout(row)

        return self._tx.run(fn, write=True)

    def get_rollout(self, rollout_id: str) -> Rollout:
        """Return the rollout. Raises: ``NotFoundError``."""
        return self._tx.run(lambda s: row_to_rollout(rollout_row(s, rollout_id)), write=False)

    def list_rollouts(
        self,
        state: RolloutState | None = None,
        group_id: str | None = None,
        agent: str | None = None,
        since: float | None = None,
        limit: int | None = None,
        *,
        tenant: str | None = None,
        after: str | None = None,
    ) -> list[Rollout]:
        """Rollouts filtered by state / group / agent / ``created_at >= since`` (epoch seconds) / tenant,
        oldest (first enqueued) first, at most ``limit``; ``after``: enqueued after that rollout id (keyset).

        Raises:
            NotFoundError: ``after`` names no rollout (of ``tenant``, when given).
        """
        q = select(RolloutRow)
        if tenant is not None:
            q = q.where(RolloutRow.tenant == tenant)
        if state is not None:
            q = q.where(RolloutRow.state == RolloutState(state).value)
        if group_id is not None:
            q = q.where(RolloutRow.group_id == group_id)
        if agent is not None:
            q = q.where(RolloutRow.agent == agent)
        if since is not None:
            q = q.where(RolloutRow.created_at >= since)
        q = q.order_by(col(RolloutRow.seq))
        if limit is not None:
            q = q.limit(limit)

        def fn(s: Session) -> list[Rollout]:
            page = q
            if after is not None:
                cursor = rollout_row(s, after)
                if tenant is not None and cursor.tenant != tenant:  # not visible: the same answer as unknown
                    raise NotFoundError(f"rollout {after!r} does not exist")
                page = q.where(col(RolloutRow.seq) > cursor.seq)
            return [row_to_rollout(r) for r in s.exec(page)]

        return self._tx.run(fn, write=False)

    def claim_rollout(
        self, worker_id: str, agent: str | None = None, *, attempt_id: str | None = None
    ) -> tuple[Rollout, Attempt] | None:
        """Atomically move the oldest queued rollout (of ``agent``, if given) to ``running`` and open
        attempt number ``attempts + 1`` for ``worker_id``.

        Args:
            worker_id: the claiming worker.
            agent: only rollouts of this agent.
            attempt_id: the new attempt's id (default: a fresh one). When an attempt of ``worker_id`` with this
                id exists, the claim already happened (its answer was lost on the way back): that attempt and
                its rollout are returned and nothing else is claimed.

        Returns:
            ``(rollout, attempt)``, or ``None`` when nothing is queued.

        Raises:
            InvalidTransitionError: ``attempt_id`` names another worker's attempt.
        """
        plain("worker_id", worker_id)
        if attempt_id is not None:
            ident("attempt_id", attempt_id)

        def fn(s: Session) -> tuple[Rollout, Attempt] | None:
            if attempt_id is not None:
                done = s.get(AttemptRow, attempt_id)
                if done is not None:
                    if done.worker_id != worker_id:
                        raise InvalidTransitionError(f"attempt {attempt_id!r} belongs to another worker")
                    return row_to_rollout(rollout_row(s, done.rollout_id)), row_to_attempt(done)
            q = select(RolloutRow).where(RolloutRow.state == RolloutState.queued.value)
            if agent is not None:
                q = q.where(RolloutRow.agent == agent)
            row = s.exec(q.order_by(col(RolloutRow.seq)).limit(1).with_for_update(skip_locked=True)).first()
            if row is None:
                return None
            t = now()
            row.state, row.attempts, row.updated_at = RolloutState.running.value, row.attempts + 1, t
            given: dict[str, Any] = {"attempt_id": attempt_id} if attempt_id is not None else {}
            attempt = Attempt(
                rollout_id=row.rollout_id,
                number=row.attempts,
                worker_id=worker_id,
                started_at=t,
                heartbeat_at=t,
                **given,
            )
            s.add(row)
            s.add(attempt_to_row(attempt))
            s.flush()
            return row_to_rollout(row), attempt

        return self._tx.run(fn, write=True)

    def heartbeat(self, attempt_id: str) -> None:
        """Set a running attempt's ``heartbeat_at`` to now (a finished attempt is left unchanged).

        Raises:
            NotFoundError: unknown attempt.
        """

        def fn(s: Session) -> None:
            att = attempt_row(s, attempt_id)
            if att.state == AttemptState.running.value:
                s.exec(
                    update(AttemptRow)
                    .where(col(AttemptRow.attempt_id) == attempt_id)
                    .values(heartbeat_at=now())
                )

        self._tx.run(fn, write=True)

    def finish_attempt(self, attempt_id: str, state: AttemptState, error: str | None = None) -> Rollout:
        """Close a running attempt and move its rollout (retry rule in the protocol docstring).

        ``succeeded`` → rollout ``succeeded`` (``error`` cleared). ``failed``/``timed_out``/``abandoned``
        → rollout ``queued`` while ``attempts < max_attempts`` (``error`` kept), else ``failed`` (or
        ``timed_out``). An attempt that is no longer running is left unchanged.

        Returns:
            The rollout after the change.

        Raises:
            NotFoundError: unknown attempt.
            InvalidTransitionError: ``state`` is ``running``.
        """
        state = AttemptState(state)
        if state is AttemptState.running:
            raise InvalidTransitionError("finish_attempt needs a terminal state, got 'running'")
        plain("error", error)

        def fn(s: Session) -> Rollout:
            att = attempt_row(s, attempt_id, lock=True)
            ro = rollout_row(s, att.rollout_id, lock=True)
            if att.state == AttemptState.running.value:
                t = now()
                att.state, att.error, att.ended_at = state.value, error, t
                close_rollout(ro, att, state, error, t)
                s.add(att)
                s.add(ro)
                s.flush()
            return row_to_rollout(ro)

        rollout = self._tx.run(fn, write=True)
        self._changed((rollout.rollout_id,))
        return rollout

    def requeue_stale(self, heartbeat_timeout_s: float) -> list[str]:
        """Abandon running attempts whose last heartbeat is older than ``heartbeat_timeout_s`` seconds;
        their rollouts go back to ``queued`` (or ``failed`` when out of attempts).

        Returns:
            Ids of the affected rollouts, in attempt order.
        """
        cutoff = now() - heartbeat_timeout_s
        message = f"heartbeat lost: no heartbeat for more than {heartbeat_timeout_s:g} s"

        def fn(s: Session) -> list[str]:
            q = (
                select(AttemptRow)
                .where(AttemptRow.state == AttemptState.running.value, AttemptRow.heartbeat_at < cutoff)
                .order_by(col(AttemptRow.started_at))
                .with_for_update(skip_locked=True)
            )
            affected = []
            for att in s.exec(q).all():
                ro = rollout_row(s, att.rollout_id, lock=True)
                t = now()
                att.state, att.error, att.ended_at = AttemptState.abandoned.value, message, t
                close_rollout(ro, att, AttemptState.abandoned, message, t)
                s.add(att)
                s.add(ro)
                affected.append(ro.rollout_id)
            s.flush()
            return affected

        affected = self._tx.run(fn, write=True)
        self._changed(affected)
        return affected

    def update_rollout(self, rollout_id: str, **fields: Any) -> Rollout:
        """Update ``metadata``, ``resources``, ``error`` or ``state``.

        A ``state`` change is checked against :data:`~agentforge.types.ROLLOUT_TRANSITIONS` (setting the
        current state again is a no-op); leaving ``running`` closes the running attempt (``queued`` →
        ``abandoned``, otherwise the same state).

        Raises:
            NotFoundError: unknown rollout.
            InvalidTransitionError: the state change is not an edge of the table.
            UserError: another field was given, or one of the wrong type (``state`` a state name,
                ``metadata`` a JSON object, ``resources`` an object of strings, ``error`` a string or ``None``).
        """
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise UserError(f"update_rollout cannot change {sorted(unknown)}; allowed: {sorted(_UPDATABLE)}")
        try:
            fields = _RolloutUpdate.model_validate(fields).model_dump(exclude_unset=True)
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in err["loc"])
            raise UserError(f"update_rollout: {where}: {err['msg']} (got {err.get('input')!r:.80})") from None
        plain("error", fields.get("error"))

        def fn(s: Session) -> Rollout:
            running_q = select(AttemptRow).where(
                AttemptRow.rollout_id == rollout_id, AttemptRow.state == AttemptState.running.value
            )
            running = s.exec(running_q.with_for_update()).all()
            ro = rollout_row(s, rollout_id, lock=True)
            t = now()
            if "state" in fields and RolloutState(fields["state"]).value != ro.state:
                target = RolloutState(fields["state"])
                check_transition(RolloutState(ro.state), target)
                if ro.state == RolloutState.running.value:
                    att_state = (
                        AttemptState.abandoned if target is RolloutState.queued else AttemptState(target)
                    )
                    for att in running:
                        att.state, att.ended_at = att_state.value, t
                        s.add(att)
                ro.state = target.value
            if "metadata" in fields:
                ro.metadata_json = dumps(fields["metadata"])
            if "resources" in fields:
                ro.resources_json = dumps(fields["resources"])
            if "error" in fields:
                ro.error = fields["error"]
            ro.updated_at = t
            s.add(ro)
            s.flush()
            return row_to_rollout(ro)

        rollout = self._tx.run(fn, write=True)
        if "state" in fields:
            self._changed((rollout_id,))
        return rollout

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """All attempts of a rollout, by number. Raises: ``NotFoundError``."""

        def fn(s: Session) -> list[Attempt]:
            rollout_row(s, rollout_id)
            q = select(AttemptRow).where(AttemptRow.rollout_id == rollout_id).order_by(col(AttemptRow.number))
            return [row_to_attempt(r) for r in s.exec(q)]

        return self._tx.run(fn, write=False)
