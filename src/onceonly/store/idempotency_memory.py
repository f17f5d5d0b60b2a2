"""Idempotency-Key records in memory: the key store of :class:`~.memory.MemoryStore`.

For unit tests of an API behind the middleware, without a database. It keeps
the claim's rules of :mod:`.idempotency` (the store contract tests hold it to
the same answers as SQLite and PostgreSQL); it is not durable and not shared
between processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from .._exceptions import StoreError
from .idempotency import (
    ClaimOutcome,
    Completion,
    KeyClaim,
    KeyStore,
    StoredResponse,
    answers,
    first_claims,
)

__all__ = ["MemoryKeyStore"]


@dataclass(slots=True)
class _Record:
    fingerprint: str
    status: Literal["running", "done"]
    fence: int
    locked_until: float | None
    expires_at: float
    response: StoredResponse | None = None
    #: (fence, seq) -> data: the chunks of this key, dropped with the record.
    chunks: dict[tuple[int, int], bytes] = field(default_factory=dict)

    def outcome(self) -> ClaimOutcome:
        return ClaimOutcome(
            self.status, self.fence, self.fingerprint, self.response, self.expires_at
        )


class MemoryKeyStore(KeyStore):
    def __init__(self, check: Callable[[], None] = lambda: None) -> None:
        #: Called before each operation: the store's outage switch.
        self._check = check
        self.records: dict[tuple[str, str], _Record] = {}

    async def apply(
        self,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        *,
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        self._check()
        landed = [self._complete(c, now) for c in completions]
        first = first_claims(claims)
        won: dict[tuple[str, str], int] = {}
        existing: dict[tuple[str, str], ClaimOutcome] = {}
        for ident, c in first.items():
            record = self.records.get(ident)
            # The databases' ON CONFLICT ... WHERE: expired, or an abandoned
            # claim of the same request.
            if record is None or (
                record.expires_at < now
                or (
                    record.status == "running"
                    and record.locked_until is not None
                    and record.locked_until < now
                    and record.fingerprint == c.fingerprint
                )
            ):
                fence = 1 if record is None else record.fence + 1
                # A take-over keeps the earlier owner's chunks, as the
                # databases' UPDATE does: its completion drops them.
                self.records[ident] = _Record(
                    c.fingerprint,
                    "running",
                    fence,
                    now + lock_seconds,
                    now + ttl,
                    chunks=record.chunks if record is not None else {},
                )
                won[ident] = fence
            else:
                existing[ident] = record.outcome()
        return landed, answers(claims, first, won, existing)

    def _complete(self, c: Completion, now: float) -> bool:
        record = self.records.get((c.scope, c.key))
        if record is None or record.fence != c.fence or record.status != "running":
            return False  # a stale owner
        record.status, record.response, record.locked_until = "done", c.response, None
        if c.response.chunked:
            record.chunks = {k: v for k, v in record.chunks.items() if k[0] == c.fence}
        return True

    async def release(self, scope: str, key: str, fence: int) -> None:
        self._check()
        record = self.records.get((scope, key))
        if record is not None and record.fence == fence and record.status == "running":
            del self.records[(scope, key)]

    async def append_chunks(
        self, scope: str, key: str, fence: int, first_seq: int, chunks: Sequence[bytes]
    ) -> None:
        self._check()
        record = self.records.get((scope, key))
        if record is None:  # the databases' foreign key
            raise StoreError(f"no Idempotency-Key record for chunks of {key!r}")
        pieces = {(fence, first_seq + i): bytes(c) for i, c in enumerate(chunks)}
        if pieces.keys() & record.chunks.keys():  # the databases' primary key
            raise StoreError(f"chunks of {key!r} stored twice")
        record.chunks.update(pieces)

    async def read_chunks(
        self, scope: str, key: str, fence: int, from_seq: int, limit: int
    ) -> list[bytes]:
        self._check()
        record = self.records.get((scope, key))
        if record is None:
            return []
        seqs = sorted(s for f, s in record.chunks if f == fence and s >= from_seq)
        return [record.chunks[(fence, s)] for s in seqs[:limit]]

    async def purge(self, *, now: float) -> int:
        self._check()
        expired = [ident for ident, r in self.records.items() if r.expires_at < now]
        for ident in expired:
            del self.records[ident]
        return len(expired)
