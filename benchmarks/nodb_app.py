"""benchmarks/receive.py's ``nodb`` target: ``onceonly serve`` with no database.

The same receiver, signature check, parsing, group commit and answers as the
``sqlite`` and ``postgres`` targets, with the store replaced by the in-process
test double (:class:`onceonly.store.memory.MemoryStore`) cut down to what the
receive path asks of it: each key's id, so duplicates are still told apart,
and nothing else (the double keeps every event whole, and a few hundred
thousand of them make the collector pause the server). Nothing is durable, so
this never serves anything real. It answers one question in the same run
as the others: how far the receive path's requests/s can go once the
database costs nothing, the ceiling any work on the store is bounded by.

    ONCEONLY_STRIPE_SECRET=... onceonly serve --app nodb_app:app   (benchmarks/ on PYTHONPATH)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from onceonly import NewEvent, Onceonly, Receipt
from onceonly.store import Store
from onceonly.store.memory import MemoryStore


class KeysOnly(MemoryStore):
    """The in-memory double, remembering only which keys it was given."""

    def __init__(self) -> None:
        super().__init__()
        # Keys as one string, not a tuple: strings are not tracked by the
        # collector, and a few hundred thousand tuples made its full
        # collections pause the server for tens of milliseconds.
        self._ids_by_key: dict[str, int] = {}
        self._next_id = itertools.count(1)

    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        receipts = []
        for e in events:
            key = f"{e.provider}\0{e.tenant}\0{e.event_id}"
            known = self._ids_by_key.get(key)
            if known is None:
                known = self._ids_by_key[key] = next(self._next_id)
                receipts.append(Receipt(duplicate=False, id=known))
            else:
                receipts.append(Receipt(duplicate=True, id=known))
        return receipts


class WithoutDatabase(Onceonly):
    """An application whose store is :class:`KeysOnly`."""

    _keys_only: KeysOnly | None = None

    @property
    def store(self) -> Store:
        if self._keys_only is None:
            self._keys_only = KeysOnly()
        return self._keys_only


app = WithoutDatabase()
