"""An in-process store: a test double for code built on top of the store port.

It keeps the same contract as the real adapters (a duplicate is decided by the
key, receipts in order) so unit tests of the inbox and receiver run without
I/O; its Idempotency-Key records (:mod:`.idempotency_memory`) do the same for
unit tests of an API behind the middleware. It is not durable and not shared
between processes: never use it to serve.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from datetime import UTC, datetime

from .._exceptions import StoreUnavailable
from ..events import Event, EventStatus, NewEvent, Receipt
from . import migrations
from .base import Store
from .idempotency_memory import MemoryKeyStore

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    engine = "memory"
    url = "memory://"

    def __init__(self) -> None:
        self.events: dict[int, Event] = {}
        self._keys: dict[tuple[str, str, str], int] = {}
        self._ids = itertools.count(1)
        #: Set to make every call raise StoreUnavailable, as an outage would.
        self.unavailable = False
        #: How many insert_events calls (transactions) were made.
        self.commits = 0
        self._key_store: MemoryKeyStore | None = None

    def _check(self) -> None:
        if self.unavailable:
            raise StoreUnavailable("memory store marked unavailable")

    def idempotency_keys(self) -> MemoryKeyStore:
        """Idempotency-Key records in memory, subject to `unavailable` too."""
        if self._key_store is None:
            self._key_store = MemoryKeyStore(self._check)
        return self._key_store

    async def open(self) -> None:
        self._check()

    async def close(self) -> None:
        pass

    async def migrate(self) -> list[int]:
        self._check()
        return []

    async def schema_version(self) -> int:
        return migrations.latest("sqlite")

    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        self._check()
        self.commits += 1
        receipts = []
        for e in events:
            key = (e.provider, e.tenant, e.event_id)
            if key in self._keys:
                old_id = self._keys[key]
                old = self.events[old_id]
                self.events[old_id] = dataclasses.replace(
                    old, duplicates=old.duplicates + 1, last_duplicate_at=datetime.now(UTC)
                )
                receipts.append(Receipt(duplicate=True, id=old_id))
                continue
            row_id = next(self._ids)
            self._keys[key] = row_id
            self.events[row_id] = Event(
                id=row_id,
                provider=e.provider,
                event_id=e.event_id,
                event_type=e.event_type,
                body=e.body,
                headers=dict(e.headers),
                received_at=datetime.now(UTC),
                status=EventStatus.PENDING,
                attempts=0,
                tenant=e.tenant,
                object_id=e.object_id,
                occurred_at=e.occurred_at,
                ordering_key=e.ordering_key,
            )
            receipts.append(Receipt(duplicate=False, id=row_id))
        return receipts

    async def list_events(
        self,
        *,
        provider: str | None = None,
        status: EventStatus | None = None,
        limit: int = 50,
        before_id: int | None = None,
        object_id: str | None = None,
        tenant: str | None = None,
    ) -> list[Event]:
        self._check()
        found = [
            e
            for e in sorted(self.events.values(), key=lambda e: -e.id)
            if (provider is None or e.provider == provider)
            and (status is None or e.status == status)
            and (before_id is None or e.id < before_id)
            and (object_id is None or e.object_id == object_id)
            and (tenant is None or e.tenant == tenant)
        ]
        return found[:limit]

    async def get_event(self, id: int) -> Event | None:
        self._check()
        return self.events.get(id)

    async def find_event(self, provider: str, event_id: str, tenant: str = "") -> Event | None:
        self._check()
        row_id = self._keys.get((provider, tenant, event_id))
        return self.events.get(row_id) if row_id else None
