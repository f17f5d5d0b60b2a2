"""The ASGI receiver: ``POST /webhooks/{provider}``.

A pure ASGI class (no framework per request: this is the hot path). Mount it in
any ASGI app::

    app = Starlette(routes=[Mount("/webhooks", app=onceonly.receiver())])

Answers, in the order they are decided:

===========================================  ======  =================================
situation                                    status  stored
===========================================  ======  =================================
path is not ``/{provider}[/{tenant}]``       404     no
method is not POST                           405     no
provider not configured                      404     no
tenant not a valid name, or not known        404     no
tenant resolver failed                       503     no (``Retry-After``)
headers over ``max_header_bytes``           431     no
body over ``max_body_bytes``                 413     no
body not complete within ``body_timeout``    408     no
signature missing, malformed, wrong, stale   401*    no
body not parseable, or no event id           400     no
database unreachable                         503     no (``Retry-After`` says when)
new event                                    200     yes, committed before the answer
duplicate                                    200     already (``Onceonly-Duplicate: true``)
===========================================  ======  =================================

(*) configurable per provider. Errors are ``application/problem+json``.
``/{provider}/{tenant}`` verifies with that tenant's secrets only (see
:mod:`onceonly.tenants`); the tenant is stored with the event.
A duplicate is not an error: answering anything but 2xx makes the sender retry
even more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl

from ._exceptions import (
    BodyTimeout,
    BodyTooLarge,
    DeliveryRejected,
    StoreError,
    TenantUnavailable,
)
from .asgi import (
    Receive,
    Scope,
    Send,
    lower_header_list,
    lower_headers,
    read_body,
    send_response,
)
from .deadlines import Deadlines
from .events import Delivery, NewEvent, Receipt
from .headers import ReadHeaders
from .metrics import MetricsEndpoint
from .reception import METHOD_NOT_ALLOWED, NOT_FOUND, Answer, Reception
from .settings import ReceiverSettings

if TYPE_CHECKING:
    from .inbox import Inbox
    from .metrics import Metrics

__all__ = ["Pending", "Receiver"]


log = logging.getLogger("onceonly.receiver")

_JSON = (b"content-type", b"application/json")
# Not a provider name: those never contain "/".
_METRICS = "/metrics"


class Receiver:
    """ASGI app receiving webhook deliveries into an :class:`~onceonly.inbox.Inbox`.

    Built by :meth:`Onceonly.receiver() <onceonly.Onceonly.receiver>` and
    :meth:`~onceonly.Onceonly.asgi`, from the parts it uses: the inbox, the
    metrics it counts answers in, and the receiver's slice of the settings.

    `prefix` is the path the provider name follows (``/webhooks`` when serving
    stand-alone; empty when mounted, since the mount point is the prefix).
    With a prefix it also answers ``GET /healthz`` and, when `serve_metrics`
    is set, ``GET /metrics`` (Prometheus; see :mod:`onceonly.metrics`).
    Every answer to a delivery is counted in ``metrics`` either way.
    """

    def __init__(
        self,
        inbox: Inbox,
        metrics: Metrics,
        settings: ReceiverSettings,
        *,
        serve_metrics: bool = True,
        prefix: str = "",
    ) -> None:
        self.inbox = inbox
        self.metrics = metrics
        self.serve_metrics = serve_metrics
        self._metrics_endpoint = MetricsEndpoint(self.metrics)
        self.prefix = prefix.rstrip("/")
        #: The answers (shared with the framework views: one table).
        self.reception = Reception(inbox, metrics, settings)
        self._deadlines = Deadlines()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.inbox.store.open()
                except StoreError as exc:
                    # Start anyway: deliveries get 503 until the database is
                    # back, and the store reconnects on its own.
                    log.warning("database not reachable at start-up: %s", exc)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.inbox.store.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _route(self, scope: Scope) -> tuple[str, str] | None:
        path: str = scope["path"]
        root: str = scope.get("root_path", "")
        # Starlette's Mount keeps the full path and sets root_path; other
        # servers strip it. Accept both.
        if root and path.startswith(root):
            path = path[len(root) :]
        return self._route_path(path)

    def _route_path(self, path: str) -> tuple[str, str] | None:
        if self.prefix:
            if path == "/healthz":
                return "", ""
            if path == _METRICS and self.serve_metrics:
                return _METRICS, ""
            if not path.startswith(self.prefix + "/"):
                return None
            path = path[len(self.prefix) :]
        # "/{provider}" or "/{provider}/{tenant}"; the tenant is checked by
        # the inbox (a name, not a path: "..", "%00" and the like are 404s).
        name, slash, tenant = path[1:].partition("/")
        if not name or "/" in tenant or (slash and not tenant):
            return None
        return name, tenant

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self._route(scope)
        if route is None:
            await _send(send, NOT_FOUND)
            return
        provider, tenant = route
        if provider == "":
            await self._health(send)
            return
        if provider == _METRICS:
            await self._metrics_endpoint(scope, receive, send)
            return
        if scope["method"] != "POST":
            await _send(send, METHOD_NOT_ALLOWED)
            return
        reception = self.reception
        try:
            # 404 before reading the body: unknown provider, unknown tenant.
            verifier = await self.inbox.verifier(provider, tenant)
            # Wrapped here, once: the inbox keeps the headers its provider reads.
            headers = ReadHeaders(lower_headers(scope, reception.max_header_bytes))
            try:
                # A sender trickling its body must not hold the connection
                # (and the request's memory) for as long as it likes.
                with self._deadlines.limit(reception.body_timeout):
                    body = await read_body(headers, receive, reception.max_body_bytes)
            except TimeoutError:
                raise BodyTimeout(
                    f"the body did not arrive within {reception.body_timeout:g} s"
                ) from None
        except DeliveryRejected as exc:
            await _send(send, reception.rejected(provider, exc, tenant))
            return
        except TenantUnavailable as exc:
            await _send(send, reception.tenant_failed(provider, exc, tenant))
            return
        if body is None:
            return  # the client disconnected; there is nobody to answer
        delivery = _delivery(provider, tenant, headers, scope.get("query_string", b""), body)
        await _send(send, await reception.receive(delivery, verifier))

    def receive_now(
        self,
        path: str,
        query: bytes,
        raw_headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        answered: Callable[[Answer | BaseException], None],
    ) -> Answer | Pending | None:
        """A ``POST`` whose whole body is in hand, answered without an ASGI
        call: what ``onceonly serve``'s protocol (:mod:`onceonly.cli.protocol`)
        uses on its hot path, where a task, a scope and four ASGI messages
        per delivery cost the event loop more than the answer does.

        `path` is the request's (percent-decoded, as ASGI's ``path``),
        `raw_headers` as ASGI's (lower-case names). The answer, when it is
        decided at once (a 4xx); a :class:`Pending` when the event went into
        the group commit, which gives `answered` the answer once the batch
        committed (or the exception :meth:`__call__` would have let through,
        for the server's 500); ``None`` for a request to serve through
        :meth:`__call__` instead, which gives the same answers: anything but a
        delivery to ``/{provider}``, or with tracing on.
        """
        route = self._route_path(path)
        if route is None or self.inbox.tracing.enabled:
            return None
        provider, tenant = route
        if tenant or not provider or provider == _METRICS:
            return None  # a tenant's secrets may take an await to find
        reception = self.reception
        try:
            verifier = self.inbox.own_verifier(provider)
            headers = ReadHeaders(lower_header_list(raw_headers, reception.max_header_bytes))
            if len(body) > reception.max_body_bytes:
                raise BodyTooLarge(f"body is over the {reception.max_body_bytes}-byte limit")
            event = self.inbox.prepare(_delivery(provider, tenant, headers, query, body), verifier)
        except DeliveryRejected as exc:
            return reception.rejected(provider, exc, tenant)
        pending = Pending(reception, event, answered)
        self.inbox.commits.add(event, pending)
        return pending

    async def _health(self, send: Send) -> None:
        try:
            await self.inbox.store.open()
            await self.inbox.store.schema_version()
        except StoreError as exc:
            # Unauthenticated and often public: it says up or down, and
            # nothing about the deployment (host, user, database, engine).
            log.warning("health check: database unavailable: %s", exc)
            await _send(send, self.reception.unhealthy)
            return
        await send_response(send, 200, b'{"status":"ok"}', [_JSON])


def _delivery(
    provider: str, tenant: str, headers: ReadHeaders, query: bytes, body: bytes
) -> Delivery:
    return Delivery(
        provider=provider,
        body=body,
        headers=headers,
        query=dict(parse_qsl(query.decode("latin-1"))) if query else {},
        tenant=tenant,
    )


class Pending:
    """A delivery's event in the group commit (:meth:`Receiver.receive_now`),
    waiting for its batch: once it committed, or failed, the answer goes to
    `answered` (an :class:`Answer`, or the exception the receiver would not
    catch), from inside the group commit's task."""

    __slots__ = ("_done", "answered", "event", "reception")

    def __init__(
        self,
        reception: Reception,
        event: NewEvent,
        answered: Callable[[Answer | BaseException], None],
    ) -> None:
        self.reception = reception
        self.event = event
        self.answered = answered
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, receipt: Receipt, /) -> None:
        self._settle(receipt)

    def set_exception(self, exception: BaseException, /) -> None:
        self._settle(exception)

    def _settle(self, outcome: Receipt | BaseException) -> None:
        self._done = True
        try:
            answer: Answer | BaseException = self.reception.settled(self.event, outcome)
        except Exception as exc:
            answer = exc
        self.answered(answer)


async def _send(send: Send, answer: Answer) -> None:
    # A list of its own for each answer: middleware may add to it in place.
    headers = list(answer.asgi_headers)
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
