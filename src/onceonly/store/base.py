"""The store port: what the inbox (and later the worker) needs from a database.

Two adapters implement it, one per engine: :mod:`.sqlite` (the embedded default)
and :mod:`.postgres`. Each translates its driver's errors into
:class:`~onceonly.StoreUnavailable` / :class:`~onceonly.StoreError`, so nothing
above this layer imports a driver. :mod:`.memory` is an in-process double for
unit tests of code that sits on top of a store.

Every dedup decision is the database's: ``insert_events`` is one
``INSERT ... ON CONFLICT (provider, tenant, event_id) DO UPDATE SET duplicates =
duplicates + 1 ...`` per batch. The counter, returned or read back in the same
transaction, tells a new row from an old one, and the same statement remembers
the duplicate (how many, and when the last one came) for the dashboard and for
whoever asks "did the gateway really resend this?". Nothing reads before it
writes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from .._exceptions import ConfigurationError
from ..events import Event, EventStatus, NewEvent, Receipt
from .idempotency import KeyStore

__all__ = ["Store"]

#: The dedup key: (provider, tenant, event_id).
Key = tuple[str, str, str]


def collapse(events: Sequence[NewEvent]) -> tuple[list[NewEvent], dict[Key, int]]:
    """The batch with each (provider, tenant, event_id) once, and for each key how many
    further copies the batch held.

    PostgreSQL refuses to update one row twice in one statement ("ON CONFLICT
    DO UPDATE command cannot affect row a second time"), so copies are counted
    here and the statement adds them: a new row starts at ``duplicates = extra``
    and an existing one gains ``1 + extra``.
    """
    unique: dict[Key, NewEvent] = {}
    extra: dict[Key, int] = {}
    for e in events:
        key = (e.provider, e.tenant, e.event_id)
        if key in unique:
            extra[key] = extra.get(key, 0) + 1
        else:
            unique[key] = e
    return list(unique.values()), extra


def receipts(
    events: Sequence[NewEvent], returned: Mapping[Key, tuple[int, int]], extra: Mapping[Key, int]
) -> list[Receipt]:
    """One receipt per event of the original batch, in order.

    `returned` maps each key to the (row id, duplicates) the statement returned.
    A row the statement inserted comes back with exactly the copies we passed
    (``extra``); a row that was already there comes back with at least one
    more. Later copies of a key within the batch are duplicates of the first.
    """
    out: list[Receipt] = []
    seen: set[Key] = set()
    for e in events:
        key = (e.provider, e.tenant, e.event_id)
        row_id, duplicates = returned[key]
        if key in seen:
            out.append(Receipt(duplicate=True, id=row_id))
            continue
        seen.add(key)
        out.append(Receipt(duplicate=duplicates != extra.get(key, 0), id=row_id))
    return out


class Store(ABC):
    """A database holding onceonly's tables (all prefixed ``onceonly_``)."""

    #: ``"sqlite"``, ``"postgresql"`` or ``"memory"``.
    engine: str

    #: The URL it was opened with (without a password), for messages.
    url: str

    #: How many group-commit batches may be in flight at once: more than one
    #: pays off only where the engine commits transactions in parallel.
    commit_concurrency: int = 1
    #: The most deliveries one group-commit batch carries.
    commit_batch: int = 1000
    #: With several batches in flight, the deliveries a batch takes when few
    #: are waiting; under load it takes its part of the queue instead (see
    #: :class:`~onceonly.batching.GroupCommit`'s `share`). ``None``: a batch
    #: takes every waiting delivery, up to :attr:`commit_batch`.
    commit_share: int | None = None

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

        A duplicate increments the existing row's ``duplicates`` and sets its
        ``last_duplicate_at``, in the same statement. Two events with the same
        (provider, tenant, event_id) in one batch: the first is new, the second a
        duplicate, as if they had arrived one after the other. Returns only
        after the commit.
        """

    @abstractmethod
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
        """Newest first, optionally filtered (`tenant` ``""``: the events without
        one); `before_id` pages further back; `object_id` finds the events about
        one provider object (a payment), across providers."""

    @abstractmethod
    async def get_event(self, id: int) -> Event | None:
        """The event with this row id."""

    @abstractmethod
    async def find_event(self, provider: str, event_id: str, tenant: str = "") -> Event | None:
        """The event a provider knows by `event_id` (for `tenant`'s account)."""

    def idempotency_keys(self) -> KeyStore:
        """The Idempotency-Key records kept in this store (one key store per
        store: the middleware, ``onceonly purge`` and retention share it).

        Each adapter builds its own; a store that keeps none (a user's own
        Store subclass) raises :class:`~onceonly.ConfigurationError`."""
        raise ConfigurationError(
            f"a {type(self).__name__} keeps no Idempotency-Key records:"
            " use a SQLite or PostgreSQL store (or MemoryStore in tests)"
        )

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
