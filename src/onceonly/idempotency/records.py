"""Records of the Idempotency-Key store.

They are the words of the store's key-store port, so they live with it in
:mod:`onceonly.store.idempotency` (the store cannot import this package);
re-exported here, where the middleware's users have always found them.
"""

from __future__ import annotations

from ..store.idempotency import ClaimOutcome, Completion, KeyClaim, StoredResponse

__all__ = ["ClaimOutcome", "Completion", "KeyClaim", "StoredResponse"]
