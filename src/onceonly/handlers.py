"""Handlers: user code that turns an event into effects, exactly once.

A handler is a plain function or a coroutine function taking ``(event, ctx)``.
It runs inside the database transaction that also marks its event
``processed``: its own writes through ``ctx.connection`` (SQLAlchemy Core) or
``ctx.session`` (ORM) and the mark commit together or not at all.

::

    @app.handler("stripe", "payment_intent.*", attempts=5, backoff=(10, 600))
    def record_payment(event: Event, ctx: Context) -> None:
        data = event.json()["data"]["object"]
        ctx.connection.execute(payments.insert().values(intent=data["id"], amount=data["amount"]))
        charge = ctx.effect("grant-access", lambda key: access_api.grant(data["customer"], key=key))
        ctx.stage("email", {"to": data["receipt_email"], "charge": charge})

Resolution picks the most specific registration: the provider first, then the
type. For provider ``P`` and type ``T``: (P, T), then (P, the longest wildcard
matching T), then (P, any type); then the same three for any provider; then
nothing. A wildcard is ``*`` as the last segment of a type, after ``.``,
``/`` or ``:`` (``payment_intent.*``, ``orders/*``); ``*`` alone is any type.

Several handlers registered under the same (provider, type) all run for its
events, in registration order, in one savepoint of the event's transaction:
all of them commit with the event's mark, or none does and the event is
retried whole (docs/handlers.md says why). Their retry policy is shared.

Order per object (``ordered=True`` or ``ordering_key=``): the receiving
process asks :meth:`HandlerRegistry.ordering_key` for each new event's key,
so that the key is in the row before any worker can claim it, and the claim
(the database) decides what runs next; see ``docs/ordering.md``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import math
import re
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ._exceptions import ConfigurationError
from .backoff import backoff as exponential_backoff
from .events import Event, NewEvent

__all__ = [
    "Action",
    "Backoff",
    "Handler",
    "HandlerRegistry",
    "OrderingKey",
    "Registration",
    "RetryPolicy",
    "Route",
    "by_object",
    "validate_event_type",
]

log = logging.getLogger("onceonly.handlers")

#: ``handler(event, ctx)``; may be a coroutine function.
Handler: TypeAlias = Callable[[Event, Any], Any]
#: ``action(payload, key)``: runs after the commit, at least once; pass `key`
#: to the other side (an e-mail API's idempotency key) to make it once.
Action: TypeAlias = Callable[[Any, str], Any] | Callable[[Any, str], Awaitable[Any]]
#: A handler's ``backoff=``: ``(base, cap)`` seconds for the worker's own
#: formula (exponential, capped, jittered), or ``attempt -> seconds``
#: (`attempt` is 1 after the first failure).
Backoff: TypeAlias = tuple[float, float] | Callable[[int], float]

# A wildcard ends a type after one of these; what comes before is matched as is.
_WILDCARD = re.compile(r"[^*]*[^*./:][./:]\*")
# Distinct (provider, type) pairs seen are few in practice; types can come
# from the network, so the cache of their resolutions is bounded anyway.
_CACHE_LIMIT = 4096


def validate_event_type(event_type: str | None) -> str | None:
    """`event_type` as a registration keeps it (``"*"`` is ``None``, any type);
    :class:`~onceonly.ConfigurationError` for a pattern that cannot work."""
    if event_type is None or event_type == "*":
        return None
    if not isinstance(event_type, str) or not event_type:
        raise ConfigurationError(f"an event type must be a non-empty string, not {event_type!r}")
    if "*" in event_type and not _WILDCARD.fullmatch(event_type):
        raise ConfigurationError(
            f"event type pattern {event_type!r} is not supported: a wildcard is '*' as "
            "the whole last segment, after '.', '/' or ':' ('payment_intent.*', "
            "'orders/*'), or '*' alone for any type"
        )
    return event_type


def _validated_attempts(attempts: int | None) -> int | None:
    if attempts is None:
        return None
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"attempts must be a whole number >= 1, not {attempts!r}")
    return attempts


def _validated_backoff(option: Backoff | None) -> Backoff | None:
    if option is None or callable(option):
        return option
    try:
        base, cap = (float(n) for n in option)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"backoff must be (base, cap) seconds or a function attempt -> seconds, not {option!r}"
        ) from None
    if not (math.isfinite(base) and math.isfinite(cap) and 0 < base <= cap):
        raise ConfigurationError(f"backoff (base, cap) needs 0 < base <= cap, not {option!r}")
    return (base, cap)


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
    """One handler and what it was registered for."""

    handler: Handler
    provider: str | None
    event_type: str | None
    #: What to read from the provider's API before the transaction opens, for
    #: ``ctx.fetch(kind)`` (``None``: what the event points to).
    prefetch: tuple[str | None, ...] = ()
    #: Attempts before its events are ``dead``; ``None``: the worker's setting.
    attempts: int | None = None
    #: Wait before each retry; ``None``: the worker's setting.
    backoff: Backoff | None = None
    #: Put before its effects' names: empty for the first handler of its
    #: (provider, type), so the keys of a deployment that had one stay.
    effect_prefix: str = ""
    #: The ordering key of its events (``None``: unordered).
    ordering: OrderingKey | None = None
    #: ``module.qualname`` of the handler, and whether it is a coroutine
    #: function: worked out once, not for every event it handles.
    name: str = field(init=False, repr=False, compare=False)
    is_async: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fn = self.handler
        name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(fn))

    @property
    def ordered(self) -> bool:
        return self.ordering is not None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often an event is attempted, and how long it waits between tries."""

    max_attempts: int
    #: Seconds before the retry after failed attempt number n (1-based).
    delay: Callable[[int], float]


@dataclass(frozen=True, slots=True)
class Route:
    """What runs for one event: the handlers of the most specific registration
    that matches it, in registration order, and the retry policy they share."""

    registrations: tuple[Registration, ...]
    attempts: int | None = None
    backoff: Backoff | None = None
    #: What the event's ``handler`` column keeps: the handlers' names,
    #: comma-separated, in the order they ran.
    name: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", ", ".join(r.name for r in self.registrations))

    @property
    def prefetch(self) -> tuple[str | None, ...]:
        """Every kind any of the handlers prefetches, once each."""
        return tuple(dict.fromkeys(k for r in self.registrations for k in r.prefetch))

    def max_attempts(self, default: int) -> int:
        """The route's own attempts, `default` (the worker's) where it set none."""
        return self.attempts if self.attempts is not None else default

    def policy(self, max_attempts: int, delay: Callable[[int], float]) -> RetryPolicy:
        """The route's own attempts and backoff, the worker's (`max_attempts`,
        `delay`) where the handlers set none."""
        attempts = self.max_attempts(max_attempts)
        if self.backoff is None:
            return RetryPolicy(attempts, delay)
        if callable(self.backoff):
            return RetryPolicy(attempts, functools.partial(_checked, self.backoff, delay))
        base, cap = self.backoff
        return RetryPolicy(attempts, functools.partial(exponential_backoff, base=base, cap=cap))


def _checked(own: Callable[[int], float], fallback: Callable[[int], float], attempt: int) -> float:
    # Called while the failure is being recorded, inside the batch's
    # transaction: a bad value must not abort the batch (and retry it for ever).
    try:
        seconds = float(own(attempt))
    except Exception:
        log.exception("a handler's backoff function failed; the worker's backoff is used")
        return fallback(attempt)
    if not math.isfinite(seconds) or seconds < 0:
        log.warning("a handler's backoff returned %r; the worker's backoff is used", seconds)
        return fallback(attempt)
    return seconds


class HandlerRegistry:
    """Handlers by (provider, event type), and outbox actions by name."""

    def __init__(self) -> None:
        self._routes: dict[tuple[str | None, str | None], Route] = {}
        #: provider -> (prefix, pattern) of its wildcard types, longest first.
        self._wildcards: dict[str | None, list[tuple[str, str]]] = {}
        self._resolved: dict[tuple[str, str | None], Route | None] = {}
        self._lock = threading.Lock()
        self.actions: dict[str, Action] = {}
        # Whether any handler orders its events: without one, no event needs
        # the lookup of its handler on the receive path.
        self._ordering = False

    def add(
        self,
        handler: Handler,
        provider: str | None = None,
        event_type: str | None = None,
        prefetch: tuple[str | None, ...] = (),
        *,
        attempts: int | None = None,
        backoff: Backoff | None = None,
        ordering: OrderingKey | None = None,
    ) -> None:
        """Register `handler`; :class:`~onceonly.ConfigurationError` for a bad
        pattern or option, the same handler twice, or a retry policy that
        differs from the one another handler of the same key set."""
        event_type = validate_event_type(event_type)
        attempts = _validated_attempts(attempts)
        backoff = _validated_backoff(backoff)
        key = (provider, event_type)
        with self._lock:
            new = Registration(
                handler, provider, event_type, prefetch, attempts, backoff, ordering=ordering
            )
            known = self._routes.get(key)
            self._routes[key] = (
                Route((new,), attempts, backoff) if known is None else self._joined(known, new)
            )
            if event_type is not None and event_type.endswith("*"):
                patterns = self._wildcards.setdefault(provider, [])
                if all(p != event_type for _, p in patterns):
                    patterns.append((event_type[:-1], event_type))
                    patterns.sort(key=lambda p: len(p[0]), reverse=True)
            self._resolved.clear()
            self._ordering = self._ordering or ordering is not None

    @staticmethod
    def _joined(route: Route, new: Registration) -> Route:
        first = route.registrations[0]
        where = f"provider={first.provider!r}, event_type={first.event_type!r}"
        if any(r.name == new.name for r in route.registrations):
            raise ConfigurationError(
                f"a handler named {new.name} is already registered for {where}: two "
                "handlers of one event need different names (their effects are kept by name)"
            )
        for option, theirs, ours in (
            ("attempts", route.attempts, new.attempts),
            ("backoff", route.backoff, new.backoff),
        ):
            if theirs is not None and ours is not None and theirs != ours:
                raise ConfigurationError(
                    f"handlers for {where} run together and share one retry policy: "
                    f"{new.name} sets {option}={ours!r}, another one {theirs!r}"
                )
        if new.ordering is not first.ordering:
            # One event runs all of them at once: it has one place in one order.
            raise ConfigurationError(
                f"handlers for {where} run together and share one order: {new.name} "
                f"orders by {new.ordering!r}, {first.name} by {first.ordering!r}"
            )
        # Not the first: its effects get a namespace, so that two handlers'
        # ctx.effect("email", ...) are two records with two keys.
        joined = Registration(
            new.handler,
            new.provider,
            new.event_type,
            new.prefetch,
            new.attempts,
            new.backoff,
            effect_prefix=f"{new.name}/",
            ordering=new.ordering,
        )
        return Route(
            (*route.registrations, joined),
            route.attempts if route.attempts is not None else new.attempts,
            route.backoff if route.backoff is not None else new.backoff,
        )

    def add_action(self, name: str, action: Action) -> None:
        if name in self.actions:
            raise ConfigurationError(f"an outbox action named {name!r} is already registered")
        self.actions[name] = action

    def route(self, provider: str, event_type: str | None) -> Route | None:
        """What runs for an event of `provider` and `event_type` (``None``: nothing)."""
        cache_key = (provider, event_type)
        try:
            return self._resolved[cache_key]
        except KeyError:
            pass
        found = self._find(provider, event_type)
        if len(self._resolved) >= _CACHE_LIMIT:
            self._resolved.clear()
        self._resolved[cache_key] = found
        return found

    def _find(self, provider: str, event_type: str | None) -> Route | None:
        for who in (provider, None):
            if event_type is not None:
                found = self._routes.get((who, event_type))
                if found is not None:
                    return found
                for prefix, pattern in self._wildcards.get(who, ()):
                    if len(event_type) > len(prefix) and event_type.startswith(prefix):
                        return self._routes[(who, pattern)]
            found = self._routes.get((who, None))
            if found is not None:
                return found
        return None

    def resolve(self, provider: str, event_type: str | None) -> Registration | None:
        """The first handler that runs for such an event (see :meth:`route` for all)."""
        found = self.route(provider, event_type)
        return found.registrations[0] if found is not None else None

    def __len__(self) -> int:
        return sum(len(r.registrations) for r in self._routes.values())

    def ordering_key(self, event: NewEvent) -> str | None:
        """The ordering key to store with `event`: its handler's key, prefixed
        with provider and tenant (two providers' or accounts' ids never share
        an order); ``None`` when its handler is unordered or names no key.

        A key function that raises, or returns what no engine stores (not a
        string, a NUL), leaves the event unordered, with a warning: the event
        is signed and valid, and refusing it would lose it.
        """
        if not self._ordering:
            return None
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


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, from JSON's \ud800
        return False
    return True
