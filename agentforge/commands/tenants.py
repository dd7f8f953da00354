"""``agentforge tenants``: the store's tenant keys (issue, rotate, revoke, list); see :mod:`agentforge.stores.tenants`.

Keys live in the SQL store itself (SQLite or PostgreSQL, never behind the HTTP store API: issuing a key is an
operator's act). A running ``agentforge serve --tenants`` takes a new key, and refuses a revoked one, within
seconds, without a restart.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from agentforge.commands.common import console, reported

__all__ = ["tenants_app"]

tenants_app = typer.Typer(
    help="Tenant keys: each tenant's API key for the gateway and the store API.", no_args_is_help=True
)
StoreUrl = Annotated[
    str | None,
    typer.Option(help="SQL store URL (default: $AGENTFORGE_STORE_URL or SQLite in $AGENTFORGE_HOME)."),
]
GraceS = Annotated[
    float, typer.Option(min=0.0, help="Seconds the old key keeps working (0: refused at once).")
]


def _keys(url: str | None) -> Any:
    """The store's key table (a SQL store; the HTTP store API issues no keys)."""
    from agentforge.commands.common import open_store_url
    from agentforge.errors import UserError

    store = open_store_url(url, must_exist=True)
    keys = getattr(store, "tenant_keys", None)
    if keys is None:
        raise UserError(
            "tenant keys live in the SQL store: pass its sqlite:// or postgresql:// URL, not a gateway's"
        )
    return keys


@tenants_app.command("issue")
def issue(
    tenant: Annotated[str, typer.Argument(help="The tenant, e.g. acme (a-z 0-9 _ -).")],
    store_url: StoreUrl = None,
) -> None:
    """Make a new key for TENANT and print it (shown once; only its SHA-256 digest is stored)."""
    with reported():
        key = _keys(store_url).issue(tenant)
    console.print(f"[bold green]new key for {tenant}[/] (shown once, keep it secret)")
    typer.echo(json.dumps({"tenant": tenant, "key": key}))


@tenants_app.command("rotate")
def rotate(
    key_id: Annotated[str, typer.Argument(help="The key's id (see `agentforge tenants list`).")],
    grace_s: GraceS = 0.0,
    store_url: StoreUrl = None,
) -> None:
    """Issue a new key for the tenant of KEY_ID and revoke KEY_ID after --grace-s seconds."""
    with reported():
        key = _keys(store_url).rotate(key_id, grace_s)
    typer.echo(json.dumps({"replaces": key_id, "key": key, "old_refused_in_s": grace_s}))


@tenants_app.command("revoke")
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (see `agentforge tenants list`).")],
    grace_s: GraceS = 0.0,
    store_url: StoreUrl = None,
) -> None:
    """Refuse KEY_ID from --grace-s seconds from now on."""
    with reported():
        listed = _keys(store_url).revoke(key_id, grace_s)
    typer.echo(
        json.dumps({"key_id": listed.key_id, "tenant": listed.tenant, "revoked_at": listed.revoked_at})
    )


@tenants_app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
    store_url: StoreUrl = None,
) -> None:
    """List the keys (ids, tenants, when made, whether active); never their secrets."""
    from rich.table import Table

    with reported():
        keys = _keys(store_url).list(tenant)
    table = Table("key id", "tenant", "created", "active")
    for k in keys:
        table.add_row(
            k.key_id,
            k.tenant,
            datetime.fromtimestamp(k.created_at).isoformat(timespec="seconds"),
            "✓" if k.active() else "",
        )
    console.print(table)
    typer.echo(json.dumps([{"key_id": k.key_id, "tenant": k.tenant, "active": k.active()} for k in keys]))
