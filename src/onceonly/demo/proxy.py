"""A reverse proxy in front of the shop's app, as nginx or a load balancer would be.

It forwards every request and passes the answer back, except once for each
event in `fail_after_commit`: then it lets the app finish (and commit), throws
the app's answer away and tells the gateway ``502 Bad Gateway``, as a proxy
does when its upstream connection breaks just before the answer or an upstream
timeout fires. The gateway cannot know the payment was recorded, so it sends
the event again.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import AsyncIterator, Iterable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["FlakyProxy"]

_HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


class FlakyProxy:
    """ASGI reverse proxy to `upstream` that answers 502 after the commit, once per
    event id in `fail_after_commit`."""

    def __init__(self, upstream: str, *, fail_after_commit: Iterable[str] = ()) -> None:
        self.upstream = upstream.rstrip("/")
        self.pending_failures = set(fail_after_commit)
        self.answered_502 = 0
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        self.app = Starlette(
            routes=[Route("/{path:path}", self._forward, methods=["POST"])],
            lifespan=self._lifespan,
        )

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        yield
        if self._client is not None:
            await self._client.aclose()

    async def _forward(self, request: Request) -> Response:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64))
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k not in _HOP_BY_HOP}
        upstream = await self._client.post(
            f"{self.upstream}{request.url.path}",
            content=body,
            headers=headers,
            params=request.query_params,
        )
        if upstream.is_success and self._take_failure(body):
            return Response("Bad Gateway", status_code=502, media_type="text/plain")
        passed = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
        return Response(upstream.content, status_code=upstream.status_code, headers=passed)

    def _take_failure(self, body: bytes) -> bool:
        try:
            event_id = str(json.loads(body).get("id"))
        except (ValueError, AttributeError):
            return False
        with self._lock:
            if event_id in self.pending_failures:
                self.pending_failures.discard(event_id)
                self.answered_502 += 1
                return True
        return False
