"""Where Idempotency-Key records live: in the store, behind its key-store port.

Each store builds its own key store (:meth:`onceonly.store.Store.idempotency_keys`);
the SQL, per engine, is in ``onceonly.store.idempotency_sqlite`` and
``onceonly.store.idempotency_postgres``, the claim's rules in
:mod:`onceonly.store.idempotency`. This module keeps the names its callers
import.
"""

from __future__ import annotations

from ..store import Store
from ..store.idempotency import KeyStore, in_order, split

__all__ = ["KeyStore", "in_order", "key_store_for", "split"]


def key_store_for(store: Store) -> KeyStore:
    """The Idempotency-Key records of `store` (``store.idempotency_keys()``)."""
    return store.idempotency_keys()
