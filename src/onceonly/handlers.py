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

Order per object (``ordered=True`` or ``ordering_key=``): the receiving
process asks :meth:`HandlerRegistry.ordering_key` for each new event's key,
so that the key is in the row before any worker can claim it, and the claim
(the database) decides what runs next; see ``docs/ordering.md``.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from ._exceptions import ConfigurationError
from .events import Event, NewEvent

__all__ = ["Action", "Handler", "HandlerRegistry", "OrderingKey", "Registration", "by_object"]

log = logging.getLogger("onceonly.handlers")

#: ``handler(event, ctx)``; may be a coroutine function.
Handler: TypeAlias = Callable[[Event, Any], Any]
#: ``action(payload, key)``: runs after the commit, at least once; pass `key`
#: to the other side (an e-mail API's idempotency key) to make it once.
Action: TypeAlias = Callable[[Any, str], Any] | Callable[[Any, str], Awaitable[Any]]
#: ``key(event)``: the ordering key of an event about to be stored (a
#: :class:`~onceonly.NewEvent`: provider, type, body, headers, tenant, object
#: id, creation time), or ``None`` for no order. Runs in the receiving process.
OrderingKey: TypeAlias = Callable[[NewEvent], "str | None"]

#: Keys longer than this are stored as their SHA-256: same key, same digest.
_LONGEST_KEY = 200


def by_object(event: NewEvent) -> str | None:
    """The ordering key of ``ordered=True``: the provider's object (a payment's id)."""
    return event.object_id


@dataclass(frozen=True, slots=True)
class Registration:
    handler: Handler
    provider: str | None
    event_type: str | None
    #: What to read from the provider's API before the transaction opens, for
    #: ``ctx.fetch(kind)`` (``None``: what the event points to).
    prefetch: tuple[str | None, ...] = ()
    #: The ordering key of its events (``None``: unordered).
    ordering: OrderingKey | None = None

    @property
    def ordered(self) -> bool:
        return self.ordering is not None

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
        ordering: OrderingKey | None = None,
    ) -> None:
        key = (provider, event_type)
        if key in self._handlers:
            raise ConfigurationError(
                f"a handler is already registered for provider={provider!r}, "
                f"event_type={event_type!r}: {self._handlers[key].name}"
            )
        self._handlers[key] = Registration(handler, provider, event_type, prefetch, ordering)

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

    def ordering_key(self, event: NewEvent) -> str | None:
        """The ordering key to store with `event`: its handler's key, prefixed
        with provider and tenant (two providers' or accounts' ids never share
        an order); ``None`` when its handler is unordered or names no key.

        A key function that raises, or returns what no engine stores (not a
        string, a NUL), leaves the event unordered, with a warning: the event
        is signed and valid, and refusing it would lose it.
        """
        registration = self.resolve(event.provider, event.event_type)
        if registration is None or registration.ordering is None:
            return None
        try:
            key = registration.ordering(event)
        except Exception:
            log.warning(
                "event %s (%s %s): the ordering key of %s raised; stored unordered",
                event.event_id,
                event.provider,
                event.event_type,
                registration.name,
                exc_info=True,
            )
            return None
        if key is None:
            return None
        if not isinstance(key, str) or not key or "\x00" in key or not _encodable(key):
            log.warning(
                "event %s (%s %s): %s gave the ordering key %r, not a non-empty string "
                "without NUL; stored unordered",
                event.event_id,
                event.provider,
                event.event_type,
                registration.name,
                key,
            )
            return None
        if len(key) > _LONGEST_KEY:
            key = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
        return f"{event.provider}/{event.tenant}/{key}"

    def __len__(self) -> int:
        return len(self._handlers)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, from JSON's \ud800
        return False
    return True
