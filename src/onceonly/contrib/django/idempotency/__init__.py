"""Idempotency-Key for Django views: a middleware for the whole project, or a
decorator for some views; sync views (WSGI) and async views (ASGI) alike.

::

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "onceonly.contrib.django.idempotency.IdempotencyMiddleware",   # after it
    ]
    ONCEONLY_IDEMPOTENCY = {"required": [r"^/api/orders/$"]}

    @idempotent(required=True)
    def create_order(request): ...

Every decision is the policy's (:class:`onceonly.idempotency.policy.IdempotencyPolicy`,
the one the ASGI and WSGI middleware use): the same keys, fingerprints,
answers and records, in the same tables. Keys are scoped by the logged-in
user (``request.user.pk``); an anonymous request falls back to a hash of its
``Authorization`` header, as the ASGI middleware's default scope.

A store's connections belong to one event loop (asyncpg's pool does). Sync
views wait on the process's background loop
(:func:`onceonly._threads.background_loop`), with the project's store, shared
with the rest of onceonly in the process; async views under ASGI claim and
record on the server's loop, where they run, on a store of that loop's own
(:class:`.front.Front`, :class:`.streams.Bridge`).

Modules: :mod:`.scopes` (whose key), :mod:`.front` (the request up to the
claim, the sync and async paths), :mod:`.responses` (Django responses in
and out of the policy), :mod:`.streams` (streamed responses, the loops),
:mod:`.middleware` (the middleware and the decorator).
"""

from __future__ import annotations

from .middleware import IdempotencyMiddleware, idempotent
from .scopes import RequestScope, user_scope

__all__ = ["IdempotencyMiddleware", "RequestScope", "idempotent", "user_scope"]
