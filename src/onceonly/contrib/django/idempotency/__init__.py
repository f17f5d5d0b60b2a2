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

The store's coroutines always run on the process's background loop
(:func:`onceonly._threads.background_loop`), also for async views under ASGI:
a store's connections belong to one loop (asyncpg's pool does), and the
project's store is shared with everything else onceonly does in the process
(the webhook view, the WSGI front end). A sync view blocks its server thread
on that loop; an async view awaits it, and itself runs on the server's loop.
"""

from __future__ import annotations

from .middleware import IdempotencyMiddleware, idempotent
from .scopes import RequestScope, user_scope

__all__ = ["IdempotencyMiddleware", "RequestScope", "idempotent", "user_scope"]
