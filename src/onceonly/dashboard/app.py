"""The dashboard's pages, JSON endpoints and actions.

Server-rendered HTML (Jinja2, autoescaped: payloads are written by whoever
can reach the webhook URL) plus one small script that polls two JSON
endpoints. No inline script or style, so the Content-Security-Policy can say
``'self'`` and nothing else: even a payload that slipped past escaping could
not run.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route, Router

from .._exceptions import StoreError
from .._version import __version__
from ..asgi import Message, Receive, Scope, Send
from ..events import EventStatus
from ..operations import DASHBOARD_REPLAYABLE, replay
from ..store.activity import MAX_MINUTES
from .access import COOKIE_NAME, Access
from .chart import activity_charts
from .reader import STATUSES, EventReader, format_time
from .redaction import Redactor
from .sessions import SESSION_SECONDS, Sessions

if TYPE_CHECKING:
    from ..deployment import Deployment

__all__ = ["Dashboard"]

log = logging.getLogger("onceonly.dashboard")

#: Statuses an operator may replay from the dashboard (defined with the
#: command line's in operations.py).
REPLAYABLE = DASHBOARD_REPLAYABLE
PAGE_SIZE = 50
#: The largest row id (BIGINT, and SQLite's INTEGER).
_MAX_ID = 2**63 - 1
#: Query parameters that must be row ids or counts.
_NUMBERS = ("before", "limit")
#: A filter longer than any provider name, event type or id is no filter.
_MAX_PARAMETER = 1000
#: The activity chart's default window and the ones its menu offers.
ACTIVITY_MINUTES = 60
_WINDOWS = (15, 60, 180)


def _bad_parameters(request: Request) -> str | None:
    """Why the query string cannot be served, or None. Every value reaches
    SQL as a parameter; these are the ones a database would refuse with an
    error (a number past 64 bits, a NUL in text), refused here as a 400."""
    for name, value in request.query_params.multi_items():
        if len(value) > _MAX_PARAMETER or "\x00" in value:
            return f"the {name!r} parameter is too long or holds a NUL"
        if (
            name in _NUMBERS
            and value
            and not (value.isascii() and value.isdigit() and int(value) <= _MAX_ID)
        ):
            return f"the {name!r} parameter must be a whole number below 2^63"
        if (
            name == "minutes"
            and value
            and not (value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_MINUTES)
        ):
            return f"the 'minutes' parameter must be a whole number from 1 to {MAX_MINUTES}"
    return None


def _minutes(request: Request) -> int:
    """The activity window asked for (checked by :func:`_bad_parameters`)."""
    value = request.query_params.get("minutes", "")
    return int(value) if value else ACTIVITY_MINUTES


MAX_FORM_BYTES = 8192

_SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        b"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # Not no-referrer: with it, browsers send "Origin: null" on form posts,
    # and the origin check of every POST needs the real one.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

_STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}

Endpoint = Callable[[Request], Awaitable[Response]]


class Dashboard:
    """The operator dashboard for one :class:`~onceonly.Onceonly`, as an ASGI app.

    ``onceonly serve`` mounts it at ``dashboard_path``; in your own app::

        app = Starlette(routes=[Mount("/dashboard", app=onceonly_app.dashboard())])

    Access follows ``dashboard_token`` (see :mod:`onceonly.dashboard.access`).
    """

    def __init__(self, app: Deployment) -> None:
        self.onceonly = app
        settings = app.settings.dashboard
        self.access = Access(settings.token)
        self.redactor = Redactor(settings.redact)
        self.reader = EventReader(app)
        self.sessions = Sessions(lambda: self.reader.engine, kind=app.engine_kind)
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("onceonly.dashboard", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = format_time
        self.static = {
            name: resources.files("onceonly.dashboard").joinpath("static", name).read_bytes()
            for name in _STATIC
        }
        self.router = Router(
            routes=[
                Route("/", self._guarded(self.overview)),
                Route("/events", self._guarded(self.event_list)),
                Route("/events/{id:int}", self._guarded(self.event_page)),
                Route("/events/{id:int}/replay", self._guarded(self.replay_one), methods=["POST"]),
                Route("/replay-dead", self._guarded(self.replay_dead), methods=["POST"]),
                Route("/api/counts", self._guarded(self.api_counts)),
                Route("/api/events", self._guarded(self.api_events)),
                Route("/api/events/{id:int}", self._guarded(self.api_event)),
                Route("/api/activity", self._guarded(self.api_activity)),
                Route("/login", self.login_form, methods=["GET"]),
                Route("/login", self.login, methods=["POST"]),
                Route("/logout", self._guarded(self.logout), methods=["POST"]),
                Route("/static/{name}", self.static_file),
            ],
            redirect_slashes=False,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.router(scope, receive, send)
            return

        async def secure_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
            await send(message)

        request = Request(scope, receive)
        if not self.access.allowed(request):
            # Local mode and a remote client (or a rebinding Host): say why,
            # without showing anything else.
            response: Response = self._page(
                request,
                "refused.html",
                {"title": "Dashboard refused"},
                status=403,
            )
            await response(scope, receive, secure_send)
            return
        if _route_path(scope) == "":
            # Mounted at /dashboard and asked for /dashboard: the pages' links
            # are relative to /dashboard/.
            await RedirectResponse(self._base(request) + "/", 307)(scope, receive, secure_send)
            return
        await self.router(scope, receive, secure_send)

    # Plumbing.

    @staticmethod
    def _base(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    def _guarded(self, endpoint: Endpoint) -> Endpoint:
        """`endpoint` behind the login; database failures become a 503 page."""

        async def guarded(request: Request) -> Response:
            try:
                signed_in = await self._signed_in(request)
            except StoreError as exc:
                log.warning("dashboard: database error: %s", exc)
                return self._page(
                    request, "error.html", {"title": "Database not reachable"}, status=503
                )
            if not signed_in:
                return self._unauthenticated(request)
            problem = _bad_parameters(request)
            if problem is not None:
                if _wants_json(request):
                    return _bad_request(problem)
                return self._page(request, "error.html", {"title": problem}, status=400)
            if request.path_params.get("id", 0) > _MAX_ID:
                # Past the id column's range: no such event (not a database error).
                if _wants_json(request):
                    return JSONResponse({"error": "no such event"}, 404)
                return self._page(request, "error.html", {"title": "No such event"}, status=404)
            try:
                return await endpoint(request)
            except StoreError as exc:
                log.warning("dashboard: database error: %s", exc)
                if _wants_json(request):
                    return JSONResponse({"error": "database not reachable"}, 503)
                return self._page(
                    request, "error.html", {"title": "Database not reachable"}, status=503
                )

        return guarded

    async def _signed_in(self, request: Request) -> bool:
        """Token mode: the bearer token, or a login cookie naming an open
        session. Local mode: always (the local rule was checked first)."""
        if not self.access.requires_token or self.access.bearer(request):
            request.state.signed_in = self.access.requires_token
            return True
        session_id = self.access.session_id(request)
        valid = session_id is not None and await run_in_threadpool(self.sessions.valid, session_id)
        request.state.signed_in = valid
        return valid

    def _unauthenticated(self, request: Request) -> Response:
        if _wants_json(request):
            return JSONResponse(
                {"error": "authentication required"},
                401,
                headers={"www-authenticate": 'Bearer realm="onceonly dashboard"'},
            )
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return self._page(
            request,
            "login.html",
            {"title": "Sign in", "next": target, "error": None},
            status=401,
            headers={"www-authenticate": 'Bearer realm="onceonly dashboard"'},
        )

    def _page(
        self,
        request: Request,
        template: str,
        context: dict[str, Any],
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> HTMLResponse:
        defaults = {
            "base": self._base(request),
            "csrf": self.access.csrf_token,
            "signed_in": getattr(request.state, "signed_in", False),
            "version": __version__,
            "live": False,
            "event_id": None,
        }
        html = self.templates.get_template(template).render({**defaults, **context})
        return HTMLResponse(html, status, headers=headers)

    async def _form(self, request: Request) -> dict[str, str] | None:
        """A small urlencoded form, or ``None`` when it is too big to be ours."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_FORM_BYTES:
            return None
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                return None
        return {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}

    def _next(self, request: Request, candidate: str | None, fallback: str) -> str:
        """Where to go after an action: only a path inside the dashboard (no open redirect)."""
        base = self._base(request)
        if (
            candidate
            and candidate.startswith(base + "/")
            and not candidate.startswith("//")
            and "\\" not in candidate
        ):
            return candidate
        return fallback

    # Pages.

    async def overview(self, request: Request) -> Response:
        replayed = request.query_params.get("replayed", "")
        counts = await run_in_threadpool(self.reader.counts)
        dead = await run_in_threadpool(
            lambda: self.reader.events(status=EventStatus.DEAD.value, limit=20)
        )
        minutes = _minutes(request)
        activity = await run_in_threadpool(self.reader.activity, minutes)
        return self._page(
            request,
            "overview.html",
            {
                "title": "Overview",
                "counts": counts,
                "statuses": STATUSES,
                "dead": dead,
                "live": True,
                "replayed": replayed if replayed.isdigit() else None,
                "activity": activity,
                "charts": activity_charts(activity.minutes),
                "windows": sorted({*_WINDOWS, minutes}),
            },
        )

    async def event_list(self, request: Request) -> Response:
        q = request.query_params
        provider = q.get("provider") or None
        status = q.get("status") or None
        event_type = q.get("type") or None
        # Pasted from a provider's console: the spaces around it are not part of it.
        object_id = q.get("object_id", "").strip() or None
        tenant = q.get("tenant") or None
        event_id = q.get("event_id") or None
        before = q.get("before", "")
        before_id = int(before) if before.isdigit() else None
        if status is not None and status not in STATUSES:
            status = None
        rows = await run_in_threadpool(
            lambda: self.reader.events(
                provider=provider,
                status=status,
                event_type=event_type,
                before_id=before_id,
                limit=PAGE_SIZE,
                object_id=object_id,
                tenant=tenant,
                event_id=event_id,
            )
        )
        counts = await run_in_threadpool(self.reader.counts)
        filters = {
            "provider": provider or "",
            "tenant": tenant or "",
            "status": status or "",
            "type": event_type or "",
            "event_id": event_id or "",
            "object_id": object_id or "",
        }
        older = None
        if len(rows) == PAGE_SIZE:
            older = urlencode({**{k: v for k, v in filters.items() if v}, "before": rows[-1].id})
        return self._page(
            request,
            "events.html",
            {
                "title": "Events",
                "rows": rows,
                "filters": filters,
                "providers": list(counts.by_provider),
                "statuses": STATUSES,
                "older": older,
                "with_duplicates": counts.duplicates is not None,
                "with_tenants": self.onceonly.tenants is not None or any(r.tenant for r in rows),
                "replayable": REPLAYABLE,
                "here": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            },
        )

    async def event_page(self, request: Request) -> Response:
        pk: int = request.path_params["id"]
        detail = await run_in_threadpool(self.reader.event, pk)
        if detail is None:
            return self._page(request, "error.html", {"title": f"No event {pk}"}, status=404)
        content_type = next(
            (v for k, v in detail.headers.items() if k.lower() == "content-type"), None
        )
        return self._page(
            request,
            "event.html",
            {
                "title": f"Event {pk}",
                "event": detail.row,
                "detail": detail,
                "headers": self.redactor.headers(detail.headers),
                "body": self.redactor.body(detail.body, content_type),
                "replayable": REPLAYABLE,
                "notice": request.query_params.get("notice"),
                "event_id": pk,
            },
        )

    # Actions.

    async def replay_one(self, request: Request) -> Response:
        pk: int = request.path_params["id"]
        form = await self._form(request)
        if form is None or not self.access.csrf_ok(request, form.get("csrf")):
            return self._forbidden(request)
        detail = await run_in_threadpool(self.reader.event, pk)
        if detail is None:
            return self._page(request, "error.html", {"title": f"No event {pk}"}, status=404)
        replayed: list[int] = []
        if detail.row.status in REPLAYABLE:
            # The status in the WHERE clause: if a worker moved the event in
            # the meantime, nothing happens.
            status = EventStatus(detail.row.status)
            replayed = await run_in_threadpool(
                lambda: replay(
                    self.onceonly.engine, self.onceonly.engine_kind, id=pk, status=status
                )
            )
        notice = "replayed" if replayed else "not-replayable"
        log.info("dashboard: event %s %s", pk, notice)
        if _wants_json(request):
            return JSONResponse({"replayed": replayed})
        fallback = f"{self._base(request)}/events/{pk}"
        target = self._next(request, form.get("next"), fallback)
        separator = "&" if "?" in target else "?"
        return RedirectResponse(f"{target}{separator}notice={notice}", 303)

    async def replay_dead(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None or not self.access.csrf_ok(request, form.get("csrf")):
            return self._forbidden(request)
        replayed = await run_in_threadpool(
            lambda: replay(self.onceonly.engine, self.onceonly.engine_kind, status=EventStatus.DEAD)
        )
        log.info("dashboard: replayed %d dead event(s)", len(replayed))
        if _wants_json(request):
            return JSONResponse({"replayed": replayed})
        return RedirectResponse(f"{self._base(request)}/?replayed={len(replayed)}", 303)

    def _forbidden(self, request: Request) -> Response:
        if _wants_json(request):
            return JSONResponse({"error": "CSRF check failed"}, 403)
        return self._page(
            request, "error.html", {"title": "Form expired: reload the page and retry"}, status=403
        )

    # JSON.

    async def api_counts(self, request: Request) -> Response:
        counts = await run_in_threadpool(self.reader.counts)
        return JSONResponse(counts.to_dict())

    async def api_events(self, request: Request) -> Response:
        q = request.query_params
        before = q.get("before", "")
        limit = q.get("limit", "")
        rows = await run_in_threadpool(
            lambda: self.reader.events(
                provider=q.get("provider") or None,
                status=q.get("status") or None,
                event_type=q.get("type") or None,
                before_id=int(before) if before.isdigit() else None,
                limit=min(int(limit), 1000) if limit.isdigit() else PAGE_SIZE,
                object_id=q.get("object_id", "").strip() or None,
                tenant=q.get("tenant") or None,
                event_id=q.get("event_id") or None,
            )
        )
        return JSONResponse([r.to_dict() for r in rows])

    async def api_activity(self, request: Request) -> Response:
        activity = await run_in_threadpool(self.reader.activity, _minutes(request))
        return JSONResponse(activity.to_dict())

    async def api_event(self, request: Request) -> Response:
        pk: int = request.path_params["id"]
        detail = await run_in_threadpool(self.reader.event, pk)
        if detail is None:
            return JSONResponse({"error": "no such event"}, 404)
        return JSONResponse(
            {
                **detail.row.to_dict(),
                "replayable": detail.row.status in REPLAYABLE,
                "processed_at": detail.processed_at,
            }
        )

    # Login.

    async def login_form(self, request: Request) -> Response:
        if not self.access.requires_token:
            return RedirectResponse(f"{self._base(request)}/", 303)
        return self._page(
            request,
            "login.html",
            {"title": "Sign in", "next": f"{self._base(request)}/", "error": None},
        )

    async def login(self, request: Request) -> Response:
        base = self._base(request)
        form = await self._form(request)
        if form is None or not self.access.same_origin(request):
            return self._forbidden(request)
        if not self.access.requires_token:
            return RedirectResponse(f"{base}/", 303)
        target = self._next(request, form.get("next"), f"{base}/")
        if not self.access.token_matches(form.get("token", "")):
            client = request.client.host if request.client else "?"
            log.warning("dashboard: wrong token from %s", client)
            return self._page(
                request,
                "login.html",
                {"title": "Sign in", "next": target, "error": "That token is not right."},
                status=401,
            )
        session_id = await run_in_threadpool(self.sessions.open)
        response = RedirectResponse(target, 303)
        response.set_cookie(
            COOKIE_NAME,
            self.access.session_cookie(session_id),
            max_age=SESSION_SECONDS,
            path=f"{base}/",
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return response

    async def logout(self, request: Request) -> Response:
        form = await self._form(request)
        if form is None or not self.access.csrf_ok(request, form.get("csrf")):
            return self._forbidden(request)
        session_id = self.access.session_id(request)
        if session_id is not None:
            # Ended where it lives: the cookie is dead on every receiver,
            # whatever a copy of it (a shared machine, a stolen one) sends.
            await run_in_threadpool(self.sessions.end, session_id)
        base = self._base(request)
        response = RedirectResponse(f"{base}/login", 303)
        response.delete_cookie(COOKIE_NAME, path=f"{base}/", httponly=True, samesite="strict")
        return response

    async def static_file(self, request: Request) -> Response:
        name: str = request.path_params["name"]
        if name not in self.static:
            return Response("not found", 404, media_type="text/plain")
        return Response(self.static[name], media_type=_STATIC[name])


def _route_path(scope: Scope) -> str:
    """The path below the mount point (``""`` for the mount point itself)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root) and (len(path) == len(root) or path[len(root)] == "/"):
        return path[len(root) :]
    return path


def _bad_request(detail: str) -> Response:
    """An RFC 9457 problem document, as the receiver answers; ``error`` too,
    the key the dashboard's other JSON errors use."""
    return JSONResponse(
        {
            "type": "urn:onceonly:problem:bad-query",
            "title": "Bad query string",
            "status": 400,
            "detail": detail,
            "error": detail,
        },
        400,
        media_type="application/problem+json",
    )


def _wants_json(request: Request) -> bool:
    """JSON endpoints, clients that ask for JSON, and scripts (a bearer token)."""
    return (
        _route_path(request.scope).startswith("/api/")
        or "application/json" in request.headers.get("accept", "")
        or request.headers.get("authorization", "").lower().startswith("bearer ")
    )
