"""The operator dashboard: what arrived, what is stuck, and why.

Shows events by provider and status, duplicates received, a filterable event
list, each event's attempts, last error, headers and payload (secrets
redacted), dead events with a replay button, and live counts. See
docs/dashboard.md.

``onceonly serve`` mounts it at ``dashboard_path`` (default ``/dashboard``)
through :func:`for_serve`; :class:`Dashboard` is the ASGI app to mount in your
own Starlette or FastAPI application.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..asgi import ASGIApp, Receive, Scope, Send
from .access import MIN_TOKEN_LENGTH, Access, is_loopback_host
from .app import Dashboard
from .redaction import Redactor

if TYPE_CHECKING:
    from ..deployment import Deployment

__all__ = [
    "MIN_TOKEN_LENGTH",
    "Access",
    "Dashboard",
    "DashboardMount",
    "Redactor",
    "for_serve",
    "is_loopback_host",
]

log = logging.getLogger("onceonly.dashboard")


class DashboardMount:
    """Sends `path` and everything under it to `dashboard`, the rest to `app`.

    Lifespan events go to `app` alone: the dashboard has nothing to start.
    """

    def __init__(self, app: ASGIApp, dashboard: ASGIApp, path: str) -> None:
        self.app = app
        self.dashboard = dashboard
        self.path = path.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            root: str = scope.get("root_path", "")
            path: str = scope["path"]
            # Servers differ on whether `path` includes `root_path`: accept both.
            relative = path[len(root) :] if root and path.startswith(root) else path
            if relative == self.path or relative.startswith(self.path + "/"):
                inner = dict(scope)
                inner["root_path"] = root + self.path
                if not (root and path.startswith(root)):
                    inner["path"] = root + path
                await self.dashboard(inner, receive, send)
                return
        await self.app(scope, receive, send)


def for_serve(app: Deployment, server: ASGIApp, *, host: str, port: int) -> ASGIApp:
    """`server` with the dashboard mounted, when it is safe to: ``onceonly serve``'s rule.

    Without a token, the dashboard is for this machine only; serving it on a
    public interface would leave only the per-request loopback check between
    the event payloads and the network, so it is not mounted at all, and the
    log says so.
    """
    settings = app.settings.dashboard
    path = settings.path
    if path is None:
        log.info("dashboard: off")
        return server
    if settings.token is None and not is_loopback_host(host):
        log.warning(
            "dashboard: disabled, because serve binds %s (not loopback) and no "
            "ONCEONLY_DASHBOARD_TOKEN is set; set one to serve the dashboard there "
            "(see docs/dashboard.md), or bind 127.0.0.1",
            host,
        )
        return server
    shown = f"[{host}]" if ":" in host else host
    log.info(
        "dashboard: http://%s:%d%s/ (%s)",
        shown,
        port,
        path,
        "access token required" if settings.token else "this machine only, no token",
    )
    return DashboardMount(server, Dashboard(app), path)
