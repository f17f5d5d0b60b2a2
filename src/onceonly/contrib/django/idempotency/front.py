"""The Django front end of one policy, shared by the middleware and the decorator,
by sync and async views."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from asgiref.sync import sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.utils.module_loading import import_string

from ...._exceptions import ConfigurationError
from ...._threads import background_loop
from ....idempotency.policy import (
    UNSCOPED,
    IdempotencyPolicy,
    Problem,
    Recorder,
    Replay,
    Run,
    too_large,
)
from ....store import create_store
from ....wsgi import environ_headers
from .responses import (
    django_answer,
    keep_problem,
    problem_response,
    replay_response,
    response_headers,
    unrendered,
)
from .scopes import RequestScope, auser_scope, user_scope
from .streams import BACKGROUND, LOCAL, Bridge, relay_async, set_stream

if TYPE_CHECKING:
    from ....store import Store

__all__ = ["OPTIONS", "TAKEN", "Claim", "Front"]


# The mark a request carries once the middleware has taken it: a decorated
# view behind the middleware does not claim the key a second time.
TAKEN = "_onceonly_idempotency"
OPTIONS = frozenset(
    {
        "store",
        "methods",
        "paths",
        "required",
        "scope",
        "fingerprint_headers",
        "ttl",
        "lock_timeout",
        "on_conflict",
        "wait_timeout",
        "max_request_bytes",
        "inline_limit",
        "release_statuses",
        "replay_set_cookie",
        "cache_bytes",
    }
)


class Claim(NamedTuple):
    """A covered request with a key, before its client is known."""

    key: str
    fingerprint: str


class Front:
    """The Django front end of one policy, shared by the sync and async paths.

    The policy is built on first use, not at import or at start-up: the
    project's store (``get_app()``) needs the settings, and tests reset it.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        unknown = set(options) - OPTIONS
        if unknown:
            raise ConfigurationError(
                f"unknown Idempotency-Key options {sorted(unknown)}; known: {sorted(OPTIONS)}"
            )
        options = dict(options)
        scope = options.pop("scope", None)
        if isinstance(scope, str):
            scope = import_string(scope)
        if scope is not None and not callable(scope):
            raise ConfigurationError("scope must be a function of the request, or its dotted path")
        self.scope: RequestScope | None = scope
        self.options = options
        self._policy: IdempotencyPolicy | None = None
        self._lock = threading.Lock()
        #: The async side's policies under ASGI, one per event loop, with the
        #: project's store they were made for.
        self._loop_policies: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Store, IdempotencyPolicy]
        ] = weakref.WeakKeyDictionary()

    @property
    def policy(self) -> IdempotencyPolicy:
        policy = self._policy
        store: Store | None = self.options.get("store")
        if store is None:
            from ..conf import get_app

            # The project's store, which changes when get_app() is reset (the
            # settings changed, a test switched databases): a policy on the
            # old one would keep records where nobody looks.
            store = get_app().store
        if policy is None or policy.store is not store:
            with self._lock:
                policy = self._policy
                if policy is None or policy.store is not store:
                    options = {k: v for k, v in self.options.items() if k != "store"}
                    # The client is asked after the key is read (see client()).
                    policy = self._policy = IdempotencyPolicy(
                        store=store, scope=lambda headers: "request", **options
                    )
        return policy

    # The request, up to the claim.

    def admit(self, request: HttpRequest) -> Claim | HttpResponse | None:
        """The key and fingerprint of a covered request; a problem answer; or
        ``None``: not the policy's business, the view runs untouched."""
        if getattr(request, TAKEN, False):
            return None  # the middleware has it
        policy = self.policy
        path, method = request.path, request.method or "GET"
        if not policy.covers(method, path):
            return None
        headers = environ_headers(request.META)
        admitted = policy.admit(path, headers)
        if admitted is None:
            return None
        setattr(request, TAKEN, True)
        if isinstance(admitted, Problem):
            return problem_response(admitted)
        limit = policy.max_request_bytes
        declared = headers.get("content-length", "")
        # Refused by its Content-Length before anything is read.
        if (
            declared.isascii()
            and declared.isdigit()
            and (len(declared) > 18 or int(declared) > limit)
        ):
            return problem_response(too_large(limit))
        try:
            # Read once; Django keeps it, and the view reads it (or POST) again.
            body = request.body
        except RequestDataTooBig:  # over DATA_UPLOAD_MAX_MEMORY_SIZE
            return problem_response(too_large(limit))
        except OSError:  # the client went away mid-body: nothing claimed
            return HttpResponse(status=400)
        if len(body) > limit:
            return problem_response(too_large(limit))
        query = request.META.get("QUERY_STRING", "").encode("latin-1")
        return Claim(admitted.key, policy.fingerprint(method, path, query, body, headers))

    def client(self, request: HttpRequest) -> str | None:
        scope = self.scope or user_scope
        client = scope(request)
        if isinstance(client, Awaitable):
            raise ConfigurationError("an async scope= is for async views; this view is sync")
        return client

    async def aclient(self, request: HttpRequest) -> str | None:
        if self.scope is None:
            return await auser_scope(request)
        client = self.scope(request)
        if isinstance(client, Awaitable):
            return await client
        return client

    # The sync path: the server's thread blocks on the background loop.

    def handle(
        self, request: HttpRequest, view: Callable[[], HttpResponseBase]
    ) -> HttpResponseBase:
        claim = self.admit(request)
        if claim is None:
            return view()
        if isinstance(claim, HttpResponse):
            return claim
        client = self.client(request)
        if not client:
            return problem_response(UNSCOPED)
        policy = self.policy
        ident = (client, claim.key)
        bridge = background_loop()
        decision = bridge.run(policy.decide(ident, claim.fingerprint))
        if isinstance(decision, Problem):
            return problem_response(decision)
        if isinstance(decision, Replay):
            chunks = None if decision.body is not None else self._chunks(ident, decision.fence)
            return replay_response(decision, chunks)
        recorder = policy.recorder(ident, decision.fence)
        try:
            response = view()
            if asyncio.iscoroutine(response):
                response.close()
                raise ConfigurationError(
                    "a sync view returned a coroutine (an async class-based view decorated "
                    'on dispatch): decorate its handler, method_decorator(..., name="post")'
                )
            if unrendered(response):
                response = response.render()
        except ConfigurationError:
            bridge.run(recorder.record())  # nothing was answered: the key is free again
            raise
        except Exception as exc:
            # Only a decorated view raises here (Django turns exceptions into
            # responses between middleware): its 500 page is what is kept.
            response = django_answer(request, exc)
        return self._capture(response, recorder)

    def _chunks(self, ident: tuple[str, str], fence: int) -> Iterator[bytes]:
        bridge, seq = background_loop(), 0
        while True:
            chunks = bridge.run(self.policy.read_chunks(ident, fence, seq))
            yield from chunks
            seq += len(chunks)
            if len(chunks) < 16:
                return

    def _capture(self, response: HttpResponseBase, recorder: Recorder) -> HttpResponseBase:
        bridge = background_loop()
        recorder.start(response.status_code, response_headers(response, self._keeps_cookies))
        if not isinstance(response, StreamingHttpResponse):
            recorder.take(cast(HttpResponse, response).content, more=False)
            # Recorded before Django sends anything: a client that repeats the
            # request the moment it has the answer finds it stored.
            bridge.run(recorder.record())
            return response
        if response.is_async:
            # An async iterator under WSGI: Django itself consumes it on a loop
            # of its own; the relay follows it there.
            return relay_async(response, recorder, BACKGROUND)
        set_stream(response, recorder)
        return response

    @property
    def _keeps_cookies(self) -> bool:
        return "set-cookie" not in self.policy.dropped_headers

    # The async path: the view runs on the server's loop, and so does the
    # store's work under ASGI, on a store of the loop's own.

    def _async_policy(self, request: HttpRequest) -> tuple[IdempotencyPolicy, Bridge]:
        """The policy for an async view, and where its work runs.

        Under Django's ASGI handler, async views run on the server's one
        loop: the project's database gets a store of that loop's own
        (connections belong to the loop that opened them), and its work runs
        there, with no thread switch. Elsewhere (an async view under WSGI
        runs on a loop asgiref makes for the one request; `store=` given)
        it runs on the background loop, with the sync side's store.
        """
        if "store" in self.options or not isinstance(request, ASGIRequest):
            return self.policy, BACKGROUND
        from ..conf import get_app

        app = get_app()
        loop = asyncio.get_running_loop()
        entry = self._loop_policies.get(loop)
        # Rebuilt when get_app() is (see the policy property).
        if entry is None or entry[0] is not app.store:
            options = dict(self.options)
            policy = IdempotencyPolicy(
                store=create_store(app.database_url), scope=lambda headers: "request", **options
            )
            entry = self._loop_policies[loop] = (app.store, policy)
        return entry[1], LOCAL

    async def ahandle(
        self, request: HttpRequest, view: Callable[[], Awaitable[HttpResponseBase]]
    ) -> HttpResponseBase:
        claim = self.admit(request)
        if claim is None:
            return await view()
        if isinstance(claim, HttpResponse):
            return claim
        client = await self.aclient(request)
        if not client:
            return problem_response(UNSCOPED)
        policy, bridge = self._async_policy(request)
        ident = (client, claim.key)

        def abandoned(decision: Run | Replay | Problem) -> None:
            if isinstance(decision, Run):  # claimed for a request that is gone: free it
                bridge.detach(policy.recorder(ident, decision.fence).record())

        decision = await bridge.run(policy.decide(ident, claim.fingerprint), abandoned=abandoned)
        if isinstance(decision, Problem):
            return problem_response(decision)
        if isinstance(decision, Replay):
            chunks = None
            if decision.body is None:
                chunks = _achunks(policy, bridge, ident, decision.fence)
            return replay_response(decision, chunks)
        recorder = policy.recorder(ident, decision.fence)
        try:
            response = await view()
            if unrendered(response):
                response = await sync_to_async(response.render)()
        except asyncio.CancelledError:
            # Django's ASGI handler cancels the view when the client goes
            # away: it may have done part of its work, so the retry gets a
            # 500, as for an exception, not a second run.
            keep_problem(recorder, recorder.failed(sent=False, complete=False))
            bridge.detach(recorder.record())
            raise
        except Exception as exc:
            response = await sync_to_async(django_answer, thread_sensitive=False)(request, exc)
        recorder.start(response.status_code, response_headers(response, self._keeps_cookies))
        if not isinstance(response, StreamingHttpResponse):
            recorder.take(cast(HttpResponse, response).content, more=False)
            await bridge.run(recorder.record())
            return response
        return relay_async(response, recorder, bridge)


async def _achunks(
    policy: IdempotencyPolicy, bridge: Bridge, ident: tuple[str, str], fence: int
) -> AsyncIterator[bytes]:
    """A chunked replay's body, read 1 MiB at a time."""
    seq = 0
    while True:
        chunks = await bridge.run(policy.read_chunks(ident, fence, seq))
        for chunk in chunks:
            yield chunk
        seq += len(chunks)
        if len(chunks) < 16:
            return
