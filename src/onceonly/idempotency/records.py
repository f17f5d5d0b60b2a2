"""Records of the Idempotency-Key store."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = ["ClaimOutcome", "Completion", "KeyClaim", "StoredResponse"]


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
        return json.dumps([list(h) for h in self.headers])

    @classmethod
    def from_columns(cls, status: int, headers: str, body: bytes | None) -> StoredResponse:
        return cls(status, tuple((n, v) for n, v in json.loads(headers)), body)


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
