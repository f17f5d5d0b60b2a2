"""Failure hooks: your code hears about a failed attempt and a dead event.

::

    @app.on_attempt_failed
    def count(failure: Failure) -> None: ...

    @app.on_dead
    async def page(failure: Failure) -> None: ...

Both get a :class:`Failure`: the event's identity, the error, the attempt
number, and whether the event is now dead. Sync or async functions.

The dead hook is called **once** per death, even across a crash: the worker
stages one outbox row per dead hook in the very transaction that marks the
event dead, so the hook call commits with the death or not at all. After
that commit the worker runs the row at once (another worker's sweep does, if
this one died first). A hook that raises is logged and retried like any
outbox action, with backoff, up to ``max_attempts``, with the same
:attr:`Failure.key` each time: pass it to a paging or chat API that accepts
an idempotency key to make a retry harmless. What remains at least once is a
crash after the hook returned and before its row is marked sent.

The failed-attempt hook is best-effort: it is called after the transaction
that recorded the failure committed, in the worker thread, and a crash in
between loses that call (the attempt is in ``onceonly_attempts`` anyway). It
is called for every failed attempt, the last one included (``dead`` True). A
hook that raises is logged and never reaches the worker. Neither hook runs
inside a handler's transaction: no lock is held while it talks to Slack.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeAlias

from ._exceptions import ConfigurationError

if TYPE_CHECKING:
    import sqlalchemy as sa

    from .events import Event
    from .handlers import Action
    from .store.outbox import OutboxRecords

__all__ = ["DEAD_HOOK_ACTION", "Failure", "FailureHook", "FailureHooks"]

log = logging.getLogger("onceonly.hooks")

#: The outbox action that runs dead hooks (not one ``ctx.stage`` can name).
DEAD_HOOK_ACTION = "onceonly.dead-hook"

#: ``hook(failure)``; may be a coroutine function.
FailureHook: TypeAlias = Callable[["Failure"], Any] | Callable[["Failure"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt of an event's handler, as a hook sees it."""

    #: The event's row id (``onceonly events show PK``).
    event_pk: int
    provider: str
    event_id: str
    event_type: str | None
    #: 1 for the first attempt.
    attempt: int
    max_attempts: int
    #: Whether this failure made the event dead (no more retries).
    dead: bool
    #: The exception's class name and message.
    error_type: str
    error: str
    traceback: str
    #: The handler's dotted name (None: the event had none to run).
    handler: str | None
    #: The worker that ran the attempt.
    worker: str
    #: The merchant account the event arrived for (``""``: the only one).
    tenant: str = ""
    #: Stable across retries of a dead hook's call (its outbox key); pass it
    #: to an API that accepts idempotency keys. Empty for a failed-attempt hook.
    key: str = ""
    #: The exception itself, in a failed-attempt hook (for Sentry's
    #: ``capture_exception``); None in a dead hook, which may run in another
    #: process after a crash (``traceback`` has the text).
    exception: BaseException | None = field(default=None, compare=False)

    @classmethod
    def of(
        cls,
        event: Event,
        exc: BaseException,
        traceback: str,
        *,
        handler: str | None,
        worker: str,
        max_attempts: int,
        dead: bool,
    ) -> Failure:
        return cls(
            event_pk=event.id,
            provider=event.provider,
            event_id=event.event_id,
            event_type=event.event_type,
            attempt=event.attempts,
            max_attempts=max_attempts,
            dead=dead,
            error_type=type(exc).__qualname__,
            error=str(exc)[:2000],
            traceback=traceback,
            handler=handler,
            worker=worker,
            tenant=event.tenant,
            exception=exc,
        )

    def log_fields(self) -> dict[str, Any]:
        """The structured log fields of a line about this failure."""
        return {
            "event_pk": self.event_pk,
            "provider": self.provider,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "attempt": self.attempt,
            "worker": self.worker,
            "tenant": self.tenant,
        }


def hook_name(hook: FailureHook) -> str:
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


class FailureHooks:
    """The hooks of a deployment: failed-attempt ones and dead ones."""

    def __init__(self) -> None:
        self.failed: list[FailureHook] = []
        self.dead: dict[str, FailureHook] = {}

    def add_failed(self, hook: FailureHook) -> None:
        self.failed.append(hook)

    def add_dead(self, hook: FailureHook) -> None:
        name = hook_name(hook)
        # The name is what a staged call finds its hook by, maybe in another
        # process: two hooks under one name would be ambiguous.
        if name in self.dead:
            raise ConfigurationError(f"a dead hook named {name!r} is already registered")
        self.dead[name] = hook

    def stage_dead(self, conn: sa.Connection, outbox: OutboxRecords, failure: Failure) -> bool:
        """In the transaction that marks the event dead: one outbox row per
        dead hook; whether any was staged (the worker then runs them)."""
        if not self.dead:
            return False
        record = asdict(replace(failure, exception=None))
        del record["exception"], record["key"]
        for name in self.dead:
            payload = json.dumps({"hook": name, "failure": record})
            outbox.stage(conn, failure.event_pk, DEAD_HOOK_ACTION, payload)
        return True

    def attempt_failed(
        self, failures: list[Failure], loop: Callable[[], asyncio.AbstractEventLoop]
    ) -> None:
        """After the commit that recorded `failures`: each failed-attempt hook,
        errors logged and swallowed."""
        for failure in failures:
            for hook in self.failed:
                try:
                    result = hook(failure)
                    if asyncio.iscoroutine(result):
                        loop().run_until_complete(result)
                except Exception:
                    log.exception(
                        "event %s: failed-attempt hook %s raised",
                        failure.event_pk,
                        hook_name(hook),
                        extra=failure.log_fields(),
                    )

    def run_dead(self, payload: Any, key: str) -> Any:
        """The outbox action: call the hook a staged row names."""
        hook = self.dead.get(payload["hook"])
        if hook is None:
            raise LookupError(f"no dead hook named {payload['hook']!r} is registered")
        failure = Failure(**payload["failure"], key=key)
        log.info(
            "event %s: calling dead hook %s",
            failure.event_pk,
            payload["hook"],
            extra=failure.log_fields(),
        )
        return hook(failure)

    def actions(self, actions: dict[str, Action]) -> Mapping[str, Action]:
        """`actions` (a live view: actions registered later are found) with
        the dead hooks' action added."""
        own: dict[str, Action] = {DEAD_HOOK_ACTION: self.run_dead}
        return ChainMap(own, actions)
