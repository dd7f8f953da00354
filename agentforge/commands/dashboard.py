"""``agentforge dashboard``: the read-only web dashboard over any store URL, in the foreground.

The same app is mounted at ``/dashboard`` on the gateway's port by ``agentforge serve``
(:data:`agentforge.dashboard.app.MOUNT_PATH`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentforge.commands.common import StoreApiKey, console, reported, stop_on_signals

__all__ = ["dashboard"]


def dashboard(
    store_url: Annotated[
        str | None,
        typer.Option(
            help="Trace store URL: sqlite, postgresql or http(s) (default: $AGENTFORGE_STORE_URL or SQLite in $AGENTFORGE_HOME)."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Bind address; non-loopback needs --api-key.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.", min=0, max=65535)] = 8050,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTFORGE_API_KEY",
            help="The key every request must present (the store API's key; browsers enter it once at /login). "
            "Needed off loopback; set $AGENTFORGE_API_KEY rather than the flag.",
        ),
    ] = None,
    store_api_key: StoreApiKey = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            help="The served model's checkpoint directory, for token texts (default: the prepared model)."
        ),
    ] = None,
    poll_s: Annotated[float, typer.Option(help="Seconds between the runs page's refreshes.", min=0.5)] = 5.0,
) -> None:
    """Open the dashboard: runs (reward curve, held-out, step time, version timeline), rollouts, one rollout
    (conversation, spans, token view of the training sample) and versions. Read-only.

    Prints its URL on stdout. Example: `agentforge dashboard --store-url sqlite:///runs/traces.db`, then open
    http://127.0.0.1:8050 in a browser.
    """
    from agentforge.commands.common import open_store_url
    from agentforge.dashboard.app import create_dashboard_app
    from agentforge.gateway.server import AppServer
    from agentforge.loopback import check_bind

    with reported():
        check_bind(host, api_key, "dashboard")
        store = open_store_url(store_url, must_exist=True, api_key=store_api_key or api_key)
        store.list_resources("policy")  # a store server that is down or refuses the key fails here
        app = create_dashboard_app(store, api_key, tokenizer=tokenizer, poll_s=poll_s)
        # AppServer, not a bare uvicorn.run: a request must arrive within HTTP_REQUEST_READ_S (slow clients cut)
        server = AppServer(app, host, port).start()
    stop, why = stop_on_signals()
    console.print(f"[bold green]dashboard[/] {server.url}  (store {store!r}; Ctrl-C stops it)")
    typer.echo(server.url)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        store.close()
        console.print(f"[bold]stopped[/] ({why[0] if why else 'exit'}): dashboard {server.url}")
