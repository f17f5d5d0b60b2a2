"""The middleware for the whole project, and the decorator for one view."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

from ...._exceptions import ConfigurationError
from ....idempotency.policy import CHUNK, DEFAULT_RELEASE_STATUSES
from .front import Front
from .scopes import RequestScope

if TYPE_CHECKING:
    from ....store import Store

__all__ = ["IdempotencyMiddleware", "idempotent"]


# The middleware and the decorator.


def settings_options() -> dict[str, Any]:
    """The middleware's options: ``settings.ONCEONLY_IDEMPOTENCY``."""
    value = getattr(settings, "ONCEONLY_IDEMPOTENCY", {})
    if not isinstance(value, Mapping):
        raise ConfigurationError("settings.ONCEONLY_IDEMPOTENCY must be a dict")
    return dict(value)


class IdempotencyMiddleware:
    """Django middleware: Idempotency-Key for every covered request of the project.

    Its options are ``settings.ONCEONLY_IDEMPOTENCY``, a dict of the keyword
    options of :func:`idempotent`. Put it after ``AuthenticationMiddleware``:
    the default scope reads ``request.user``. Sync under WSGI, async under
    ASGI: Django calls it the way the project runs, with no thread hop.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.front = Front(settings_options())
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return self.front.handle(request, lambda: self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        return await self.front.ahandle(
            request, lambda: cast(Awaitable[HttpResponseBase], self.get_response(request))
        )


V = TypeVar("V", bound=Callable[..., Any])


def idempotent(
    *,
    store: Store | None = None,
    methods: Collection[str] = ("POST", "PATCH"),
    paths: Sequence[str] | None = None,
    required: bool | Sequence[str] = False,
    scope: RequestScope | str | None = None,
    fingerprint_headers: Sequence[str] = ("content-type",),
    ttl: float = 24 * 3600,
    lock_timeout: float = 60.0,
    on_conflict: Literal["409", "wait"] = "409",
    wait_timeout: float = 30.0,
    max_request_bytes: int = 1024 * 1024,
    inline_limit: int = CHUNK,
    release_statuses: Collection[int] = DEFAULT_RELEASE_STATUSES,
    replay_set_cookie: bool = False,
    cache_bytes: int = 32 * 1024 * 1024,
) -> Callable[[V], V]:
    """Idempotency-Key for one view, sync or async (for a class-based view,
    ``method_decorator(idempotent(...), name="post")``).

    The options are those of :class:`~onceonly.idempotency.IdempotencyMiddleware`;
    `store` defaults to the project's (``get_app().store``) and `scope` to
    :func:`user_scope` (a function of the request, sync or async, or its
    dotted path). Behind :class:`IdempotencyMiddleware` the middleware's
    options apply, and the key is claimed once.
    """
    front = Front(
        {
            "store": store,
            "methods": methods,
            "paths": paths,
            "required": required,
            "scope": scope,
            "fingerprint_headers": fingerprint_headers,
            "ttl": ttl,
            "lock_timeout": lock_timeout,
            "on_conflict": on_conflict,
            "wait_timeout": wait_timeout,
            "max_request_bytes": max_request_bytes,
            "inline_limit": inline_limit,
            "release_statuses": release_statuses,
            "replay_set_cookie": replay_set_cookie,
            "cache_bytes": cache_bytes,
        }
    )

    def decorate(view: V) -> V:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                return await front.ahandle(request, lambda: view(request, *args, **kwargs))

            return cast(V, async_view)

        @functools.wraps(view)
        def sync_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return front.handle(request, lambda: view(request, *args, **kwargs))

        return cast(V, sync_view)

    return decorate
