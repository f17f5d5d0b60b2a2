"""Reading what handlers will ``ctx.fetch()`` before their transaction opens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .clients import ApiClient, Target
from .events import Event

if TYPE_CHECKING:
    from .handlers import HandlerRegistry

__all__ = ["prefetch"]


def prefetch(
    handlers: HandlerRegistry,
    api_clients: Mapping[str, ApiClient],
    events: Sequence[Event],
    loop: Callable[[], asyncio.AbstractEventLoop],
) -> dict[int, dict[Target, Any]]:
    """Read what handlers registered with ``prefetch`` will ``ctx.fetch()``,
    before their transaction opens and concurrently across the batch.

    Inside the transaction a network wait would hold the row locks (on
    SQLite, the database's only write lock, which the receiver needs). A
    failed read is kept and raised by ``ctx.fetch()`` in the handler.
    """
    if not api_clients:
        return {}  # the common case: nothing to read, nothing to resolve
    wanted: dict[tuple[int, Target], tuple[ApiClient, list[int]]] = {}
    for event in events:
        route = handlers.route(event.provider, event.event_type)
        client = api_clients.get(event.provider)
        if route is None or client is None:
            continue
        for kind in route.prefetch:
            try:
                target = client.target(event, kind)
            except Exception:  # deterministic: ctx.fetch() raises it in the handler
                continue
            # Two events about one object in a batch share one read.
            wanted.setdefault((id(client), target), (client, []))[1].append(event.id)
    if not wanted:
        return {}
    limit = asyncio.Semaphore(8)

    async def read(client: ApiClient, target: Target) -> dict[str, Any] | Exception:
        async with limit:
            try:
                return await client.get(target)
            except Exception as exc:  # kept for the handler, whatever it is
                return exc

    async def read_all() -> list[dict[str, Any] | Exception]:
        return await asyncio.gather(*(read(c, t) for (_, t), (c, _) in wanted.items()))

    results = loop().run_until_complete(read_all())
    found: dict[int, dict[Target, Any]] = {}
    for ((_, target), (_, event_ids)), result in zip(wanted.items(), results, strict=True):
        for event_id in event_ids:
            found.setdefault(event_id, {})[target] = result
    return found
