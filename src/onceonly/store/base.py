"""The store port: what the inbox (and later the worker) needs from a database.

Two adapters implement it, one per engine: :mod:`.sqlite` (the embedded default)
and :mod:`.postgres`. Each translates its driver's errors into
:class:`~onceonly.StoreUnavailable` / :class:`~onceonly.StoreError`, so nothing
above this layer imports a driver. :mod:`.memory` is an in-process double for
unit tests of code that sits on top of a store.

Every dedup decision is the database's: ``insert_events`` is one
``INSERT ... ON CONFLICT (provider, event_id) DO NOTHING`` per batch, and a row
the database did not insert is a duplicate. Nothing reads before it writes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from ..events import Event, EventStatus, NewEvent, Receipt

__all__ = ["Store"]


class Store(ABC):
    """A database holding onceonly's tables (all prefixed ``onceonly_``)."""

    #: ``"sqlite"``, ``"postgresql"`` or ``"memory"``.
    engine: str

    #: The URL it was opened with (without a password), for messages.
    url: str

    #: How many group-commit batches may be in flight at once: more than one
    #: pays off only where the engine commits transactions in parallel.
    commit_concurrency: int = 1

    @abstractmethod
    async def open(self) -> None:
        """Connect, and bring the schema up to date when `auto_migrate` is set.

        Safe to call again after a failure: a store that could not connect tries
        again on its next use, so a server started while its database is down
        recovers without a restart.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections and threads."""

    @abstractmethod
    async def migrate(self) -> list[int]:
        """Apply pending schema migrations; return the versions applied now."""

    @abstractmethod
    async def schema_version(self) -> int:
        """The highest migration applied (0 for an empty database)."""

    @abstractmethod
    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        """Insert a batch in one transaction, durably; one receipt per event, in order.

        Two events with the same (provider, event_id) in one batch: the first
        is new, the second a duplicate, as if they had arrived one after the
        other. Returns only after the commit.
        """

    @abstractmethod
    async def list_events(
        self,
        *,
        provider: str | None = None,
        status: EventStatus | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[Event]:
        """Newest first, optionally filtered; `before_id` pages further back."""

    @abstractmethod
    async def get_event(self, id: int) -> Event | None:
        """The event with this row id."""

    @abstractmethod
    async def find_event(self, provider: str, event_id: str) -> Event | None:
        """The event a provider knows by `event_id`."""

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
