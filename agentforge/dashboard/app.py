"""The dashboard's web app: FastAPI routes rendering Jinja2 templates, Chart.js served from the npm install.

Read-only over any :class:`~agentforge.ports.TraceStore` (``agentforge dashboard`` opens one by URL;
``agentforge serve`` mounts the app at :data:`MOUNT_PATH` on the gateway's port). Pages: ``/runs`` (reward
curve, held-out scores, step time and the version timeline, refreshed by polling ``/runs.json``),
``/rollouts`` (filterable keyset pages), ``/rollouts/{id}`` (conversation, span timeline, token view) and
``/versions`` (lineage, the live version, a prompt diff).

Access follows the rule of every agentforge server (:mod:`agentforge.loopback`): without a key only requests
on a loopback interface are served; with one, every request presents the store API's key (``Authorization:
Bearer``/``X-Api-Key`` as for the store server, :mod:`agentforge.stores.auth`) or the cookie the ``/login``
form sets from it. Chart.js comes from ``assets/node_modules`` (``npm ci`` in ``scripts/setup.sh``); the
browser never reaches a CDN.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from agentforge.dashboard import views
from agentforge.errors import NotFoundError, UserError
from agentforge.loopback import LoopbackGuard, check_key
from agentforge.queries import RolloutQuery
from agentforge.stores.auth import key_matches, presented_key
from agentforge.types import RolloutState

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Receive, Scope, Send

    from agentforge.ports import TraceStore

__all__ = ["create_dashboard_app", "MOUNT_PATH", "CHART_JS", "token_decoder"]

#: Where ``agentforge serve`` mounts the dashboard on the gateway's port.
MOUNT_PATH = "/dashboard"
_HERE = Path(__file__).parent
#: The Chart.js bundle ``scripts/setup.sh`` installs from npm (``assets/package.json``).
CHART_JS = _HERE / "assets" / "node_modules" / "chart.js" / "dist" / "chart.umd.js"
_COOKIE = "agentforge_dashboard_key"


def session_token(api_key: str) -> str:
    """The login cookie's value: HMAC-SHA256 of a fixed label under the key (hex). It opens the dashboard only:
    a leaked cookie is not the store API key, which it was (issue 36), and it changes when the key rotates."""
    return hmac.new(api_key.strip().encode(), b"agentforge dashboard session v1", hashlib.sha256).hexdigest()


def token_decoder(tokenizer_dir: str | Path | None | bool) -> Callable[[int], str]:
    """Token id → text with the ``tokenizer.json`` in ``tokenizer_dir`` (the served model's checkpoint).

    Args:
        tokenizer_dir: a checkpoint directory; ``None``: the prepared default model when there is one;
            ``False``: none (ids only).

    Returns:
        A cached decoder; without any tokenizer it shows the id itself (``⟨1234⟩``), and so it shows an id outside
        the tokenizer's vocabulary (negative, or past its size: the tokenizer's own decode raises on some).

    Raises:
        UserError: ``tokenizer_dir`` is given but holds no ``tokenizer.json``.
    """
    if tokenizer_dir is False:
        return lambda token: f"⟨{token}⟩"
    if tokenizer_dir is None or tokenizer_dir is True:
        from agentforge.model import default_model_dir, is_prepared

        if not is_prepared():
            return lambda token: f"⟨{token}⟩"
        tokenizer_dir = default_model_dir()
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"no tokenizer.json in {tokenizer_dir}; pass the served model's checkpoint directory")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    size = tok.get_vocab_size(with_added_tokens=True)

    def decode(
        token: int,
    ) -> str:  # an id the tokenizer has no entry for (a bad or crafted span) is shown as such
        if not 0 <= token < size:
            return f"⟨{token}: not in the vocabulary⟩"
        return tok.decode([token], skip_special_tokens=False)

    return functools.lru_cache(maxsize=65536)(decode)


class _KeyGuard:
    """Let a request through when it presents the key (headers or the login cookie); else send it to
    ``/login`` (a page view) or answer 401."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app, self._key, self._session = app, api_key, session_token(api_key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        given = presented_key(request.headers.get("authorization"), request.headers.get("x-api-key"))
        cookie = request.cookies.get(_COOKIE) or ""
        session = hmac.compare_digest(cookie.encode(), self._session.encode())
        path = scope["path"][len(scope.get("root_path") or "") :] if scope.get("root_path") else scope["path"]
        if path == "/login" or session or key_matches(given, self._key):
            await self.app(scope, receive, send)
            return
        root = scope.get("root_path") or ""
        answer: Response = (
            RedirectResponse(f"{root}/login", status_code=303)
            if request.method == "GET"
            else PlainTextResponse("missing or wrong dashboard (store API) key", status_code=401)
        )
        await answer(scope, receive, send)


def _when(ts: float | None) -> str:
    return "" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _number(value: Any, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _query(request: Request) -> RolloutQuery:
    """The rollouts page's filter form as a :class:`RolloutQuery` (blank fields are no filter)."""
    p = {k: v.strip() for k, v in request.query_params.items() if v.strip()}
    fields: dict[str, Any] = {k: p[k] for k in ("agent", "version", "trainer_run") if k in p}
    try:
        for key in ("min_reward", "max_reward"):
            if key in p:
                fields[key] = float(p[key])
        for key in ("since", "until"):  # datetime-local inputs, UTC
            if key in p:
                fields[key] = datetime.fromisoformat(p[key]).replace(tzinfo=UTC).timestamp()
        if "state" in p:
            fields["state"] = RolloutState(p["state"])
        if "before" in p:
            fields["before"] = int(p["before"])
        if "limit" in p:
            fields["limit"] = int(p["limit"])
        return RolloutQuery(**fields)
    except ValueError as exc:
        raise UserError(f"bad filter: {exc}") from None


def create_dashboard_app(
    store: TraceStore,
    api_key: str | None = None,
    *,
    tokenizer: str | Path | None | bool = None,
    poll_s: float = 5.0,
) -> FastAPI:
    """The dashboard app over ``store`` (read-only: it calls only the store's read methods).

    Args:
        store: any trace store (SQLite, PostgreSQL, a store server).
        api_key: the key a request must present (the store API's key); ``None``: loopback requests only.
        tokenizer: the served model's checkpoint directory, for token texts (``None``: the prepared default
            model; ``False``: token ids only).
        poll_s: seconds between the runs page's refreshes while it is open.

    Returns:
        The app; mount it (``app.mount(MOUNT_PATH, ...)``) or serve it with any ASGI server.

    Raises:
        UserError: a key shorter than 16 characters, or a tokenizer directory without ``tokenizer.json``.
    """
    check_key(api_key, "dashboard")
    decode = token_decoder(tokenizer)
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    templates.env.filters.update(when=_when, number=_number)
    for name in templates.env.list_templates():  # compiled now, so no page's first view pays for it
        templates.env.get_template(name)
    app = FastAPI(title="agentforge dashboard", docs_url=None, redoc_url=None, openapi_url=None)

    def page(request: Request, name: str, status_code: int = 200, **context: Any) -> Response:
        base = request.scope.get("root_path") or ""
        context = {"base": base, "poll_s": poll_s, **context}
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    @app.exception_handler(NotFoundError)
    async def not_found(request: Request, exc: NotFoundError) -> Response:
        return page(request, "error.html", status_code=404, status=404, message=str(exc))

    @app.exception_handler(UserError)
    async def bad_input(request: Request, exc: UserError) -> Response:
        return page(request, "error.html", status_code=400, status=400, message=str(exc))

    @app.get("/")
    def home(request: Request) -> Response:
        return RedirectResponse(f"{request.scope.get('root_path') or ''}/runs", status_code=307)

    @app.get("/static/chart.umd.js")
    def chart_js() -> Response:
        if not CHART_JS.is_file():
            return PlainTextResponse(
                f"console.error('Chart.js is not installed at {CHART_JS}; run scripts/setup.sh (npm ci)')",
                status_code=503,
                media_type="text/javascript",
            )
        return FileResponse(CHART_JS, media_type="text/javascript")

    def runs_data() -> dict[str, Any]:
        return {"runs": views.runs_view(store), "timeline": views.version_timeline(store)}

    @app.get("/runs")
    def runs(request: Request) -> Response:
        return page(request, "runs.html", **runs_data())

    @app.get("/runs.json")
    def runs_json() -> JSONResponse:
        return JSONResponse(runs_data())

    @app.get("/rollouts")
    def rollouts(request: Request) -> Response:
        query = _query(request)
        result = store.page_rollouts(query)
        form = {k: v for k, v in request.query_params.items() if k not in ("before",)}
        return page(
            request,
            "rollouts.html",
            page=result,
            query=query,
            form=form,
            states=[s.value for s in RolloutState],
        )

    @app.get("/rollouts/{rollout_id}")
    def rollout(request: Request, rollout_id: str) -> Response:
        data = views.rollout_view(store, rollout_id, decode)
        timeline = [
            {
                "label": f"{s['sequence']} {s['kind']} {s['name']} {s['version']}".strip(),
                "range": [s["start_s"], max(s["end_s"], s["start_s"] + 1e-3)],
                "kind": s["kind"],
            }
            for s in data["spans"]
        ]
        return page(request, "rollout.html", timeline=timeline, **data)

    @app.get("/versions")
    def versions(
        request: Request, diff: str | None = None, a: int | None = None, b: int | None = None
    ) -> Response:
        lines = views.prompt_diff(store, diff, a, b) if diff and a is not None and b is not None else None
        return page(request, "versions.html", groups=views.versions_view(store), diff=lines, diff_name=diff)

    if api_key is None:
        app.add_middleware(LoopbackGuard, what="dashboard")
        return app

    @app.get("/login")
    def login_form(request: Request) -> Response:
        return page(request, "login.html", failed=False)

    @app.post("/login")
    async def login(request: Request) -> Response:  # an urlencoded form, read without python-multipart
        key = parse_qs((await request.body()).decode("utf-8", "replace")).get("key", [""])[0]
        if not key_matches(key.strip(), api_key):
            return page(request, "login.html", failed=True)
        root = request.scope.get("root_path") or ""
        answer = RedirectResponse(f"{root}/runs", status_code=303)
        answer.set_cookie(_COOKIE, session_token(key), httponly=True, samesite="strict", path=root or "/")
        return answer

    app.add_middleware(_KeyGuard, api_key=api_key)
    return app
