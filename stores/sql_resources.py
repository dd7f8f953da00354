"""Versioned resources of the SQL store (prompt versions, adapter records, any named payload): publish a new
version, read the active one or a given one, roll back by activating an older one.

Versions of one name count from 1; at most one is active. Publishing takes the next number inside its write
transaction (a concurrent publish of the same name loses the unique-key race and is retried, so numbers never
repeat); activation flips the flags in one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, update
from sqlmodel import Session, select

from agentforge.errors import NotFoundError
from agentforge.stores.engine import Transactor
from agentforge.stores.tables import ResourceRow, plain, resource_to_row, row_to_resource
from agentforge.types import ResourceVersion

__all__ = ["ResourceVersions"]


class ResourceVersions:
    """The resource half of :class:`~agentforge.stores.sql.SQLStore` (which sets ``_tx``)."""

    _tx: Transactor

    def publish_resource(self, resource: ResourceVersion, activate: bool = True) -> ResourceVersion:
        """Store a new version of ``resource.name``: ``version`` = previous highest + 1 (from 1).

        Args:
            resource: name, kind and payload (its ``version``/``active`` are ignored).
            activate: make it the active version (the others are deactivated).

        Returns:
            The stored version.
        """
        plain("resource name", resource.name)

        def fn(s: Session) -> ResourceVersion:
            top = s.exec(
                select(func.max(ResourceRow.version)).where(ResourceRow.name == resource.name)
            ).first()
            if activate:
                s.exec(update(ResourceRow).where(ResourceRow.name == resource.name).values(active=False))
            stored = resource.model_copy(update={"version": (top or 0) + 1, "active": activate})
            s.add(resource_to_row(stored))
            s.flush()
            return stored

        return self._tx.run(fn, write=True, integrity_retries=self._tx.max_retries)

    def get_resource(self, name: str, version: int | None = None) -> ResourceVersion:
        """The given version, or the active one when ``version`` is ``None``.

        Raises:
            NotFoundError: unknown name or version, or no active version.
        """

        def fn(s: Session) -> ResourceVersion:
            q = select(ResourceRow).where(ResourceRow.name == name)
            q = q.where(ResourceRow.active) if version is None else q.where(ResourceRow.version == version)
            row = s.exec(q).first()
            if row is None:
                what = "no active version" if version is None else f"no version {version}"
                raise NotFoundError(f"resource {name!r} has {what}")
            return row_to_resource(row)

        return self._tx.run(fn, write=False)

    def activate_resource(self, name: str, version: int) -> ResourceVersion:
        """Make ``version`` the active one (a rollback is this call with an older version).

        Raises:
            NotFoundError: unknown name or version.
        """

        def fn(s: Session) -> ResourceVersion:
            q = select(ResourceRow).where(ResourceRow.name == name, ResourceRow.version == version)
            row = s.exec(q.with_for_update()).first()
            if row is None:
                raise NotFoundError(f"resource {name!r} has no version {version}")
            s.exec(
                update(ResourceRow)
                .where(ResourceRow.name == name, ResourceRow.version != version)
                .values(active=False)
            )
            row.active = True
            s.add(row)
            s.flush()
            return row_to_resource(row)

        return self._tx.run(fn, write=True)

    def list_resources(self, name: str | None = None) -> Sequence[ResourceVersion]:
        """All versions (of ``name``, or of every name), by name then version; ``[]`` for an unknown name."""
        q = select(ResourceRow)
        if name is not None:
            q = q.where(ResourceRow.name == name)
        q = q.order_by(ResourceRow.name, ResourceRow.version)
        return self._tx.run(lambda s: [row_to_resource(r) for r in s.exec(q)], write=False)
