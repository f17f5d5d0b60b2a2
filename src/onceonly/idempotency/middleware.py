"""Idempotency-Key for your own API, as ASGI middleware (Starlette, FastAPI, any ASGI app).

A client repeats ``POST /orders`` with the same ``Idempotency-Key`` when the
network drops; it gets the first response back, not a second order.

- First request with a key: the database claims it (one atomic insert), the
  endpoint runs, its response is stored and sent.
- A repeat after completion: the stored status, headers and body, with
  ``Idempotent-Replayed: true``; stored errors (a 500 too) replay as they were.
- A repeat while the first is in flight: ``409`` with ``Retry-After`` (or, with
  ``on_conflict="wait"``, it waits for the first and gets its response).
- The same key with a different request (method, path, query, body, chosen
  headers): ``422``.
- A missing key where required, or a malformed one: ``400``.
- The database unreachable: ``503``; the endpoint never runs unprotected.

Errors are ``application/problem+json``. See docs/idempotency.md for the
published policy (key format, expiry, what is replayed).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from .._exceptions import BodyTooLarge, ConfigurationError, StoreError
from ..asgi import ASGIApp, Message, Receive, Scope, Send, lower_headers, read_body, send_problem
from ..batching import GroupCommit, ThreadGroupCommit
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

__all__ = ["IdempotencyMiddleware"]

log = logging.getLogger("onceonly.idempotency")
_problem = send_problem


async def _mismatch(send: Send) -> None:
    await _problem(
        send,
        422,
        "idempotency-key-reused",
        "Idempotency-Key Reused",
        "this Idempotency-Key was used for a different request (method, path, body or headers)",
    )


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
    are never repeated.

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
        headers = [h for pair in _replay_headers(response.headers, response.body) for h in pair]
        self._entries[ident] = (fp, expires, size, response.status, response.body, *headers)
        self.size += size
        while self.size > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, ident: tuple[str, str]) -> None:
        raw = self._entries.pop(ident, None)
        if raw is not None:
            self.size -= raw[2]


def _replay_headers(
    headers: Sequence[tuple[str, str]], body: bytes | None
) -> list[tuple[bytes, bytes]]:
    encoded = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]
    encoded.append((b"idempotent-replayed", b"true"))
    if body is not None:
        encoded.append((b"content-length", str(len(body)).encode()))
    return encoded


class IdempotencyMiddleware:
    """Pure ASGI middleware: ``app = IdempotencyMiddleware(app, onceonly=Onceonly(...))``.

    Parameters (all keyword):

    - `methods`: which methods it applies to (default POST and PATCH).
    - `paths`: regular expressions a path must match (default: every path).
    - `required`: ``True`` (every covered request needs a key), ``False``
      (a key is optional), or regular expressions of the paths that need one.
    - `scope`: the client identity keys are scoped to; default: a hash of the
      ``Authorization`` header (:func:`~onceonly.idempotency.by_header`).
    - `fingerprint_headers`: headers that make two requests different.
    - `ttl`: how long a completed response is kept (default 24 h).
    - `lock_timeout`: how long an in-flight claim holds (default 60 s); it
      must exceed your request timeout, or a slow request could run twice.
    - `on_conflict`: ``"409"`` (default) or ``"wait"`` for a repeat in flight.
    - `max_request_bytes`: larger requests are refused (413), never run
      unprotected.
    - `release_statuses`: statuses whose response is not stored.
    - `replay_set_cookie`: replay ``Set-Cookie`` (default no).
    - `cache_bytes`: memory for responses replayed once, so that their next
      replays need no query.
    """

    def __init__(
        self,
        app: ASGIApp,
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
        self.app = app
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
        # The request headers the middleware reads: when the scope is a
        # by_header() scope, only these are decoded, not every header.
        self._wanted: frozenset[bytes] | None = None
        if isinstance(self.scope, HeaderScope):
            self._wanted = frozenset(
                n.encode("latin-1")
                for n in ("idempotency-key", "content-length", self.scope.header)
            ) | {h.encode("latin-1") for h in self.fingerprint_headers}
        self.ttl = ttl
        self.lock_timeout = lock_timeout
        self.on_conflict = on_conflict
        self.wait_timeout = wait_timeout
        self.max_request_bytes = max_request_bytes
        self.inline_limit = inline_limit
        self.release_statuses = frozenset(release_statuses)
        self.dropped_headers = HOP_HEADERS | ({"set-cookie"} if not replay_set_cookie else set())
        self._dropped_raw = frozenset(h.encode("latin-1") for h in self.dropped_headers)
        self.cache = _ResponseCache(cache_bytes)
        # Claims and completions share one group commit: a transaction stores
        # the responses that just finished and claims the keys that just
        # arrived, so a request costs half a commit, not two. Measured with
        # benchmarks/idempotency.py: on SQLite the store's thread takes each
        # next batch itself (ThreadGroupCommit: larger batches, 1-5% more
        # requests/s than GroupCommit); on PostgreSQL one batch in flight (a
        # second one, as the webhook inbox uses, made batches smaller and
        # per-request CPU higher here).
        self.records: (
            GroupCommit[KeyClaim | Completion, ClaimOutcome | bool]
            | ThreadGroupCommit[KeyClaim | Completion, ClaimOutcome | bool]
        )
        thread = self.keys.thread_batches(lock_seconds=lock_timeout, ttl=ttl)
        if thread is not None:
            self.records = ThreadGroupCommit(thread.apply, thread.schedule)
        else:
            self.records = GroupCommit(self._apply_batch, max_in_flight=1)

    async def _apply_batch(self, ops: Sequence[KeyClaim | Completion]) -> list[ClaimOutcome | bool]:
        completions, claims = split(ops)
        landed, outcomes = await self.keys.apply(
            completions, claims, now=time.time(), lock_seconds=self.lock_timeout, ttl=self.ttl
        )
        return in_order(ops, landed, outcomes)

    async def _claim(self, claim: KeyClaim) -> ClaimOutcome:
        outcome = await self.records.submit(claim)
        assert isinstance(outcome, ClaimOutcome)
        return outcome

    async def _complete(self, completion: Completion) -> bool:
        return bool(await self.records.submit(completion))

    # The request path.

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if self.paths is not None and not any(p.search(path) for p in self.paths):
            await self.app(scope, receive, send)
            return
        headers = lower_headers(scope) if self._wanted is None else self._pick_headers(scope)
        raw_key = headers.get("idempotency-key")
        if raw_key is None:
            if self._is_required(path):
                await _problem(
                    send,
                    400,
                    "idempotency-key-missing",
                    "Idempotency-Key Missing",
                    "this operation requires an Idempotency-Key header",
                )
                return
            await self.app(scope, receive, send)
            return
        try:
            key = parse_key(raw_key)
        except InvalidKey as exc:
            await _problem(
                send, 400, "idempotency-key-invalid", "Invalid Idempotency-Key", str(exc)
            )
            return
        client = self.scope(headers)
        if not client:
            # Never a scope shared by every client that lacks an identity:
            # one's stored response would be replayed to another.
            await _problem(
                send,
                400,
                "idempotency-key-unscoped",
                "Idempotency-Key Without a Client",
                "an Idempotency-Key is scoped to the client that sent it, and this "
                "request does not say who that is (no credential)",
            )
            return
        try:
            body = await read_body(headers, receive, self.max_request_bytes)
        except BodyTooLarge:
            await _problem(
                send,
                413,
                "too-large",
                "Payload Too Large",
                f"requests over {self.max_request_bytes} bytes are refused here, "
                "not run without idempotency protection",
            )
            return
        if body is None:
            return  # the client went away
        fp = fingerprint(
            scope["method"],
            path,
            scope.get("query_string", b""),
            body,
            [(h, headers.get(h, "")) for h in self.fingerprint_headers],
        )
        ident = (client, key)
        cached = self.cache.get(ident, time.time())
        if cached is not None:
            if cached.fingerprint != fp:
                await _mismatch(send)
                return
            # A new list each time: a middleware outside may add to it (GZip does).
            flat = cached.headers
            await send({"type": "http.response.start", "status": cached.status,
                        "headers": list(zip(flat[::2], flat[1::2], strict=True))})  # fmt: skip
            await send({"type": "http.response.body", "body": cached.body})
            return
        deadline = time.monotonic() + self.wait_timeout
        while True:
            try:
                outcome = await self._claim(KeyClaim(client, key, fp))
            except StoreError:
                await _problem(
                    send,
                    503,
                    "unavailable",
                    "Service Unavailable",
                    "idempotency records are unreachable; retry later",
                    [(b"retry-after", b"5")],
                )
                return
            if outcome.state == "acquired":
                await self._execute(scope, body, send, ident, outcome.fence)
                return
            if outcome.fingerprint != fp:
                await _mismatch(send)
                return
            if outcome.state == "done":
                assert outcome.response is not None
                self.cache.put(ident, outcome.fingerprint, outcome.response, outcome.expires_at)
                await self._answer_done(send, ident, outcome.response, outcome.fence)
                return
            if self.on_conflict == "409" or time.monotonic() > deadline:
                await _problem(
                    send,
                    409,
                    "idempotency-key-in-use",
                    "Request In Progress",
                    "a request with this Idempotency-Key is still being processed; retry later",
                    [(b"retry-after", b"1")],
                )
                return
            await asyncio.sleep(0.05)

    def _pick_headers(self, scope: Scope) -> dict[str, str]:
        """The headers in `_wanted`, by lower-case name; repeats joined with ", "."""
        headers: dict[str, str] = {}
        wanted = self._wanted
        assert wanted is not None
        for raw_name, raw_value in scope["headers"]:
            # ASGI servers send lower-case names; lower() only for those that do not.
            lowered = raw_name if raw_name in wanted else raw_name.lower()
            if lowered in wanted:
                name = lowered.decode("latin-1")
                value = raw_value.decode("latin-1")
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return headers

    def _is_required(self, path: str) -> bool:
        if isinstance(self.required, bool):
            return self.required
        return any(p.search(path) for p in self.required)

    # Running the endpoint once.

    async def _execute(
        self,
        scope: Scope,
        body: bytes,
        send: Send,
        ident: tuple[str, str],
        fence: int,
    ) -> None:
        capture = _Capture(self, ident, fence, send)
        delivered = False

        async def receive_body() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            # After the body, the only thing left to hear is the disconnect;
            # never block an app that listens for it forever.
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        try:
            await self.app(scope, receive_body, capture.send)
        except Exception:
            # Store a 500 (unless the app's own error handler already answered
            # one): a retry must not re-run a half-applied request.
            await capture.fail()
            await capture.finish()
            raise
        await capture.finish()

    # Replaying.

    async def _answer_done(
        self, send: Send, ident: tuple[str, str], response: StoredResponse, fence: int
    ) -> None:
        """Replay a stored response (the caller has checked the fingerprint)."""
        headers = _replay_headers(response.headers, response.body)
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        if response.body is not None:
            await send({"type": "http.response.body", "body": response.body})
            return
        seq = 0
        while True:
            # Sixteen chunks (1 MiB) at a time: memory stays bounded whatever the size.
            chunks = await self.keys.read_chunks(ident[0], ident[1], fence, seq, 16)
            for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            seq += len(chunks)
            if len(chunks) < 16:
                break
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Capture:
    """Passes the endpoint's response to the client while recording it."""

    def __init__(
        self,
        mw: IdempotencyMiddleware,
        ident: tuple[str, str],
        fence: int,
        send: Send,
    ) -> None:
        self.mw = mw
        self.ident = ident
        self.fence = fence
        self.client_send = send
        self.client_gone = False
        self.status: int | None = None
        self.headers: tuple[tuple[str, str], ...] = ()
        self.buffer = bytearray()
        self.chunked = False
        self.seq = 0
        self.complete = False
        self.done = False
        self.final: Message | None = None
        # The start goes out with the first part of the body: for a response
        # in one piece, that is after its record commits, with the body, as
        # an endpoint without the middleware sends them (one burst, not two
        # packets apart).
        self.start: Message | None = None

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            self.status = int(message["status"])
            dropped = self.mw._dropped_raw
            kept = []
            for raw_name, raw_value in message.get("headers", ()):
                name = bytes(raw_name).lower()
                if name not in dropped:
                    kept.append((name.decode("latin-1"), bytes(raw_value).decode("latin-1")))
            self.headers = tuple(kept)
            return
        if message["type"] == "http.response.body":
            self.buffer += message.get("body", b"")
            if not message.get("more_body", False):
                # The end of the response waits for its record to commit: a
                # client that repeats the request the moment it has the answer
                # must find it stored, not "in progress".
                self.complete = True
                self.final = message
                return
            if len(self.buffer) > self.mw.inline_limit or self.chunked:
                await self._spill(final=False)
        await self._start_to_client()
        await self._to_client(message)

    async def _start_to_client(self) -> None:
        if self.start is not None:
            start, self.start = self.start, None
            await self._to_client(start)

    async def _to_client(self, message: Message) -> None:
        if self.client_gone:
            return
        try:
            await self.client_send(message)
        except OSError:
            self.client_gone = True  # keep recording: the client will retry

    async def _spill(self, *, final: bool) -> None:
        """Large or streamed body: write whole chunks to the database as they come."""
        self.chunked = True
        cut = len(self.buffer) if final else len(self.buffer) - len(self.buffer) % CHUNK
        if cut == 0:
            return
        pieces = [bytes(self.buffer[i : i + CHUNK]) for i in range(0, cut, CHUNK)]
        del self.buffer[:cut]
        await self.mw.keys.append_chunks(self.ident[0], self.ident[1], self.fence, self.seq, pieces)
        self.seq += len(pieces)

    async def fail(self) -> None:
        if self.start is not None and self.final is None:
            # Failed before any of the response reached the client: answer
            # (and store) a proper 500 instead of the unfinished one.
            self.start, self.status, self.headers = None, None, ()
            self.buffer = bytearray()
        if self.status is None:
            await _problem(
                self.send,
                500,
                "internal",
                "Internal Server Error",
                "the request failed; this result is kept for its Idempotency-Key",
            )
        elif self.final is None:
            # Failed mid-response: what was sent cannot be replayed faithfully.
            self.status, self.headers, self.buffer = 500, (), bytearray()
            self.chunked = False

    async def finish(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            await self._record()
        finally:
            await self._start_to_client()
            if self.final is not None:
                await self._to_client(self.final)

    async def _record(self) -> None:
        scope_id, key = self.ident
        try:
            if self.status is None or self.status in self.mw.release_statuses:
                await self.mw.keys.release(scope_id, key, self.fence)
                return
            if self.chunked:
                await self._spill(final=True)
                stored = StoredResponse(self.status, self.headers, None)
            else:
                stored = StoredResponse(self.status, self.headers, bytes(self.buffer))
            # Not put in the response cache: most keys are never asked for
            # again, and the first replay caches it (see _ResponseCache).
            if not await self.mw._complete(Completion(scope_id, key, self.fence, stored)):
                log.warning(
                    "the response for key %r was not stored: the request outlived its"
                    " lock (%s s) and the key was claimed again",
                    key,
                    self.mw.lock_timeout,
                )
        except StoreError:
            # The response was sent; the record was not. The claim's lock runs
            # out and a retry runs again: logged loudly, the one gap left.
            log.error(
                "could not store the response for key %r; a retry after %s s will run again",
                key,
                self.mw.lock_timeout,
            )
