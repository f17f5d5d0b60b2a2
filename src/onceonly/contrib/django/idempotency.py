"""Idempotency-Key for Django views: a middleware for the whole project, or a
decorator for some views; sync views (WSGI) and async views (ASGI) alike.

::

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "onceonly.contrib.django.idempotency.IdempotencyMiddleware",   # after it
    ]
    ONCEONLY_IDEMPOTENCY = {"required": [r"^/api/orders/$"]}

    @idempotent(required=True)
    def create_order(request): ...

Every decision is the policy's (:class:`onceonly.idempotency.policy.IdempotencyPolicy`,
the one the ASGI and WSGI middleware use): the same keys, fingerprints,
answers and records, in the same tables. Keys are scoped by the logged-in
user (``request.user.pk``); an anonymous request falls back to a hash of its
``Authorization`` header, as the ASGI middleware's default scope.

The store's coroutines always run on the process's background loop
(:func:`onceonly._threads.background_loop`), also for async views under ASGI:
a store's connections belong to one loop (asyncpg's pool does), and the
project's store is shared with everything else onceonly does in the process
(the webhook view, the WSGI front end). A sync view blocks its server thread
on that loop; an async view awaits it, and itself runs on the server's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeGuard, TypeVar, cast

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.template.response import SimpleTemplateResponse
from django.utils.module_loading import import_string

from ..._exceptions import ConfigurationError
from ..._threads import background_loop
from ...asgi import problem_body
from ...idempotency.keys import by_header
from ...idempotency.policy import (
    CHUNK,
    DEFAULT_RELEASE_STATUSES,
    UNSCOPED,
    IdempotencyPolicy,
    Problem,
    Recorder,
    Replay,
    Run,
    too_large,
)
from ...wsgi import environ_headers

if TYPE_CHECKING:
    from ...store import Store

__all__ = ["IdempotencyMiddleware", "RequestScope", "idempotent", "user_scope"]

log = logging.getLogger("onceonly.idempotency")

T = TypeVar("T")

#: Maps a request to the client its keys are scoped to; ``None`` or ``""``:
#: no client, and a request with a key is refused (400). A plain function
#: runs on the request's thread; under ASGI it must then not query the
#: database (Django refuses that in async code): make it ``async def``.
RequestScope = Callable[[HttpRequest], "str | Awaitable[str | None] | None"]

# The mark a request carries once the middleware has taken it: a decorated
# view behind the middleware does not claim the key a second time.
_TAKEN = "_onceonly_idempotency"
_FALLBACK = by_header("authorization")
_OPTIONS = frozenset(
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


def _anonymous(request: HttpRequest, user: Any) -> str | None:
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    # No user: the credential the client sends, as the ASGI default (a
    # 32-character hash, never equal to a "user:" scope).
    return _FALLBACK(environ_headers(request.META))


def _user_of(request: HttpRequest) -> Any:
    if not hasattr(request, "user"):
        raise ConfigurationError(
            "the Idempotency-Key scope reads request.user: put "
            "onceonly.contrib.django.idempotency.IdempotencyMiddleware after "
            "django.contrib.auth.middleware.AuthenticationMiddleware in MIDDLEWARE, "
            "or give scope="
        )
    return request.user


def user_scope(request: HttpRequest) -> str | None:
    """The default scope: the logged-in user (``user:<pk>``); for an anonymous
    request, a hash of its ``Authorization`` header, or no client."""
    return _anonymous(request, _user_of(request))


async def _auser_scope(request: HttpRequest) -> str | None:
    """:func:`user_scope` for async views: the session is loaded off the loop."""
    _user_of(request)
    auser = getattr(request, "auser", None)  # Django 5.0+
    if auser is None:
        return await sync_to_async(user_scope)(request)
    return _anonymous(request, await auser())


# Responses.


def _problem_response(problem: Problem) -> HttpResponse:
    body = problem_body(problem.status, problem.reason, problem.title, problem.detail)
    response = HttpResponse(body, status=problem.status, content_type="application/problem+json")
    for name, value in problem.headers:
        response.headers[name.decode("latin-1")] = value.decode("latin-1")
    return response


def _replay_response(
    replay: Replay, chunks: Iterable[bytes] | AsyncIterator[bytes] | None
) -> HttpResponseBase:
    response: HttpResponseBase
    if replay.body is not None:
        response = HttpResponse(replay.body, status=replay.status)
    else:
        assert chunks is not None
        response = StreamingHttpResponse(chunks, status=replay.status)
    # Django adds a text/html Content-Type of its own: only the stored ones count.
    del response.headers["Content-Type"]
    for raw_name, raw_value in replay.headers:
        name, value = raw_name.decode("latin-1"), raw_value.decode("latin-1")
        if name == "set-cookie":  # only with replay_set_cookie=True
            response.cookies.load(value)
        elif name in response.headers:
            # Django keeps one value a name: repeats are joined, as RFC 9110 allows.
            response.headers[name] = f"{response.headers[name]}, {value}"
        else:
            response.headers[name] = value
    return response


def _response_headers(response: HttpResponseBase, cookies: bool) -> list[tuple[bytes, bytes]]:
    raw = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers.items()]
    if cookies:
        for morsel in response.cookies.values():
            raw.append((b"set-cookie", morsel.output(header="").strip().encode("latin-1")))
    return raw


class _Claim(NamedTuple):
    """A covered request with a key, before its client is known."""

    key: str
    fingerprint: str


class _Front:
    """The Django front end of one policy, shared by the sync and async paths.

    The policy is built on first use, not at import or at start-up: the
    project's store (``get_app()``) needs the settings, and tests reset it.
    """

    def __init__(self, options: Mapping[str, Any]) -> None:
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ConfigurationError(
                f"unknown Idempotency-Key options {sorted(unknown)}; known: {sorted(_OPTIONS)}"
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

    @property
    def policy(self) -> IdempotencyPolicy:
        policy = self._policy
        store: Store | None = self.options.get("store")
        if store is None:
            from .conf import get_app

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

    def admit(self, request: HttpRequest) -> _Claim | HttpResponse | None:
        """The key and fingerprint of a covered request; a problem answer; or
        ``None``: not the policy's business, the view runs untouched."""
        if getattr(request, _TAKEN, False):
            return None  # the middleware has it
        policy = self.policy
        path, method = request.path, request.method or "GET"
        if not policy.covers(method, path):
            return None
        headers = environ_headers(request.META)
        admitted = policy.admit(path, headers)
        if admitted is None:
            return None
        setattr(request, _TAKEN, True)
        if isinstance(admitted, Problem):
            return _problem_response(admitted)
        limit = policy.max_request_bytes
        declared = headers.get("content-length", "")
        # Refused by its Content-Length before anything is read.
        if (
            declared.isascii()
            and declared.isdigit()
            and (len(declared) > 18 or int(declared) > limit)
        ):
            return _problem_response(too_large(limit))
        try:
            # Read once; Django keeps it, and the view reads it (or POST) again.
            body = request.body
        except RequestDataTooBig:  # over DATA_UPLOAD_MAX_MEMORY_SIZE
            return _problem_response(too_large(limit))
        except OSError:  # the client went away mid-body: nothing claimed
            return HttpResponse(status=400)
        if len(body) > limit:
            return _problem_response(too_large(limit))
        query = request.META.get("QUERY_STRING", "").encode("latin-1")
        return _Claim(admitted.key, policy.fingerprint(method, path, query, body, headers))

    def client(self, request: HttpRequest) -> str | None:
        scope = self.scope or user_scope
        client = scope(request)
        if isinstance(client, Awaitable):
            raise ConfigurationError("an async scope= is for async views; this view is sync")
        return client

    async def aclient(self, request: HttpRequest) -> str | None:
        if self.scope is None:
            return await _auser_scope(request)
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
            return _problem_response(UNSCOPED)
        policy = self.policy
        ident = (client, claim.key)
        bridge = background_loop()
        decision = bridge.run(policy.decide(ident, claim.fingerprint))
        if isinstance(decision, Problem):
            return _problem_response(decision)
        if isinstance(decision, Replay):
            chunks = None if decision.body is not None else self._chunks(ident, decision.fence)
            return _replay_response(decision, chunks)
        recorder = policy.recorder(ident, decision.fence)
        try:
            response = view()
            if asyncio.iscoroutine(response):
                response.close()
                raise ConfigurationError(
                    "a sync view returned a coroutine (an async class-based view decorated "
                    'on dispatch): decorate its handler, method_decorator(..., name="post")'
                )
            if _unrendered(response):
                response = response.render()
        except ConfigurationError:
            bridge.run(recorder.record())  # nothing was answered: the key is free again
            raise
        except Exception as exc:
            # Only a decorated view raises here (Django turns exceptions into
            # responses between middleware): its 500 page is what is kept.
            response = _django_answer(request, exc)
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
        recorder.start(response.status_code, _response_headers(response, self._keeps_cookies))
        if not isinstance(response, StreamingHttpResponse):
            recorder.take(cast(HttpResponse, response).content, more=False)
            # Recorded before Django sends anything: a client that repeats the
            # request the moment it has the answer finds it stored.
            bridge.run(recorder.record())
            return response
        if response.is_async:
            # An async iterator under WSGI: Django itself consumes it on a loop
            # of its own; the relay follows it there.
            return _relay_async(response, recorder, _on_background)
        _set_stream(response, recorder)
        return response

    @property
    def _keeps_cookies(self) -> bool:
        return "set-cookie" not in self.policy.dropped_headers

    # The async path: the view runs on the server's loop; the store's work is
    # awaited on the background loop.

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
            return _problem_response(UNSCOPED)
        policy = self.policy
        ident = (client, claim.key)

        def abandoned(decision: Run | Replay | Problem) -> None:
            if isinstance(decision, Run):  # claimed for a request that is gone: free it
                _detach(policy.recorder(ident, decision.fence).record())

        decision = await _on_background(
            policy.decide(ident, claim.fingerprint), abandoned=abandoned
        )
        if isinstance(decision, Problem):
            return _problem_response(decision)
        if isinstance(decision, Replay):
            chunks = None if decision.body is not None else self._achunks(ident, decision.fence)
            return _replay_response(decision, chunks)
        recorder = policy.recorder(ident, decision.fence)
        try:
            response = await view()
            if _unrendered(response):
                response = await sync_to_async(response.render)()
        except asyncio.CancelledError:
            # Django's ASGI handler cancels the view when the client goes
            # away: it may have done part of its work, so the retry gets a
            # 500, as for an exception, not a second run.
            _keep_problem(recorder, recorder.failed(sent=False, complete=False))
            _detach(recorder.record())
            raise
        except Exception as exc:
            response = await sync_to_async(_django_answer, thread_sensitive=False)(request, exc)
        recorder.start(response.status_code, _response_headers(response, self._keeps_cookies))
        if not isinstance(response, StreamingHttpResponse):
            recorder.take(cast(HttpResponse, response).content, more=False)
            await _on_background(recorder.record())
            return response
        return _relay_async(response, recorder, _on_background)

    async def _achunks(self, ident: tuple[str, str], fence: int) -> AsyncIterator[bytes]:
        seq = 0
        while True:
            chunks = await _on_background(self.policy.read_chunks(ident, fence, seq))
            for chunk in chunks:
                yield chunk
            seq += len(chunks)
            if len(chunks) < 16:
                return


def _unrendered(response: HttpResponseBase) -> TypeGuard[SimpleTemplateResponse]:
    """A TemplateResponse from a decorated view, which Django renders only
    after the view returns: its content is what is stored."""
    return isinstance(response, SimpleTemplateResponse) and not response.is_rendered


def _keep_problem(recorder: Recorder, problem: Problem | None) -> None:
    """Hand the recorder the problem answered instead of the view's response."""
    if problem is not None:
        recorder.start(problem.status, [(b"content-type", b"application/problem+json")])
        body = problem_body(problem.status, problem.reason, problem.title, problem.detail)
        recorder.take(body, more=False)


def _django_answer(request: HttpRequest, exc: Exception) -> HttpResponseBase:
    """The response Django gives for `exc` (handler500, logged, signalled)."""
    from django.core.handlers.exception import response_for_exception

    return response_for_exception(request, exc)


async def _on_background(
    work: Coroutine[Any, Any, T], *, abandoned: Callable[[T], None] | None = None
) -> T:
    """Await `work` run on the background loop, without blocking this loop.

    Cancelling the caller (Django's ASGI handler does, when the client goes
    away) does not cancel `work`: a claim or a record half made would leave
    its key in flight until its lock runs out. `abandoned` then gets what
    `work` returns, on the background loop."""
    future = asyncio.run_coroutine_threadsafe(work, background_loop().loop)
    try:
        return await asyncio.shield(asyncio.wrap_future(future))
    except asyncio.CancelledError:
        if abandoned is not None:
            callback = abandoned

            def done(finished: concurrent.futures.Future[T]) -> None:
                if not finished.cancelled() and finished.exception() is None:
                    callback(finished.result())

            future.add_done_callback(done)
        raise


def _detach(work: Coroutine[Any, Any, None]) -> None:
    """Start `work` on the background loop and do not wait: the caller is being cancelled."""
    asyncio.run_coroutine_threadsafe(work, background_loop().loop)


# Streamed responses: each piece is passed on as it comes and kept by the
# recorder; the last one waits for the record (as under ASGI and WSGI).


class _Drain:
    """Whether a relay, closed early, may read the view's iterator to its end."""

    allowed = False


class _Stream:
    """The relay as the response's content: closed before it was ever read
    (the server gave up before the body), it still reads the view's answer
    and records it, as when it is closed part-way."""

    def __init__(self, relay: Generator[bytes], drain: _Drain) -> None:
        self.relay = relay
        self.drain = drain
        self.started = False

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> bytes:
        self.started = True
        return next(self.relay)

    def close(self) -> None:
        if not self.started and self.drain.allowed:
            self.started = True
            for _ in self.relay:
                pass
        self.relay.close()


def _set_stream(response: StreamingHttpResponse, recorder: Recorder) -> None:
    source = iter(cast(Iterable[bytes], response.streaming_content))
    drain = _Drain()
    stream = _Stream(_relay(recorder, source, drain), drain)
    response.streaming_content = stream
    # Django closes a response's resources in the order they were given, the
    # view's iterator first: a relay that drained it after that would record
    # its truncated body as whole. So the relay's close goes first; where
    # that cannot be done (a Django without this list), a relay closed early
    # keeps a 500 instead.
    closers = getattr(response, "_resource_closers", None)
    if isinstance(closers, list) and closers and closers[-1] == stream.close:
        closers.insert(0, closers.pop())
        drain.allowed = True


def _relay(recorder: Recorder, source: Iterator[bytes], drain: _Drain) -> Generator[bytes]:
    bridge = background_loop()

    def take(piece: bytes, *, more: bool) -> None:
        if recorder.take(piece, more=more):
            bridge.run(recorder.spill())

    pending: bytes | None = None
    finished = False
    try:
        for piece in source:
            if not piece:
                continue
            out, pending = pending, bytes(piece)
            if out is not None:
                take(out, more=True)
                yield out
        last, pending = pending or b"", None
        take(last, more=False)
        finished = True
        bridge.run(recorder.record())
        if last:
            yield last
    except GeneratorExit:
        if not finished:
            # The server stopped early (the client went away): keep what the
            # view gives, to its end; the client's retry gets it replayed.
            if not drain.allowed:
                recorder.failed(sent=True, complete=False)
            else:
                try:
                    if pending is not None:
                        take(pending, more=True)
                    for piece in source:
                        take(bytes(piece), more=True)
                    take(b"", more=False)
                except Exception:
                    log.exception("the view's streamed response failed; a 500 is kept for its key")
                    recorder.failed(sent=True, complete=False)
            bridge.run(recorder.record())
        raise
    except Exception:
        if not finished:
            log.exception("the view's streamed response failed; a 500 is kept for its key")
            recorder.failed(sent=True, complete=False)
            bridge.run(recorder.record())
        raise


def _listed(pieces: Iterable[bytes]) -> list[bytes]:
    return list(pieces)


def _relay_async(
    response: StreamingHttpResponse,
    recorder: Recorder,
    on_background: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]],
) -> StreamingHttpResponse:
    content = response.streaming_content
    is_async = response.is_async

    async def pieces() -> AsyncIterator[bytes]:
        if is_async:
            async for piece in cast(AsyncIterator[bytes], content):
                yield piece
        else:
            # A sync iterator under ASGI: consumed off the loop, whole, as
            # Django's own handler does with one.
            whole: list[bytes] = await sync_to_async(_listed)(cast(Iterable[bytes], content))
            for piece in whole:
                yield piece

    source = pieces()

    async def relay() -> AsyncIterator[bytes]:
        pending: bytes | None = None
        finished = False
        try:
            async for piece in source:
                if not piece:
                    continue
                out, pending = pending, bytes(piece)
                if out is not None:
                    if recorder.take(out, more=True):
                        await on_background(recorder.spill())
                    yield out
            last = pending or b""
            recorder.take(last, more=False)
            finished = True
            await on_background(recorder.record())
            if last:
                yield last
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                # Cancelled mid-stream (the client went away, under ASGI): what
                # was sent cannot be replayed whole; a 500 is kept.
                recorder.failed(sent=True, complete=False)
                _detach(recorder.record())
            raise
        except Exception:
            if not finished:
                log.exception("the view's streamed response failed; a 500 is kept for its key")
                recorder.failed(sent=True, complete=False)
                await on_background(recorder.record())
            raise

    response.streaming_content = relay()
    return response


# The middleware and the decorator.


def _settings_options() -> dict[str, Any]:
    value = getattr(settings, "ONCEONLY_IDEMPOTENCY", {})
    if not isinstance(value, Mapping):
        raise ConfigurationError("settings.ONCEONLY_IDEMPOTENCY must be a dict")
    return dict(value)


class IdempotencyMiddleware:
    """Django middleware: Idempotency-Key for every covered request of the project.

    Its options are ``settings.ONCEONLY_IDEMPOTENCY``, a dict of the keyword
    options of :func:`idempotent`. Put it after ``AuthenticationMiddleware``:
    the default scope reads ``request.user``. Sync under WSGI, async under
    ASGI: Django calls it the way the project runs, with no thread hop.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.front = _Front(_settings_options())
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        return self.front.handle(request, lambda: self.get_response(request))

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        return await self.front.ahandle(
            request, lambda: cast(Awaitable[HttpResponseBase], self.get_response(request))
        )


V = TypeVar("V", bound=Callable[..., Any])


def idempotent(
    *,
    store: Store | None = None,
    methods: Collection[str] = ("POST", "PATCH"),
    paths: Sequence[str] | None = None,
    required: bool | Sequence[str] = False,
    scope: RequestScope | str | None = None,
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
) -> Callable[[V], V]:
    """Idempotency-Key for one view, sync or async (for a class-based view,
    ``method_decorator(idempotent(...), name="post")``).

    The options are those of :class:`~onceonly.idempotency.IdempotencyMiddleware`;
    `store` defaults to the project's (``get_app().store``) and `scope` to
    :func:`user_scope` (a function of the request, sync or async, or its
    dotted path). Behind :class:`IdempotencyMiddleware` the middleware's
    options apply, and the key is claimed once.
    """
    front = _Front(
        {
            "store": store,
            "methods": methods,
            "paths": paths,
            "required": required,
            "scope": scope,
            "fingerprint_headers": fingerprint_headers,
            "ttl": ttl,
            "lock_timeout": lock_timeout,
            "on_conflict": on_conflict,
            "wait_timeout": wait_timeout,
            "max_request_bytes": max_request_bytes,
            "inline_limit": inline_limit,
            "release_statuses": release_statuses,
            "replay_set_cookie": replay_set_cookie,
            "cache_bytes": cache_bytes,
        }
    )

    def decorate(view: V) -> V:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                return await front.ahandle(request, lambda: view(request, *args, **kwargs))

            return cast(V, async_view)

        @functools.wraps(view)
        def sync_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return front.handle(request, lambda: view(request, *args, **kwargs))

        return cast(V, sync_view)

    return decorate
