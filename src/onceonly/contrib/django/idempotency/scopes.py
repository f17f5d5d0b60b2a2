"""The client an Idempotency-Key belongs to: the logged-in user, by default."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest

from ...._exceptions import ConfigurationError
from ....idempotency.keys import by_header
from ....wsgi import environ_headers

__all__ = ["RequestScope", "auser_scope", "user_of", "user_or_credential", "user_scope"]


#: Maps a request to the client its keys are scoped to; ``None`` or ``""``:
#: no client, and a request with a key is refused (400). A plain function
#: runs on the request's thread; under ASGI it must then not query the
#: database (Django refuses that in async code): make it ``async def``.
RequestScope = Callable[[HttpRequest], "str | Awaitable[str | None] | None"]

FALLBACK = by_header("authorization")


def user_or_credential(request: HttpRequest, user: Any) -> str | None:
    """``user:<pk>`` for a logged-in `user`; else the Authorization scope."""
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    # No user: the credential the client sends, as the ASGI default (a
    # 32-character hash, never equal to a "user:" scope).
    return FALLBACK(environ_headers(request.META))


def user_of(request: HttpRequest) -> Any:
    """``request.user``, or what to fix when the request has none."""
    if not hasattr(request, "user"):
        raise ConfigurationError(
            "the Idempotency-Key scope reads request.user: put "
            "onceonly.contrib.django.idempotency.IdempotencyMiddleware after "
            "django.contrib.auth.middleware.AuthenticationMiddleware in MIDDLEWARE, "
            "or give scope="
        )
    return request.user


def user_scope(request: HttpRequest) -> str | None:
    """The default scope: the logged-in user (``user:<pk>``); for an anonymous
    request, a hash of its ``Authorization`` header, or no client."""
    return user_or_credential(request, user_of(request))


async def auser_scope(request: HttpRequest) -> str | None:
    """:func:`user_scope` for async views: the session is loaded off the loop."""
    user_of(request)
    auser = getattr(request, "auser", None)  # Django 5.0+
    if auser is None:
        return await sync_to_async(user_scope)(request)
    return user_or_credential(request, await auser())
