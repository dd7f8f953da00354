"""``agentforge versions`` and ``agentforge rollback``: the store's versioned resources (adapters, prompts)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

from agentforge.commands.common import console, reported

if TYPE_CHECKING:
    from agentforge.ports import TraceStore

__all__ = ["versions", "rollback"]

StoreUrl = Annotated[
    str | None,
    typer.Option(help="Trace store URL (default: $AGENTFORGE_STORE_URL or SQLite in $AGENTFORGE_HOME)."),
]
Tenant = Annotated[
    str | None,
    typer.Option(
        help="A tenant: its own lineage of the resource (policy → policy@TENANT, versions policy@TENANT/vN)."
    ),
]


def _lineage(name: str | None, tenant: str | None) -> str | None:
    """The resource a command acts on: ``name``, or ``tenant``'s lineage of it (``policy`` → ``policy@acme``)."""
    if tenant is None:
        return name
    from agentforge.types import Version

    return Version.lineage(name or "policy", tenant)


def _store(url: str | None) -> TraceStore:
    from agentforge.commands.common import open_store_url

    return open_store_url(url, must_exist=True)


def versions(
    name: Annotated[
        str | None, typer.Argument(help="A resource name (policy, prompt:triage…); default: all.")
    ] = None,
    store_url: StoreUrl = None,
    tenant: Tenant = None,
) -> None:
    """List versions of the store's resources (the active one is marked) and the promotion history: every
    gate decision (eval, canary, promote, watch) with its numbers. With --tenant, that tenant's lineage.

    Example: `agentforge versions prompt:triage`, `agentforge versions --tenant acme`.
    """
    from rich.markup import escape
    from rich.table import Table

    from agentforge.gate import DECISION_PREFIX, list_decisions
    from agentforge.prompts import CANARY_PREFIX

    with reported():
        name = _lineage(name, tenant)
        store = _store(store_url)
        internal = (DECISION_PREFIX, CANARY_PREFIX)  # the decision log and prompt canaries: shown below
        resources = [r for r in store.list_resources(name) if not r.name.startswith(internal)]
        decisions = list_decisions(store, name)
    by_version: dict[str, list[dict[str, object]]] = {}
    for d in decisions:
        by_version.setdefault(d.candidate, []).append(
            {
                "number": d.number,
                "stage": d.stage,
                "outcome": d.outcome,
                "live": d.live,
                "reason": d.reason,
                "evidence": d.evidence,
            }
        )
    table = Table("name", "version", "kind", "active", "created", "gate", "detail")
    for r in resources:
        detail = (
            r.payload.get("template")
            or r.payload.get("path")
            or ("base model" if r.payload.get("base") else "")
        )
        if "rollback_of" in r.payload:
            detail = f"rollback of v{r.payload['rollback_of']}: {detail}"
        created = datetime.fromtimestamp(r.created_at).isoformat(timespec="seconds")
        gate = by_version.get(r.ref, [])
        last = f"{gate[-1]['stage']} {gate[-1]['outcome']}" if gate else ""
        table.add_row(
            escape(r.name),
            str(r.version),
            r.kind,
            "✓" if r.active else "",
            created,
            last,
            escape(str(detail)[:60]),
        )
    console.print(table)
    if decisions:
        history = Table(
            "#",
            "when",
            "name",
            "stage",
            "outcome",
            "candidate",
            "against",
            "numbers",
            title="promotion history",
        )
        for d in decisions:
            when = datetime.fromtimestamp(d.created_at).isoformat(timespec="seconds")
            history.add_row(
                str(d.number),
                when,
                escape(d.name),
                d.stage,
                d.outcome,
                escape(d.candidate),
                escape(d.live),
                escape(d.reason[:100]),
            )
        console.print(history)
    typer.echo(
        json.dumps(
            [
                {
                    "name": r.name,
                    "version": r.version,
                    "active": r.active,
                    "decisions": by_version.get(r.ref, []),
                }
                for r in resources
            ]
        )
    )


def rollback(
    name: Annotated[
        str, typer.Argument(help="policy (the adapter alias) or a prompt name such as prompt:triage.")
    ],
    version: Annotated[
        str, typer.Argument(help="The version to go back to: 3, v3 or policy@v3 (0 = base model).")
    ],
    store_url: StoreUrl = None,
    tenant: Tenant = None,
) -> None:
    """Go back to an earlier version in one call: a prompt's version is re-activated (the next rollouts use it);
    an adapter is re-published as a new version that every following `agentforge serve` hot-swaps in. With
    --tenant, in that tenant's lineage (policy@TENANT).

    Example: `agentforge rollback prompt:triage 2`, `agentforge rollback policy 3 --tenant acme`.
    """
    from agentforge.prompts import rollback_prompt
    from agentforge.trainers.publish import rollback_adapter

    with reported():
        name = _lineage(name, tenant) or name
        store = _store(store_url)
        kinds = {r.kind for r in store.list_resources(name)}
        if not kinds:
            from agentforge.errors import NotFoundError

            raise NotFoundError(f"the store has no resource named {name!r}; see `agentforge versions`")
        if "adapter" in kinds:
            resource = rollback_adapter(store, version, alias=name)
        else:
            resource = rollback_prompt(store, name, version)
    from rich.markup import escape

    console.print(f"[bold green]{escape(resource.name)}[/] active version is now {resource.version}")
    typer.echo(json.dumps({"name": resource.name, "active_version": resource.version}))
