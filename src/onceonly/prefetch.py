"""Reading what handlers will ``ctx.fetch()`` before their transaction opens."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .clients import ApiClient, Target
from .context import api_client_for
from .events import Event

if TYPE_CHECKING:
    from .handlers import HandlerRegistry
    from .tenants import Tenants

__all__ = ["prefetch"]


def prefetch(
    handlers: HandlerRegistry,
    api_clients: Mapping[str, ApiClient],
    events: Sequence[Event],
    loop: Callable[[], asyncio.AbstractEventLoop],
    *,
    tenants: Tenants | None = None,
) -> dict[int, dict[Target, Any]]:
    """Read what handlers registered with ``prefetch`` will ``ctx.fetch()``,
    before their transaction opens and concurrently across the batch.

    Inside the transaction a network wait would hold the row locks (on
    SQLite, the database's only write lock, which the receiver needs). A
    failed read is kept and raised by ``ctx.fetch()`` in the handler. A
    tenant's event is read with its tenant's client, never sharing a read
    with another tenant's event about the same id.
    """
    if not api_clients and tenants is None:
        return {}  # the common case: nothing to read, nothing to resolve
    wanted = [
        (event, route.prefetch)
        for event in events
        if (route := handlers.route(event.provider, event.event_type)) is not None
        and route.prefetch
        and (event.tenant or event.provider in api_clients)
    ]
    if not wanted:
        return {}
    return loop().run_until_complete(_read_all(wanted, api_clients, tenants))


async def _read_all(
    wanted: list[tuple[Event, tuple[str | None, ...]]],
    api_clients: Mapping[str, ApiClient],
    tenants: Tenants | None,
) -> dict[int, dict[Target, Any]]:
    reads: dict[tuple[int, Target], tuple[ApiClient, list[int]]] = {}
    for event, kinds in wanted:
        try:
            client = await api_client_for(event, api_clients, tenants)
        except Exception:  # ctx.fetch() meets it again and raises it in the handler
            continue
        if client is None:
            continue
        for kind in kinds:
            try:
                target = client.target(event, kind)
            except Exception:  # deterministic: ctx.fetch() raises it in the handler
                continue
            # Two events about one object in a batch share one read (one
            # client is one tenant's credential).
            reads.setdefault((id(client), target), (client, []))[1].append(event.id)
    if not reads:
        return {}
    limit = asyncio.Semaphore(8)

    async def read(client: ApiClient, target: Target) -> dict[str, Any] | Exception:
        async with limit:
            try:
                return await client.get(target)
            except Exception as exc:  # kept for the handler, whatever it is
                return exc

    results = await asyncio.gather(*(read(c, t) for (_, t), (c, _) in reads.items()))
    found: dict[int, dict[Target, Any]] = {}
    for ((_, target), (_, event_ids)), result in zip(reads.items(), results, strict=True):
        for event_id in event_ids:
            found.setdefault(event_id, {})[target] = result
    return found
