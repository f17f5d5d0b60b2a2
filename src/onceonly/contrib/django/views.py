"""The receiver as a Django view: ``POST /webhooks/<provider>`` (and
``/webhooks/<provider>/<tenant>``, see :mod:`onceonly.tenants`).

The same answers as ``onceonly serve`` (see :mod:`onceonly.receiver`), decided
by the same :class:`~onceonly.reception.Reception`: 200 only after the event's
commit, 503 with ``Retry-After`` when the database is away, problem documents
for the rest. The inbox runs on the process's :func:`~onceonly._threads.
background_loop`, so the threads of a WSGI server share its group commit.

:func:`receive_async` is the same view for ASGI servers
(``onceonly.contrib.django.asgi_urls``).

CSRF-exempt: a provider has no CSRF token; the signature over the raw body is
the authentication.
"""

from __future__ import annotations

import asyncio
import os
import threading
from urllib.parse import parse_qsl

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from ..._exceptions import BodyTooLarge, DeliveryRejected, HeadersTooLarge
from ..._threads import background_loop
from ...config import Onceonly
from ...events import Delivery
from ...reception import METHOD_NOT_ALLOWED, Answer, Reception
from .conf import get_app

__all__ = ["receive", "receive_async"]


class _Current:
    """The reception of the current application in this process."""

    lock = threading.Lock()
    app: Onceonly | None = None
    pid = 0
    reception: Reception | None = None


def _reception() -> Reception:
    app = get_app()
    reception = _Current.reception
    if reception is not None and _Current.app is app and _Current.pid == os.getpid():
        return reception
    with _Current.lock:
        if _Current.reception is None or _Current.app is not app or _Current.pid != os.getpid():
            _Current.reception = Reception(app.inbox, app.metrics, app.settings.receiver)
            _Current.app, _Current.pid = app, os.getpid()
            background_loop().on_close(app.store.close)
        return _Current.reception


@csrf_exempt
def receive(request: HttpRequest, provider: str, tenant: str = "") -> HttpResponse:
    """One delivery to `provider` (for `tenant`), for WSGI (and ASGI); any
    method but POST gets 405."""
    reception = _reception()
    delivery = _delivery(request, provider, reception, tenant)
    if isinstance(delivery, Answer):
        return _response(delivery)
    return _response(background_loop().run(reception.receive(delivery)))


@csrf_exempt
async def receive_async(request: HttpRequest, provider: str, tenant: str = "") -> HttpResponse:
    """:func:`receive` as an async view, for ASGI servers: the request waits
    for its commit without holding a thread (Django runs a sync view on one
    thread for all requests under ASGI, so they would commit one by one)."""
    reception = _reception()
    delivery = _delivery(request, provider, reception, tenant)
    if isinstance(delivery, Answer):
        return _response(delivery)
    stored = background_loop().submit(reception.receive(delivery))
    return _response(await asyncio.wrap_future(stored))


def _delivery(
    request: HttpRequest, provider: str, reception: Reception, tenant: str = ""
) -> Delivery | Answer:
    """The request as a delivery, or the answer that refuses it (nothing stored).
    The tenant is looked up with the delivery, by the inbox (unknown: 404)."""
    if request.method != "POST":
        return METHOD_NOT_ALLOWED
    try:
        reception.inbox.provider(provider)  # 404 before reading the body
        headers = _headers(request, reception.max_header_bytes)
        body = _body(request, headers, reception.max_body_bytes)
    except DeliveryRejected as exc:
        return reception.rejected(provider, exc, tenant)
    raw_query = request.META.get("QUERY_STRING", "")
    return Delivery(
        provider=provider,
        body=body,
        headers=headers,
        query=dict(parse_qsl(raw_query)) if raw_query else {},
        tenant=tenant,
    )


def _headers(request: HttpRequest, limit: int) -> dict[str, str]:
    headers = {name.lower(): value for name, value in request.headers.items()}
    if sum(len(n) + len(v) for n, v in headers.items()) > limit:
        raise HeadersTooLarge(f"request headers are over the {limit}-byte limit")
    return headers


def _body(request: HttpRequest, headers: dict[str, str], limit: int) -> bytes:
    """The raw body, read from the stream: ``request.body`` would apply
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` and answer a big delivery with Django's own
    400 instead of onceonly's limit and 413."""
    declared = headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise BodyTooLarge(f"body of {declared[:20]} bytes is over the {limit}-byte limit")
    body = request.read(limit + 1)
    if len(body) > limit:
        raise BodyTooLarge(f"body is over the {limit}-byte limit")
    return body


def _response(answer: Answer) -> HttpResponse:
    response = HttpResponse(answer.body, status=answer.status)
    for name, value in answer.headers:
        response[name.decode("latin-1")] = value.decode("latin-1")
    return response
