"""One tenant's view of a trace store: what the HTTP store API serves a request that presents a tenant key.

:class:`TenantView` wraps any :class:`~agentforge.ports.TraceStore` for one tenant (:mod:`agentforge.stores.tenants`):

* **reads** see only that tenant's rollouts (``list_rollouts`` is a query on the tenant column), and the spans,
  attempts and rewards of those rollouts; another tenant's rollout is a ``NotFoundError``, exactly like an id that
  does not exist, so a tenant cannot even learn which ids others use;
* **writes** are stamped with the tenant (a rollout, span or reward naming another tenant is refused), and spans
  and rewards may only name the tenant's own rollouts;
* **pins and resources**: a rollout may pin only shared versions (``policy@v3``) or the tenant's own lineage
  (``policy@acme/v3``); resources of other tenants' lineages are neither listed nor readable;
* **worker and admin verbs** (claim, heartbeat, finish, requeue, page, publish, activate) are refused with
  :class:`TenantForbidden` (403): runners and trainers hold the store key, publishing needs the admin key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentforge.errors import AgentForgeError, InvalidTransitionError, NotFoundError, UserError
from agentforge.ports import TraceStore
from agentforge.stores.wire import write_accepted
from agentforge.types import Attempt, ResourceVersion, Reward, Rollout, Span, SpanKind, tenant_of_name

__all__ = ["IdInUseError", "TenantForbidden", "TenantView"]


class TenantForbidden(UserError):
    """A tenant key asked for something only the store key or the admin key may do (HTTP 403)."""


class IdInUseError(InvalidTransitionError):
    """A tenant's write named an id the store holds for a record the tenant cannot read (HTTP 409)."""


#: resource names of the store's own records, about every tenant: no tenant key lists or reads them
_STORE_LOGS = ("privacy:", "metrics:")


def _id_of(item: Any) -> str:
    return str(getattr(item, f"{type(item).__name__.lower()}_id", "?"))


class TenantView:
    """``store`` as tenant ``tenant`` may see and change it (see the module docstring).

    Args:
        store: the whole store.
        tenant: the tenant the caller's key acts for.
    """

    def __init__(self, store: TraceStore, tenant: str) -> None:
        self.store, self.tenant = store, tenant

    # --- checks -----------------------------------------------------------------------------------
    def _owned(self, rollout_id: str) -> Rollout:
        rollout = self.store.get_rollout(rollout_id)
        if rollout.tenant != self.tenant:
            raise NotFoundError(f"rollout {rollout_id!r} does not exist")
        return rollout

    def _pins(self, resources: dict[str, str]) -> None:
        for name, value in resources.items():
            if tenant_of_name(str(value)) not in (None, self.tenant):
                raise TenantForbidden(
                    f"tenant {self.tenant!r} cannot pin {name}={value!r}: it is another tenant's version"
                )

    def _stamp(self, item: Any, what: str) -> Any:
        if item.tenant not in (None, self.tenant):
            raise TenantForbidden(f"tenant {self.tenant!r} cannot write a {what} of tenant {item.tenant!r}")
        return item.model_copy(update={"tenant": self.tenant})

    def _item(self, item: Span | Reward) -> Span | Reward:
        if item.rollout_id is not None:
            self._owned(item.rollout_id)
        return self._stamp(item, type(item).__name__.lower())

    def _kept(self, sent: Any, stored: Any) -> Any:
        """The store's answer to an idempotent write, if this tenant may read it.

        A write whose id the store already holds answers with the stored record. When that record is another
        tenant's (or no tenant's), the caller learns nothing of it: the write is refused as if the id were taken,
        without the record, its tenant or its rollout.

        Raises:
            IdInUseError: ``stored`` is not this tenant's record.
        """
        if getattr(stored, "tenant", None) != self.tenant:
            what = type(sent).__name__.lower()
            raise IdInUseError(f"{what} id {_id_of(sent)!r} is already in use; write it with a new id")
        return stored

    # --- rollouts ---------------------------------------------------------------------------------
    def enqueue_rollout(self, rollout: Rollout) -> Rollout:
        """Enqueue a rollout of this tenant (its pins checked)."""
        self._pins(rollout.resources)
        return self._kept(rollout, self.store.enqueue_rollout(self._stamp(rollout, "rollout")))

    def get_rollout(self, rollout_id: str) -> Rollout:
        """This tenant's rollout. Raises: ``NotFoundError`` (also for another tenant's)."""
        return self._owned(rollout_id)

    def list_rollouts(self, *args: Any, tenant: str | None = None, **kwargs: Any) -> list[Rollout]:
        """This tenant's rollouts (``tenant``, if given, must be this tenant)."""
        if tenant not in (None, self.tenant):
            raise TenantForbidden(f"tenant {self.tenant!r} cannot list the rollouts of tenant {tenant!r}")
        return self.store.list_rollouts(*args, tenant=self.tenant, **kwargs)

    def update_rollout(self, rollout_id: str, **fields: Any) -> Rollout:
        """Update this tenant's rollout (new pins checked)."""
        self._owned(rollout_id)
        if isinstance(fields.get("resources"), dict):
            self._pins(fields["resources"])
        return self.store.update_rollout(rollout_id, **fields)

    def list_attempts(self, rollout_id: str) -> list[Attempt]:
        """Attempts of this tenant's rollout."""
        self._owned(rollout_id)
        return self.store.list_attempts(rollout_id)

    def _worker_verb(self, *args: Any, **kwargs: Any) -> Any:
        raise TenantForbidden(
            f"a tenant key (tenant {self.tenant!r}) cannot run workers or read across tenants; use the store key"
        )

    claim_rollout = heartbeat = finish_attempt = requeue_stale = page_rollouts = _worker_verb

    # --- spans and rewards --------------------------------------------------------------------------
    def add_span(self, span: Span) -> Span:
        """Store a span of this tenant (an orphan, or of one of its rollouts)."""
        return self._kept(span, self.store.add_span(self._item(span)))  # type: ignore[arg-type]

    def write_batch(self, items: Sequence[Span | Reward]) -> list[Span | Reward | AgentForgeError]:
        """Write items of this tenant; an item naming another tenant or its rollout fails alone."""
        entries: list[Span | Reward | AgentForgeError] = []
        for item in items:
            try:
                entries.append(self._item(item))
            except (NotFoundError, TenantForbidden) as exc:
                entries.append(exc)
        out: list[Span | Reward | AgentForgeError] = []
        for item, result in zip(items, write_accepted(self.store, entries), strict=True):
            try:
                out.append(result if isinstance(result, AgentForgeError) else self._kept(item, result))
            except IdInUseError as exc:
                out.append(exc)
        return out

    def list_spans(
        self,
        rollout_id: str | None = None,
        attempt_id: str | None = None,
        kind: SpanKind | None = None,
        orphans: bool = False,
        valid_only: bool = False,
        *,
        tenant: str | None = None,
        after_sequence: int | None = None,
        limit: int | None = None,
    ) -> list[Span]:
        """Spans of this tenant's rollout (``rollout_id``), else the spans recorded for this tenant.

        Raises:
            NotFoundError: another tenant's rollout.
            TenantForbidden: ``attempt_id`` without ``rollout_id``, or another ``tenant``.
        """
        if tenant not in (None, self.tenant):
            raise TenantForbidden(f"tenant {self.tenant!r} cannot list the spans of tenant {tenant!r}")
        if rollout_id is None:
            if attempt_id is not None:
                raise TenantForbidden("a tenant key lists an attempt's spans with its rollout_id too")
            return self.store.list_spans(
                None,
                None,
                kind,
                orphans,
                valid_only,
                tenant=self.tenant,
                after_sequence=after_sequence,
                limit=limit,
            )
        self._owned(rollout_id)
        return self.store.list_spans(
            rollout_id, attempt_id, kind, orphans, valid_only, after_sequence=after_sequence, limit=limit
        )

    def add_reward(self, reward: Reward) -> Reward:
        """Store a reward for this tenant's rollout."""
        return self._kept(reward, self.store.add_reward(self._item(reward)))  # type: ignore[arg-type]

    def list_rewards(
        self, rollout_id: str, *, after_sequence: int | None = None, limit: int | None = None
    ) -> list[Reward]:
        """Rewards of this tenant's rollout."""
        self._owned(rollout_id)
        return self.store.list_rewards(rollout_id, after_sequence=after_sequence, limit=limit)

    def final_reward(self, rollout_id: str) -> Reward | None:
        """Training reward of this tenant's rollout."""
        self._owned(rollout_id)
        return self.store.final_reward(rollout_id)

    # --- resources ----------------------------------------------------------------------------------
    def _visible(self, name: str) -> bool:
        # the store's own logs (privacy:deletions, privacy:exports, metrics:retained) span every tenant
        return not name.startswith(_STORE_LOGS) and tenant_of_name(name) in (None, self.tenant)

    def get_resource(self, name: str, version: int | None = None) -> ResourceVersion:
        """A shared resource or one of this tenant's lineage. Raises: ``NotFoundError`` (another tenant's)."""
        if not self._visible(name):
            raise NotFoundError(f"resource {name!r} does not exist")
        return self.store.get_resource(name, version)

    def list_resources(
        self, name: str | None = None, *, after: tuple[str, int] | None = None, limit: int | None = None
    ) -> Sequence[ResourceVersion]:
        """Shared resources and this tenant's lineages (``limit`` of them: the store's pages are read until
        that many are visible, so a page the tenant sees little of does not end the listing early)."""
        seen: list[ResourceVersion] = []
        while True:
            page = self.store.list_resources(name, after=after, limit=limit)
            seen += [r for r in page if self._visible(r.name)]
            if limit is None or len(page) < limit or len(seen) >= limit:
                return seen if limit is None else seen[:limit]
            after = (page[-1].name, page[-1].version)
