"""The middleware for the whole project, and the decorator for one view."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, Unpack, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponseBase

from ...._exceptions import ConfigurationError
from ....idempotency.policy import PolicyOptions
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
    scope: RequestScope | str | None = None,
    **options: Unpack[PolicyOptions],
) -> Callable[[V], V]:
    """Idempotency-Key for one view, sync or async (for a class-based view,
    ``method_decorator(idempotent(...), name="post")``).

    The options are those of :class:`~onceonly.idempotency.IdempotencyMiddleware`;
    `store` defaults to the project's (``get_app().store``) and `scope` to
    :func:`user_scope` (a function of the request, sync or async, or its
    dotted path). Behind :class:`IdempotencyMiddleware` the middleware's
    options apply, and the key is claimed once.
    """
    front = Front({"store": store, "scope": scope, **options})

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
