"""``agentforge forget``: delete a subject's data (rollouts, sessions, users) or raw traces past a retention
age from a SQLite or PostgreSQL store (:mod:`agentforge.stores.forget`), log it without the data and list the
files exported earlier that still hold it."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from agentforge.commands.common import console, reported

__all__ = ["forget_cmd"]


def forget_cmd(
    rollout: Annotated[list[str] | None, typer.Option("--rollout", help="A rollout id (repeatable).")] = None,
    session: Annotated[
        list[str] | None,
        typer.Option(
            "--session",
            help="A session id: the rollouts the application enqueued with this session_id (repeatable).",
        ),
    ] = None,
    user: Annotated[
        list[str] | None,
        typer.Option(
            "--user", help="A user id: the rollouts the application enqueued with this user_id (repeatable)."
        ),
    ] = None,
    older_than_days: Annotated[
        float | None,
        typer.Option(
            help="Retention: delete finished rollouts created more than this many days ago (their aggregates are kept)."
        ),
    ] = None,
    store_url: Annotated[
        str | None,
        typer.Option(
            help="Trace store URL: sqlite or postgresql (default: $AGENTFORGE_STORE_URL or SQLite in $AGENTFORGE_HOME)."
        ),
    ] = None,
    vacuum: Annotated[
        bool, typer.Option(help="Erase the freed space (SQLite VACUUM + WAL truncate; PostgreSQL VACUUM).")
    ] = True,
    full: Annotated[
        bool,
        typer.Option(
            help="PostgreSQL: VACUUM FULL, rewriting the tables (blocking them meanwhile); --no-full runs a plain "
            "VACUUM, which leaves the deleted text readable in the table files until the space is reused."
        ),
    ] = True,
) -> None:
    """Delete a subject's spans, rewards, attempts and rollouts; print what went as JSON (stdout).

    Example: `agentforge forget --user olivia_ito_3591`; `agentforge forget --older-than-days 30`.
    """
    from agentforge.errors import UserError
    from agentforge.open import open_store
    from agentforge.stores.forget import apply_retention, forget
    from agentforge.stores.sql import SQLStore

    with reported():
        subjects = bool(rollout or session or user)
        if subjects == (older_than_days is not None):
            raise UserError("give either --rollout/--session/--user or --older-than-days")
        store = open_store(store_url, must_exist=True)
        try:
            if not isinstance(store, SQLStore):
                raise UserError(
                    f"forget deletes from a SQLite or PostgreSQL store, not {store!r}; run it where the database is"
                )
            if older_than_days is not None:
                report = apply_retention(store, older_than_days, vacuum=vacuum, full=full)
            else:
                report = forget(
                    store,
                    rollouts=rollout or (),
                    sessions=session or (),
                    users=user or (),
                    vacuum=vacuum,
                    full=full,
                )
        finally:
            store.close()
    if report.named_in_metadata:
        console.print(
            f"[yellow]{len(report.named_in_metadata)} other rollouts name these sessions or users only in "
            "client-written metadata or task fields; they were kept (delete one with --rollout):[/] "
            + " ".join(report.named_in_metadata[:20])
        )
    for where in report.residue:
        console.print(f"[yellow]the deleted text may still be readable: {where}[/]")
    for export in report.exports_before:
        console.print(
            f"[yellow]exported before the deletion, still holds {export['rollouts']} of these rollouts:[/] {export['path']}"
        )
    typer.echo(
        json.dumps(
            {
                "rollouts": len(report.rollout_ids),
                "deleted": report.deleted,
                "exports_before": report.exports_before,
                "named_in_metadata": report.named_in_metadata,
                "residue": report.residue,
            }
        )
    )
