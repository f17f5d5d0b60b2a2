"""What the Idempotency-Key middleware decides, whatever carries the request.

The ASGI middleware (:mod:`.middleware`) and the WSGI one (:mod:`.wsgi`) are
plumbing around one :class:`IdempotencyPolicy`: which requests it covers, the
key and the client it is scoped to, the request's fingerprint, the claim and
what its outcome means (run, replay, 409, 422, 503), what of a response is
stored and which headers a replay carries. The answers it refuses with are
:class:`Problem` values; each front end writes them out in its own protocol.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypedDict

from .._exceptions import ConfigurationError, StoreError
from ..batching import GroupCommit
from ..store.idempotency import (
    ClaimOutcome,
    Completion,
    KeyClaim,
    KeyStore,
    StoredResponse,
    in_order,
    split,
)
from .keys import ClientScope, HeaderScope, InvalidKey, by_header, fingerprint, parse_key

if TYPE_CHECKING:
    from ..config import Onceonly
    from ..store import Store

__all__ = [
    "CHUNK",
    "DEFAULT_RELEASE_STATUSES",
    "HOP_HEADERS",
    "IdempotencyPolicy",
    "Problem",
    "Recorder",
    "Replay",
    "Run",
]

log = logging.getLogger("onceonly.idempotency")

#: Not replayed: they describe the first connection, or are recomputed.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "date",
        "server",
        "upgrade",
        "proxy-connection",
    }
)
#: Answers that mean "nothing was done" by convention: the key is released so
#: the client can fix the request and retry with the same key (as Stripe does
#: for requests that failed validation before execution began).
DEFAULT_RELEASE_STATUSES = frozenset({400, 401, 403, 404, 405, 409, 413, 415, 422, 429})
CHUNK = 64 * 1024


class Problem(NamedTuple):
    """An answer the policy gives instead of running the endpoint: an RFC 9457
    problem document, `reason` naming its type, with extra `headers`."""

    status: int
    reason: str
    title: str
    detail: str
    headers: tuple[tuple[bytes, bytes], ...] = ()


MISSING = Problem(
    400,
    "idempotency-key-missing",
    "Idempotency-Key Missing",
    "this operation requires an Idempotency-Key header",
)
# Never a scope shared by every client that lacks an identity: one's stored
# response would be replayed to another.
UNSCOPED = Problem(
    400,
    "idempotency-key-unscoped",
    "Idempotency-Key Without a Client",
    "an Idempotency-Key is scoped to the client that sent it, and this "
    "request does not say who that is (no credential)",
)
MISMATCH = Problem(
    422,
    "idempotency-key-reused",
    "Idempotency-Key Reused",
    "this Idempotency-Key was used for a different request (method, path, body or headers)",
)
IN_PROGRESS = Problem(
    409,
    "idempotency-key-in-use",
    "Request In Progress",
    "a request with this Idempotency-Key is still being processed; retry later",
    ((b"retry-after", b"1"),),
)
UNAVAILABLE = Problem(
    503,
    "unavailable",
    "Service Unavailable",
    "idempotency records are unreachable; retry later",
    ((b"retry-after", b"5"),),
)
INTERNAL = Problem(
    500,
    "internal",
    "Internal Server Error",
    "the request failed; this result is kept for its Idempotency-Key",
)


def invalid_key(exc: InvalidKey) -> Problem:
    return Problem(400, "idempotency-key-invalid", "Invalid Idempotency-Key", str(exc))


def too_large(limit: int) -> Problem:
    return Problem(
        413,
        "too-large",
        "Payload Too Large",
        f"requests over {limit} bytes are refused here, not run without idempotency protection",
    )


class Run(NamedTuple):
    """The claim is this request's: run the endpoint, record under `fence`."""

    fence: int


class Replay(NamedTuple):
    """A stored response to send again. `body` is ``None`` when it is stored in
    chunks (read them with :meth:`IdempotencyPolicy.read_chunks` at `fence`)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes | None
    fence: int


class Admitted(NamedTuple):
    """A request with a usable key, and the client it belongs to."""

    client: str
    key: str


class _Cached(NamedTuple):
    """A cached response, as _ResponseCache.get hands it out."""

    fingerprint: str
    status: int
    body: bytes
    #: The replay's headers, encoded, flat: name, value, name, value...
    headers: tuple[bytes, ...]


class _ResponseCache:
    """Completed responses are immutable until they expire: a response read
    from the database for a replay is kept here, bounded in bytes, and its
    later replays need no query. Fresh responses are not put here: most keys
    are never repeated. Used from one event loop only (the WSGI front end
    decides on its own loop thread), so it needs no lock.

    An entry is one flat tuple of strings, numbers and bytes (fingerprint,
    expiry, size, status, body, then the headers spread out): the garbage
    collector stops tracking such a tuple at its first collection, and so
    never traverses the cache nor counts it towards a full collection.
    Entries it kept tracking (dataclasses, nested tuples, some of which
    outlived their first collection), one per fresh response, brought 2 to 7
    full collections of 32-74 ms in each 8-second run under load, and 20-25%
    fewer requests/s for fresh keys on PostgreSQL.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.size = 0
        self._entries: OrderedDict[tuple[str, str], tuple[Any, ...]] = OrderedDict()

    def get(self, ident: tuple[str, str], now: float) -> _Cached | None:
        raw = self._entries.get(ident)
        if raw is None:
            return None
        if raw[1] <= now:
            self._drop(ident)
            return None
        self._entries.move_to_end(ident)
        return _Cached(raw[0], raw[3], raw[4], raw[5:])

    def put(
        self, ident: tuple[str, str], fp: str, response: StoredResponse, expires: float
    ) -> None:
        if response.body is None or self.max_bytes <= 0:
            return
        size = len(response.body) + 256
        if size > self.max_bytes:
            return
        self._drop(ident)
        headers = [h for pair in replay_headers(response.headers, response.body) for h in pair]
        self._entries[ident] = (fp, expires, size, response.status, response.body, *headers)
        self.size += size
        while self.size > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, ident: tuple[str, str]) -> None:
        raw = self._entries.pop(ident, None)
        if raw is not None:
            self.size -= raw[2]


def replay_headers(
    headers: Sequence[tuple[str, str]], body: bytes | None
) -> list[tuple[bytes, bytes]]:
    """A stored response's headers as its replay sends them."""
    encoded = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    encoded.append((b"idempotent-replayed", b"true"))
    if body is not None:
        encoded.append((b"content-length", str(len(body)).encode()))
    return encoded


class PolicyOptions(TypedDict, total=False):
    """The policy's options that every front end passes on as they are
    (``**options``): their defaults and meaning are :class:`IdempotencyPolicy`'s,
    written once there."""

    methods: Collection[str]
    paths: Sequence[str] | None
    required: bool | Sequence[str]
    fingerprint_headers: Sequence[str]
    ttl: float
    lock_timeout: float
    on_conflict: Literal["409", "wait"]
    wait_timeout: float
    max_request_bytes: int
    inline_limit: int
    release_statuses: Collection[int]
    replay_set_cookie: bool
    cache_bytes: int


class IdempotencyPolicy:
    """The decisions of the Idempotency-Key middleware; see
    :class:`~onceonly.idempotency.IdempotencyMiddleware` for the parameters.

    Its coroutines (:meth:`decide`, :meth:`read_chunks`, a :class:`Recorder`'s)
    run on one event loop: the ASGI server's, or the WSGI front end's own.
    """

    def __init__(
        self,
        *,
        onceonly: Onceonly | None = None,
        store: Store | None = None,
        methods: Collection[str] = ("POST", "PATCH"),
        paths: Sequence[str] | None = None,
        required: bool | Sequence[str] = False,
        scope: ClientScope | None = None,
        fingerprint_headers: Sequence[str] = ("content-type",),
        ttl: float = 24 * 3600,
        lock_timeout: float = 60.0,
        on_conflict: Literal["409", "wait"] = "409",
        wait_timeout: float = 30.0,
        max_request_bytes: int = 1024 * 1024,
        inline_limit: int = CHUNK,
        release_statuses: Collection[int] = DEFAULT_RELEASE_STATUSES,
        replay_set_cookie: bool = False,
        cache_bytes: int = 32 * 1024 * 1024,
    ) -> None:
        if (onceonly is None) == (store is None):
            if onceonly is None:
                from ..config import Onceonly

                onceonly = Onceonly()
            else:
                raise ConfigurationError("give onceonly= or store=, not both")
        self.store: Store = store if store is not None else onceonly.store  # type: ignore[union-attr]
        self.keys: KeyStore = self.store.idempotency_keys()
        if lock_timeout <= 0 or ttl <= lock_timeout:
            raise ConfigurationError("need 0 < lock_timeout < ttl")
        if on_conflict not in ("409", "wait"):
            raise ConfigurationError("on_conflict must be '409' or 'wait'")
        self.methods = frozenset(m.upper() for m in methods)
        self.paths = [re.compile(p) for p in paths] if paths is not None else None
        self.required = (
            required if isinstance(required, bool) else [re.compile(p) for p in required]
        )
        self.scope = scope or by_header("authorization")
        self.fingerprint_headers = [h.lower() for h in fingerprint_headers]
        #: The request headers the policy reads (lower-case), when the scope
        #: is a by_header() scope; ``None``: the scope may read any header.
        self.wanted: frozenset[str] | None = None
        if isinstance(self.scope, HeaderScope):
            self.wanted = frozenset(
                ("idempotency-key", "content-length", self.scope.header, *self.fingerprint_headers)
            )
        self.ttl = ttl
        self.lock_timeout = lock_timeout
        self.on_conflict = on_conflict
        self.wait_timeout = wait_timeout
        self.max_request_bytes = max_request_bytes
        self.inline_limit = inline_limit
        self.release_statuses = frozenset(release_statuses)
        self.dropped_headers = HOP_HEADERS | ({"set-cookie"} if not replay_set_cookie else set())
        self.dropped_raw = frozenset(h.encode("latin-1") for h in self.dropped_headers)
        self.cache = _ResponseCache(cache_bytes)
        # Claims and completions share one group commit: a transaction stores
        # the responses that just finished and claims the keys that just
        # arrived, so a request costs half a commit, not two. One batch in
        # flight: on PostgreSQL a second one (as the webhook inbox uses) made
        # batches smaller and per-request CPU higher (benchmarks/idempotency.py);
        # SQLite has one writer anyway.
        self.records: GroupCommit[KeyClaim | Completion, ClaimOutcome | bool] = GroupCommit(
            self._apply_batch, max_in_flight=1
        )

    async def _apply_batch(self, ops: Sequence[KeyClaim | Completion]) -> list[ClaimOutcome | bool]:
        completions, claims = split(ops)
        landed, outcomes = await self.keys.apply(
            completions, claims, now=time.time(), lock_seconds=self.lock_timeout, ttl=self.ttl
        )
        return in_order(ops, landed, outcomes)

    # Which requests, and whose key.

    def covers(self, method: str, path: str) -> bool:
        """Whether a request is the policy's business at all."""
        if method not in self.methods:
            return False
        return self.paths is None or any(p.search(path) for p in self.paths)

    def _is_required(self, path: str) -> bool:
        if isinstance(self.required, bool):
            return self.required
        return any(p.search(path) for p in self.required)

    def admit(
        self,
        path: str,
        headers: dict[str, str],
        identify: Callable[[], str | None] | None = None,
    ) -> Admitted | Problem | None:
        """The key and client of a covered request (headers by lower-case
        name); a problem to answer instead; or ``None``: no key, and none
        required, so the request passes through untouched. `identify`, when
        given, names the client instead of the scope function (the WSGI front
        end's `environ_scope`); it is asked only once the key is valid."""
        raw_key = headers.get("idempotency-key")
        if raw_key is None:
            return MISSING if self._is_required(path) else None
        try:
            key = parse_key(raw_key)
        except InvalidKey as exc:
            return invalid_key(exc)
        client = identify() if identify is not None else self.scope(headers)
        if not client:
            return UNSCOPED
        return Admitted(client, key)

    def fingerprint(
        self, method: str, path: str, query: bytes, body: bytes, headers: dict[str, str]
    ) -> str:
        return fingerprint(
            method, path, query, body, [(h, headers.get(h, "")) for h in self.fingerprint_headers]
        )

    # The claim.

    async def decide(self, ident: tuple[str, str], fp: str) -> Run | Replay | Problem:
        """Run, replay, or refuse (409, 422, 503) the request `fp` under `ident`
        (client, key); with ``on_conflict="wait"``, wait for one in flight."""
        cached = self.cache.get(ident, time.time())
        if cached is not None:
            if cached.fingerprint != fp:
                return MISMATCH
            # A new list each time: a middleware outside may add to it (GZip does).
            flat = cached.headers
            pairs = list(zip(flat[::2], flat[1::2], strict=True))
            return Replay(cached.status, pairs, cached.body, 0)
        deadline = time.monotonic() + self.wait_timeout
        claim = KeyClaim(ident[0], ident[1], fp)
        while True:
            try:
                outcome = await self.records.submit(claim)
            except StoreError:
                return UNAVAILABLE
            assert isinstance(outcome, ClaimOutcome)
            if outcome.state == "acquired":
                return Run(outcome.fence)
            if outcome.fingerprint != fp:
                return MISMATCH
            if outcome.state == "done":
                response = outcome.response
                assert response is not None
                self.cache.put(ident, outcome.fingerprint, response, outcome.expires_at)
                headers = replay_headers(response.headers, response.body)
                return Replay(response.status, headers, response.body, outcome.fence)
            if self.on_conflict == "409" or time.monotonic() > deadline:
                return IN_PROGRESS
            await asyncio.sleep(0.05)

    async def read_chunks(self, ident: tuple[str, str], fence: int, seq: int) -> list[bytes]:
        """The next pieces of a chunked replay from `seq`; fewer than 16: the last."""
        # Sixteen chunks (1 MiB) at a time: memory stays bounded whatever the size.
        return await self.keys.read_chunks(ident[0], ident[1], fence, seq, 16)

    def recorder(self, ident: tuple[str, str], fence: int) -> Recorder:
        return Recorder(self, ident, fence)


class Recorder:
    """What of the endpoint's response is stored, and its record.

    The front end hands it the status and headers (:meth:`start`), then the
    body as it passes (:meth:`take`; :meth:`spill` when that says so), tells
    it of a failure (:meth:`failed`), and last calls :meth:`record`, before
    the end of the response reaches the client."""

    def __init__(self, policy: IdempotencyPolicy, ident: tuple[str, str], fence: int) -> None:
        self.policy = policy
        self.ident = ident
        self.fence = fence
        self.status: int | None = None
        self.headers: tuple[tuple[str, str], ...] = ()
        self.buffer = bytearray()
        self.chunked = False
        self.seq = 0

    def start(self, status: int, raw_headers: Iterable[tuple[bytes, bytes]]) -> None:
        """The response's status and headers (those a replay leaves out are dropped)."""
        self.status = status
        dropped = self.policy.dropped_raw
        kept = []
        for raw_name, raw_value in raw_headers:
            name = bytes(raw_name).lower()
            if name not in dropped:
                kept.append((name.decode("latin-1"), bytes(raw_value).decode("latin-1")))
        self.headers = tuple(kept)

    def take(self, data: bytes, *, more: bool) -> bool:
        """A part of the body; True when it is time to :meth:`spill`."""
        self.buffer += data
        return more and (self.chunked or len(self.buffer) > self.policy.inline_limit)

    async def spill(self, *, final: bool = False) -> None:
        """Large or streamed body: write whole chunks to the database as they come."""
        self.chunked = True
        cut = len(self.buffer) if final else len(self.buffer) - len(self.buffer) % CHUNK
        if cut == 0:
            return
        pieces = [bytes(self.buffer[i : i + CHUNK]) for i in range(0, cut, CHUNK)]
        del self.buffer[:cut]
        keys = self.policy.keys
        await keys.append_chunks(self.ident[0], self.ident[1], self.fence, self.seq, pieces)
        self.seq += len(pieces)

    def failed(self, *, sent: bool, complete: bool) -> Problem | None:
        """The endpoint raised. `sent`: part of its response reached the client;
        `complete`: all of it was handed over. Returns the problem the front
        end answers (and hands to this recorder) when nothing was sent."""
        if complete:
            return None  # the whole response was given: it stands
        if not sent:
            # Failed before any of the response reached the client: answer
            # (and store) a proper 500 instead of the unfinished one.
            self.status, self.headers, self.buffer, self.chunked = None, (), bytearray(), False
            return INTERNAL
        # Failed mid-response: what was sent cannot be replayed faithfully.
        self.status, self.headers, self.buffer, self.chunked = 500, (), bytearray(), False
        return None

    async def record(self) -> None:
        """Store the response (or release the key); failures are logged, not raised:
        the response goes to the client either way."""
        policy = self.policy
        scope_id, key = self.ident
        try:
            if self.status is None or self.status in policy.release_statuses:
                await policy.keys.release(scope_id, key, self.fence)
                return
            if self.chunked:
                await self.spill(final=True)
                stored = StoredResponse(self.status, self.headers, None)
            else:
                stored = StoredResponse(self.status, self.headers, bytes(self.buffer))
            # Not put in the response cache: most keys are never asked for
            # again, and the first replay caches it (see _ResponseCache).
            landed = await policy.records.submit(Completion(scope_id, key, self.fence, stored))
            if not landed:
                log.warning(
                    "the response for key %r was not stored: the request outlived its"
                    " lock (%s s) and the key was claimed again",
                    key,
                    policy.lock_timeout,
                )
        except StoreError:
            # The response was sent; the record was not. The claim's lock runs
            # out and a retry runs again: logged loudly, the one gap left.
            log.error(
                "could not store the response for key %r; a retry after %s s will run again",
                key,
                policy.lock_timeout,
            )
