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
published policy (key format, expiry, what is replayed). The decisions are
:mod:`.policy`'s, shared with the WSGI front end (:mod:`.wsgi`); this module
carries them over ASGI's messages.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Unpack

from .._exceptions import BodyTooLarge
from ..asgi import ASGIApp, Message, Receive, Scope, Send, lower_headers, read_body, send_problem
from ..batching import GroupCommit
from ..store.idempotency import ClaimOutcome, Completion, KeyClaim
from .keys import ClientScope
from .policy import (
    DEFAULT_RELEASE_STATUSES,
    IdempotencyPolicy,
    PolicyOptions,
    Problem,
    Recorder,
    Replay,
    Run,
    too_large,
)

if TYPE_CHECKING:
    from ..config import Onceonly
    from ..store import Store

__all__ = ["DEFAULT_RELEASE_STATUSES", "IdempotencyMiddleware"]


async def _problem(send: Send, problem: Problem) -> None:
    await send_problem(
        send, problem.status, problem.reason, problem.title, problem.detail, list(problem.headers)
    )


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
        scope: ClientScope | None = None,
        **options: Unpack[PolicyOptions],
    ) -> None:
        self.app = app
        self.policy = IdempotencyPolicy(
            onceonly=onceonly,
            store=store,
            scope=scope,
            **options,
        )
        # The request headers the middleware reads: when the scope is a
        # by_header() scope, only these are decoded, not every header. Raw
        # name to name: no header's name is decoded on a request.
        wanted = self.policy.wanted
        self._wanted = None if wanted is None else {n.encode("latin-1"): n for n in wanted}

    @property
    def records(self) -> GroupCommit[KeyClaim | Completion, ClaimOutcome | bool]:
        """The group commit claims and completions share (see the policy)."""
        return self.policy.records

    # The request path.

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        policy = self.policy
        if scope["type"] != "http" or not policy.covers(scope["method"], scope["path"]):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = lower_headers(scope) if self._wanted is None else self._pick_headers(scope)
        admitted = policy.admit(path, headers)
        if admitted is None:
            await self.app(scope, receive, send)
            return
        if isinstance(admitted, Problem):
            await _problem(send, admitted)
            return
        try:
            body = await read_body(headers, receive, policy.max_request_bytes)
        except BodyTooLarge:
            await _problem(send, too_large(policy.max_request_bytes))
            return
        if body is None:
            return  # the client went away
        fp = policy.fingerprint(
            scope["method"], path, scope.get("query_string", b""), body, headers
        )
        ident = (admitted.client, admitted.key)
        decision = await policy.decide(ident, fp)
        if isinstance(decision, Run):
            await self._execute(scope, body, send, policy.recorder(ident, decision.fence))
        elif isinstance(decision, Replay):
            await self._replay(send, ident, decision)
        else:
            await _problem(send, decision)

    def _pick_headers(self, scope: Scope) -> dict[str, str]:
        """The headers in `_wanted`, by lower-case name; repeats joined with ", "."""
        wanted = self._wanted
        assert wanted is not None
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name = wanted.get(raw_name)
            # ASGI servers send lower-case names; lower() only for those that do not.
            if name is None and not raw_name.islower():
                name = wanted.get(raw_name.lower())
            if name is not None:
                value = raw_value.decode("latin-1")
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return headers

    # Running the endpoint once.

    async def _execute(self, scope: Scope, body: bytes, send: Send, recorder: Recorder) -> None:
        capture = _Capture(recorder, send)
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

    async def _replay(self, send: Send, ident: tuple[str, str], replay: Replay) -> None:
        """Send a stored response (the policy has checked the fingerprint)."""
        await send({"type": "http.response.start", "status": replay.status,
                    "headers": replay.headers})  # fmt: skip
        if replay.body is not None:
            await send({"type": "http.response.body", "body": replay.body})
            return
        seq = 0
        while True:
            chunks = await self.policy.read_chunks(ident, replay.fence, seq)
            for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            seq += len(chunks)
            if len(chunks) < 16:
                break
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _Capture:
    """Passes the endpoint's response to the client while its recorder keeps it."""

    def __init__(self, recorder: Recorder, send: Send) -> None:
        self.recorder = recorder
        self.client_send = send
        self.client_gone = False
        self.sent = False
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
            self.recorder.start(int(message["status"]), message.get("headers", ()))
            return
        if message["type"] == "http.response.body":
            more = bool(message.get("more_body", False))
            if self.recorder.take(message.get("body", b""), more=more):
                await self.recorder.spill()
            if not more:
                # The end of the response waits for its record to commit: a
                # client that repeats the request the moment it has the answer
                # must find it stored, not "in progress".
                self.final = message
                return
        await self._start_to_client()
        await self._to_client(message)

    async def _start_to_client(self) -> None:
        if self.start is not None:
            start, self.start = self.start, None
            self.sent = True
            await self._to_client(start)

    async def _to_client(self, message: Message) -> None:
        if self.client_gone:
            return
        try:
            await self.client_send(message)
        except OSError:
            self.client_gone = True  # keep recording: the client will retry

    async def fail(self) -> None:
        problem = self.recorder.failed(sent=self.sent, complete=self.final is not None)
        if problem is not None:
            self.start = None
            await _problem(self.send, problem)

    async def finish(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            await self.recorder.record()
        finally:
            await self._start_to_client()
            if self.final is not None:
                await self._to_client(self.final)
