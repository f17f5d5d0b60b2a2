"""Handlers: user code that turns an event into effects, exactly once.

A handler is a plain function or a coroutine function taking ``(event, ctx)``.
It runs inside the database transaction that also marks its event
``processed``: its own writes through ``ctx.connection`` (SQLAlchemy Core) or
``ctx.session`` (ORM) and the mark commit together or not at all.

::

    @app.handler("stripe", "payment_intent.succeeded")
    def record_payment(event: Event, ctx: Context) -> None:
        data = json.loads(event.body)["data"]["object"]
        ctx.connection.execute(payments.insert().values(intent=data["id"], amount=data["amount"]))
        charge = ctx.effect("grant-access", lambda key: access_api.grant(data["customer"], key=key))
        ctx.stage("email", {"to": data["receipt_email"], "charge": charge})

Resolution picks the most specific registration: (provider, type), then
(provider, any type), then (any provider, type), then the catch-all.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._exceptions import ConfigurationError
from .events import Event

__all__ = ["Action", "Handler", "HandlerRegistry", "Registration"]

#: ``handler(event, ctx)``; may be a coroutine function.
Handler: TypeAlias = Callable[[Event, Any], Any]
#: ``action(payload, key)``: runs after the commit, at least once; pass `key`
#: to the other side (an e-mail API's idempotency key) to make it once.
Action: TypeAlias = Callable[[Any, str], Any] | Callable[[Any, str], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Registration:
    handler: Handler
    provider: str | None
    event_type: str | None
    #: What to read from the provider's API before the transaction opens, for
    #: ``ctx.fetch(kind)`` (``None``: what the event points to).
    prefetch: tuple[str | None, ...] = ()

    @property
    def name(self) -> str:
        fn = self.handler
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.handler)


class HandlerRegistry:
    """Handlers by (provider, event type), and outbox actions by name."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str | None, str | None], Registration] = {}
        self.actions: dict[str, Action] = {}

    def add(
        self,
        handler: Handler,
        provider: str | None = None,
        event_type: str | None = None,
        prefetch: tuple[str | None, ...] = (),
    ) -> None:
        key = (provider, event_type)
        if key in self._handlers:
            raise ConfigurationError(
                f"a handler is already registered for provider={provider!r}, "
                f"event_type={event_type!r}: {self._handlers[key].name}"
            )
        self._handlers[key] = Registration(handler, provider, event_type, prefetch)

    def add_action(self, name: str, action: Action) -> None:
        if name in self.actions:
            raise ConfigurationError(f"an outbox action named {name!r} is already registered")
        self.actions[name] = action

    def resolve(self, provider: str, event_type: str | None) -> Registration | None:
        for key in ((provider, event_type), (provider, None), (None, event_type), (None, None)):
            found = self._handlers.get(key)
            if found is not None:
                return found
        return None

    def __len__(self) -> int:
        return len(self._handlers)
