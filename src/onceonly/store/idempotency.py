"""The Idempotency-Key records' port: what the middleware asks of the store it
keeps its keys in, and the records the two speak in.

Each store builds its own key store (:meth:`onceonly.store.Store.idempotency_keys`):
:mod:`.idempotency_sqlite`, :mod:`.idempotency_postgres` and, for users' unit
tests, :mod:`.idempotency_memory`. What they share is here.

The claim is decided by the database: ``INSERT ... ON CONFLICT (scope, key) DO
UPDATE ... WHERE`` the existing record has expired, or is in flight with a lock
that ran out *and* the same request fingerprint (a crashed request retried).
Otherwise nothing is written and the existing record is read: done (replay) or
running (409). Every take-over increments ``fence``; a completion only lands
``WHERE fence = ?``, so a stale owner cannot overwrite a newer one.

Records are read before the claim (in the same statement on PostgreSQL, under
the write lock on SQLite), so that keys the record already answers are not
written at all; only absent, expired or abandoned keys reach the INSERT. On
SQLite a batch of keys that are all new skips the read (see
:mod:`.idempotency_sqlite`). A batch costs one round trip on PostgreSQL and
one transaction on SQLite.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

import orjson

from ..jsontext import dumps

__all__ = [
    "ClaimOutcome",
    "Completion",
    "KeyClaim",
    "KeyStore",
    "StoredResponse",
    "in_order",
    "split",
]

KEYS = "onceonly_idempotency_keys"
CHUNKS = "onceonly_idempotency_chunks"
#: The columns a claim's answer is read from (see `outcome`).
RECORD_COLUMNS = (
    "scope, key, fingerprint, status, fence, response_status, response_headers,"
    " response_body, chunked, expires_at"
)


# KeyClaim, ClaimOutcome and Completion are made once or twice per request on
# the event loop: named tuples, the cheapest immutable records to build.


class KeyClaim(NamedTuple):
    """A request asking to run under `key`, for the client identified by `scope`."""

    scope: str
    key: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as it will be replayed. `body` is ``None`` when it is stored in
    chunks (large or streamed responses)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes | None

    @property
    def chunked(self) -> bool:
        return self.body is None

    def headers_json(self) -> str:
        return dumps(self.headers)

    @classmethod
    def from_columns(cls, status: int, headers: str, body: bytes | None) -> StoredResponse:
        # Headers onceonly wrote itself: orjson reads them, the standard
        # library what it refuses (an escaped lone surrogate).
        try:
            pairs = orjson.loads(headers)
        except orjson.JSONDecodeError:
            pairs = json.loads(headers)
        return cls(status, tuple((n, v) for n, v in pairs), body)


class ClaimOutcome(NamedTuple):
    """What the database said to a claim.

    - ``acquired``: this request runs; `fence` identifies its ownership.
    - ``running``: another request with this key is in flight.
    - ``done``: a response is stored; `fence` locates its chunks.
    `fingerprint` is the stored request's, to detect a key reused for another
    request.
    """

    state: Literal["acquired", "running", "done"]
    fence: int
    fingerprint: str
    response: StoredResponse | None = None
    expires_at: float = 0.0


class Completion(NamedTuple):
    scope: str
    key: str
    fence: int
    response: StoredResponse


class KeyStore(ABC):
    """The Idempotency-Key records of one store."""

    @abstractmethod
    async def apply(
        self,
        completions: Sequence[Completion],
        claims: Sequence[KeyClaim],
        *,
        now: float,
        lock_seconds: float,
        ttl: float,
    ) -> tuple[list[bool], list[ClaimOutcome]]:
        """Store responses, then claim keys, in one transaction: one commit
        serves both kinds (group commit batches them together).

        For each completion, False where the claim was lost (stale owner). For
        each claim, its outcome, in order; the same (scope, key) twice in a
        batch: the first claims, the next see it running. Completions go first
        so that a claim of a key completed in the same batch sees it done."""

    async def claim(
        self, claims: Sequence[KeyClaim], *, now: float, lock_seconds: float, ttl: float
    ) -> list[ClaimOutcome]:
        return (await self.apply([], claims, now=now, lock_seconds=lock_seconds, ttl=ttl))[1]

    async def complete(self, completions: Sequence[Completion], *, now: float) -> list[bool]:
        return (await self.apply(completions, [], now=now, lock_seconds=0, ttl=0))[0]

    @abstractmethod
    async def release(self, scope: str, key: str, fence: int) -> None:
        """Forget a claim whose response is not to be stored."""

    @abstractmethod
    async def append_chunks(
        self, scope: str, key: str, fence: int, first_seq: int, chunks: Sequence[bytes]
    ) -> None:
        """Store pieces of a claim's response, numbered from `first_seq`."""

    @abstractmethod
    async def read_chunks(
        self, scope: str, key: str, fence: int, from_seq: int, limit: int
    ) -> list[bytes]:
        """Up to `limit` pieces of a stored response, in order, from `from_seq`."""

    @abstractmethod
    async def purge(self, *, now: float) -> int:
        """Delete expired records (and their chunks); return how many."""


def split(ops: Sequence[KeyClaim | Completion]) -> tuple[list[Completion], list[KeyClaim]]:
    """A group-commit batch as the two arguments of `apply`."""
    completions = [op for op in ops if isinstance(op, Completion)]
    claims = [op for op in ops if isinstance(op, KeyClaim)]
    return completions, claims


def in_order(
    ops: Sequence[KeyClaim | Completion], landed: list[bool], outcomes: list[ClaimOutcome]
) -> list[ClaimOutcome | bool]:
    """The answers of `apply` put back in the order of the batch's items."""
    landed_it, outcome_it = iter(landed), iter(outcomes)
    return [next(landed_it) if isinstance(op, Completion) else next(outcome_it) for op in ops]


# What the adapters below share: they live in this package, the names are
# theirs to use.


class Columns(Protocol):
    """A row read by column name: a sqlite3.Row, an asyncpg Record, a mapping."""

    def __getitem__(self, name: str, /) -> Any: ...


def outcome(row: Columns) -> ClaimOutcome:
    """The answer a record gives a claim it settles (RECORD_COLUMNS)."""
    status = row["status"]
    response = None
    if status == "done":
        body = None if row["chunked"] else bytes(row["response_body"] or b"")
        response = StoredResponse.from_columns(
            row["response_status"], row["response_headers"], body
        )
    return ClaimOutcome(
        status, int(row["fence"]), row["fingerprint"], response, float(row["expires_at"])
    )


def first_claims(claims: Sequence[KeyClaim]) -> dict[tuple[str, str], KeyClaim]:
    """The first claim of each (scope, key): ON CONFLICT may not touch a row
    twice in one statement, so repeats within a batch are answered from it."""
    first: dict[tuple[str, str], KeyClaim] = {}
    for c in claims:
        first.setdefault((c.scope, c.key), c)
    return first


def answers(
    claims: Sequence[KeyClaim],
    first: dict[tuple[str, str], KeyClaim],
    won: dict[tuple[str, str], int],
    existing: dict[tuple[str, str], ClaimOutcome],
) -> list[ClaimOutcome]:
    """Each claim's outcome, in order: `won` maps the keys claimed to their
    fence, `existing` the others to what their record said."""
    if len(won) == len(claims):
        # Every claim won, none repeated within the batch (a batch of fresh
        # keys, the common case): nothing to tell apart.
        return [ClaimOutcome("acquired", won[(c.scope, c.key)], c.fingerprint) for c in claims]
    outcomes = []
    answered: set[tuple[str, str]] = set()
    for c in claims:
        ident = (c.scope, c.key)
        if ident in won:
            fp = first[ident].fingerprint
            if ident in answered:  # a repeat within the batch: the first runs it
                outcomes.append(ClaimOutcome("running", won[ident], fp))
            else:
                outcomes.append(ClaimOutcome("acquired", won[ident], fp))
        elif ident in existing:
            outcomes.append(existing[ident])
        else:
            # Lost the claim, then the record went away before it could be
            # read (released after a 4xx): "in progress", the client retries.
            outcomes.append(ClaimOutcome("running", 0, c.fingerprint))
        answered.add(ident)
    return outcomes
