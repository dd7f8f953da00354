"""Tenant keys: the key → tenant table of the SQL store (older store files get the tenant columns from
:func:`agentforge.stores.tables.add_missing_columns`).

A tenant is one customer of an app (:func:`agentforge.types.check_tenant` names the rule for its name). Each
tenant holds one or more **tenant keys**; a request that presents one acts for that tenant only: the gateway
serves it the tenant's own adapter lineage (``policy@acme/vN``) and records its spans with the tenant, and the
HTTP store API shows and takes only that tenant's rollouts, spans and rewards (:mod:`agentforge.stores.server`).

A key is ``aft_<key id>_<secret>``: the key id (8 random bytes, hex) finds the row, the secret (32 random bytes,
URL-safe base64, from :mod:`secrets`) is checked against the stored SHA-256 digest with
:func:`hmac.compare_digest`. The secret is never stored: a high-entropy random secret needs no slow
password hash (NIST SP 800-63B §5.1.1.2 asks that for user-chosen secrets), and one SHA-256 keeps the check
cheap enough for every request. Rotation issues a new key and revokes the old one after a grace period;
revocation takes effect at once in the process that revokes and within ``cache_s`` elsewhere (every
:class:`TenantKeyCache` re-reads a key after that long); neither needs a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from sqlmodel import Field, Session, SQLModel, col, select

from agentforge.errors import NotFoundError, UserError
from agentforge.ports import TenantDirectory
from agentforge.types import check_tenant, now

if TYPE_CHECKING:
    from agentforge.stores.engine import Transactor

__all__ = [
    "KEY_PREFIX",
    "TenantKey",
    "TenantKeyRow",
    "TenantKeys",
    "TenantDirectory",
    "TenantKeyCache",
]

#: Every tenant key starts with this, so a key in a log or a leak scanner is recognisable as one.
KEY_PREFIX = "aft_"


class TenantKeyRow(SQLModel, table=True):
    """One tenant key: its id, tenant, the SHA-256 digest of its secret (hex) and when it stops working."""

    __tablename__: ClassVar[str] = "af_tenant_keys"

    key_id: str = Field(primary_key=True, max_length=32)
    tenant: str = Field(index=True, max_length=63)
    digest: str = Field(max_length=64)
    created_at: float
    revoked_at: float | None = None  # epoch seconds from which the key is refused (None: never)


@dataclass(frozen=True)
class TenantKey:
    """A tenant key as listed (never with its secret).

    Attributes:
        key_id: the key's public id (the part after ``aft_``).
        tenant: the tenant it acts for.
        created_at: epoch seconds.
        revoked_at: epoch seconds from which it is refused, or ``None``.
    """

    key_id: str
    tenant: str
    created_at: float
    revoked_at: float | None

    def active(self, at: float | None = None) -> bool:
        """Whether the key is accepted at ``at`` (epoch seconds; default now)."""
        return self.revoked_at is None or (now() if at is None else at) < self.revoked_at


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def _split(key: str) -> tuple[str, str] | None:
    """``(key id, secret)`` of a well-formed tenant key, else ``None``."""
    if not key.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = key[len(KEY_PREFIX) :].partition("_")
    if not sep or len(key_id) != 16 or not secret:
        return None
    return key_id, secret


class TenantKeys:
    """The key → tenant table of one SQL store (``SQLStore.tenant_keys``).

    Args:
        tx: the store's transactor.
    """

    def __init__(self, tx: Transactor) -> None:
        self._tx = tx

    def issue(self, tenant: str) -> str:
        """Make a new key for ``tenant`` (any number of keys per tenant may be active).

        Returns:
            The key (``aft_<id>_<secret>``): shown once, only its digest is stored.

        Raises:
            UserError: ``tenant`` is not a tenant name.
        """
        check_tenant(tenant)
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        row = TenantKeyRow(key_id=key_id, tenant=tenant, digest=_digest(secret), created_at=now())
        self._tx.run(lambda s: s.add(row), write=True)
        return f"{KEY_PREFIX}{key_id}_{secret}"

    def revoke(self, key_id: str, grace_s: float = 0.0) -> TenantKey:
        """Refuse key ``key_id`` from ``grace_s`` seconds from now on (``0``: at once).

        Raises:
            NotFoundError: no such key.
            UserError: a negative ``grace_s``.
        """
        if grace_s < 0:
            raise UserError(f"grace_s={grace_s} must be >= 0 seconds")

        def fn(s: Session) -> TenantKey:
            row = s.get(TenantKeyRow, key_id)
            if row is None:
                raise NotFoundError(f"tenant key {key_id!r} does not exist")
            until = now() + grace_s
            if row.revoked_at is None or row.revoked_at > until:
                row.revoked_at = until
                s.add(row)
            return _listed(row)

        return self._tx.run(fn, write=True)

    def rotate(self, key_id: str, grace_s: float = 0.0) -> str:
        """Issue a new key for the tenant of ``key_id`` and revoke ``key_id`` after ``grace_s`` seconds.

        Returns:
            The new key.

        Raises:
            NotFoundError: no such key.
        """
        found = self._tx.run(lambda s: _with_digest(s.get(TenantKeyRow, key_id)), write=False)
        if found is None:
            raise NotFoundError(f"tenant key {key_id!r} does not exist")
        new = self.issue(found[0].tenant)
        self.revoke(key_id, grace_s)
        return new

    def list(self, tenant: str | None = None) -> list[TenantKey]:
        """Every key (of ``tenant``, if given), oldest first, without secrets."""

        def fn(s: Session) -> list[TenantKey]:
            q = select(TenantKeyRow)
            if tenant is not None:
                q = q.where(TenantKeyRow.tenant == tenant)
            return [_listed(r) for r in s.exec(q.order_by(col(TenantKeyRow.created_at)))]

        return self._tx.run(fn, write=False)

    def tenant_of_key(self, key: str) -> str | None:
        """See :meth:`~agentforge.ports.TenantDirectory.tenant_of_key` (one primary-key read, constant-time digest check)."""
        parts = _split(key)
        if parts is None:
            return None
        found = self._tx.run(lambda s: _with_digest(s.get(TenantKeyRow, parts[0])), write=False)
        if found is None or not hmac.compare_digest(found[1], _digest(parts[1])):
            return None
        return found[0].tenant if found[0].active() else None


def _listed(row: TenantKeyRow) -> TenantKey:
    return TenantKey(row.key_id, row.tenant, row.created_at, row.revoked_at)


def _with_digest(row: TenantKeyRow | None) -> tuple[TenantKey, str] | None:
    """The key as listed and its digest, read while its session is open."""
    return None if row is None else (_listed(row), row.digest)


class TenantKeyCache:
    """A :class:`TenantDirectory` in front of another that remembers each answer for ``cache_s`` seconds, so a
    busy gateway reads the store once per key and interval, not once per request.

    Args:
        directory: where keys are looked up (e.g. ``store.tenant_keys``).
        cache_s: seconds an answer is reused; a key revoked elsewhere is refused here after at most that long.
        size: most keys remembered (the oldest answer is dropped first).
    """

    def __init__(self, directory: TenantDirectory, cache_s: float = 2.0, size: int = 4096) -> None:
        if cache_s < 0:
            raise UserError(f"cache_s={cache_s} must be >= 0 seconds")
        self.directory, self.cache_s, self._size = directory, cache_s, size
        self._seen: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()

    def tenant_of_key(self, key: str) -> str | None:
        """See :meth:`~agentforge.ports.TenantDirectory.tenant_of_key`."""
        t = time.monotonic()
        hit = self._seen.get(key)
        if hit is not None and t - hit[0] < self.cache_s:
            return hit[1]
        tenant = self.directory.tenant_of_key(key)
        with self._lock:
            if len(self._seen) >= self._size:
                self._seen.pop(next(iter(self._seen)), None)
            self._seen[key] = (t, tenant)
        return tenant

    def peek(self, key: str) -> tuple[str | None] | None:
        """The remembered answer for ``key`` as a 1-tuple, if it is fresh; ``None`` when the directory must be
        asked (so a caller on an event loop asks it in a worker thread only then). Never blocks."""
        hit = self._seen.get(key)
        if hit is None or time.monotonic() - hit[0] >= self.cache_s:
            return None
        return (hit[1],)

    def forget(self) -> None:
        """Drop every remembered answer (after revoking a key in this process)."""
        with self._lock:
            self._seen.clear()
