"""onceonly as a Django app: ``INSTALLED_APPS += ["onceonly.contrib.django"]``.

Configuration lives in ``settings.ONCEONLY`` (see :mod:`.conf`); the tables are
created by ``manage.py migrate`` in the database the setting names; deliveries
arrive at ``include("onceonly.contrib.django.urls")``; handlers registered with
:func:`handler` in an installed app's ``webhooks.py`` run in
``manage.py onceonly_worker``, inside ``transaction.atomic()``. See
``docs/django.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ...handlers import Action, Backoff, Handler
from .conf import get_app, reset

__all__ = ["action", "get_app", "handler", "reset"]

H = TypeVar("H", bound=Handler)
A = TypeVar("A", bound=Action)


def handler(
    provider: str | None = None,
    event_type: str | None = None,
    *,
    prefetch: bool | str | Sequence[str] = False,
    attempts: int | None = None,
    backoff: Backoff | None = None,
) -> Callable[[H], H]:
    """Register a handler of the project's application (see
    :meth:`Onceonly.handler <onceonly.Onceonly.handler>`)::

        # shop/webhooks.py
        from onceonly.contrib.django import handler

        @handler("stripe", "payment_intent.succeeded")
        def on_payment(event, ctx):
            Payment.objects.create(...)   # commits with the event's mark

    Wildcard types, several handlers of one type, `attempts` and `backoff`
    work as there (docs/handlers.md).
    """
    return get_app().handler(
        provider, event_type, prefetch=prefetch, attempts=attempts, backoff=backoff
    )


def action(name: str) -> Callable[[A], A]:
    """Register an outbox action, run after the commit for ``ctx.stage(name, payload)``."""
    return get_app().action(name)
