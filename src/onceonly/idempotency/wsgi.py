"""Idempotency-Key for a WSGI app (Flask, Django, Pyramid, Bottle, any WSGI callable).

The same policy as the ASGI middleware (:class:`.policy.IdempotencyPolicy`:
the same keys, scopes, fingerprints, answers and records, in the same
tables), around a synchronous app::

    app.wsgi_app = WSGIIdempotencyMiddleware(app.wsgi_app, onceonly=Onceonly())

The server's threads block on the claim and the record, which run on the
process's background event loop (:func:`onceonly._threads.background_loop`):
the store stays on one loop, and group commit batches the claims of all the
threads in one transaction, as it does for concurrent requests under ASGI.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Unpack

from .._exceptions import BodyTooLarge, ConfigurationError
from .._threads import background_loop
from ..wsgi import (
    Environ,
    environ_headers,
    problem_body,
    read_input,
    request_path,
    status_line,
)
from .keys import ClientScope
from .policy import (
    IdempotencyPolicy,
    PolicyOptions,
    Problem,
    Recorder,
    Replay,
    too_large,
)

if TYPE_CHECKING:
    from _typeshed import OptExcInfo
    from _typeshed.wsgi import StartResponse
    from _typeshed.wsgi import WSGIApplication as WSGIApp

    from ..config import Onceonly
    from ..store import Store

__all__ = ["EnvironScope", "WSGIIdempotencyMiddleware"]

log = logging.getLogger("onceonly.idempotency")

#: Maps a request's WSGI environ to the client its keys are scoped to, for
#: identities the headers alone do not give (the user a session cookie
#: stands for: see :func:`onceonly.contrib.flask.user_scope`). ``None`` or
#: ``""``: no client, and a request with a key is refused (400).
EnvironScope = Callable[[Environ], "str | None"]


_INCOMPLETE = Problem(
    400,
    "incomplete-body",
    "Incomplete Body",
    "the request body ended before the length its Content-Length announced",
)


def _problem(start_response: StartResponse, problem: Problem) -> list[bytes]:
    body = problem_body(problem.status, problem.reason, problem.title, problem.detail)
    headers = [
        ("Content-Type", "application/problem+json"),
        *((n.decode("latin-1"), v.decode("latin-1")) for n, v in problem.headers),
        ("Content-Length", str(len(body))),
    ]
    start_response(status_line(problem.status), headers)
    return [body]


class WSGIIdempotencyMiddleware:
    """WSGI middleware with the policy of
    :class:`~onceonly.idempotency.IdempotencyMiddleware`, and its parameters.

    `scope` is a function of the request headers, as for ASGI (default: a
    hash of ``Authorization``); or give `environ_scope`, a function of the
    whole WSGI environ, to scope keys by what only the app knows (a
    logged-in user). Not both.
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        onceonly: Onceonly | None = None,
        store: Store | None = None,
        scope: ClientScope | None = None,
        environ_scope: EnvironScope | None = None,
        **options: Unpack[PolicyOptions],
    ) -> None:
        if scope is not None and environ_scope is not None:
            raise ConfigurationError("give scope= or environ_scope=, not both")
        self.app = app
        self.environ_scope = environ_scope
        self.policy = IdempotencyPolicy(
            onceonly=onceonly,
            store=store,
            scope=scope,
            **options,
        )

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        policy = self.policy
        path = request_path(environ)
        method = environ["REQUEST_METHOD"]
        if not policy.covers(method, path):
            return self.app(environ, start_response)
        headers = environ_headers(environ)
        scope = self.environ_scope
        admitted = policy.admit(path, headers, None if scope is None else (lambda: scope(environ)))
        if admitted is None:
            return self.app(environ, start_response)
        if isinstance(admitted, Problem):
            return _problem(start_response, admitted)
        try:
            body = read_input(environ, policy.max_request_bytes)
        except BodyTooLarge:
            return _problem(start_response, too_large(policy.max_request_bytes))
        if body is None:
            # The client went away before its request was whole: nothing is
            # claimed, and WSGI wants an answer all the same.
            return _problem(start_response, _INCOMPLETE)
        query = environ.get("QUERY_STRING", "").encode("latin-1")
        fp = policy.fingerprint(method, path, query, body, headers)
        ident = (admitted.client, admitted.key)
        bridge = background_loop()
        decision = bridge.run(policy.decide(ident, fp))
        if isinstance(decision, Problem):
            return _problem(start_response, decision)
        if isinstance(decision, Replay):
            return self._replay(start_response, ident, decision)
        return self._execute(environ, start_response, body, policy.recorder(ident, decision.fence))

    # Replaying.

    def _replay(
        self, start_response: StartResponse, ident: tuple[str, str], replay: Replay
    ) -> Iterable[bytes]:
        headers = [(n.decode("latin-1"), v.decode("latin-1")) for n, v in replay.headers]
        start_response(status_line(replay.status), headers)
        if replay.body is not None:
            return [replay.body]
        return self._chunks(ident, replay.fence)

    def _chunks(self, ident: tuple[str, str], fence: int) -> Iterator[bytes]:
        bridge = background_loop()
        seq = 0
        while True:
            chunks = bridge.run(self.policy.read_chunks(ident, fence, seq))
            yield from chunks
            seq += len(chunks)
            if len(chunks) < 16:
                return

    # Running the endpoint once.

    def _execute(
        self, environ: Environ, start_response: StartResponse, body: bytes, recorder: Recorder
    ) -> Iterable[bytes]:
        inner = dict(environ)
        # The body was read whole: the app gets it again, with its length.
        inner["wsgi.input"] = io.BytesIO(body)
        inner["CONTENT_LENGTH"] = str(len(body))
        inner.pop("HTTP_TRANSFER_ENCODING", None)
        inner["wsgi.input_terminated"] = True
        execution = _Execution(recorder, start_response)
        try:
            result = self.app(inner, execution.start_response)
        except Exception as exc:
            log.exception("the endpoint raised; a 500 is kept for its Idempotency-Key")
            return _Response(execution, exc)
        response = _Response(execution, None)
        response.result = result
        return response


class _Execution:
    """Passes the app's response to the server while the recorder keeps it.

    The last piece of the body is held until the record has committed (for a
    response in one piece, the status line too), as under ASGI: a client
    that repeats the request the moment it has the answer finds it stored.
    """

    def __init__(self, recorder: Recorder, server_start: StartResponse) -> None:
        self.recorder = recorder
        self.server_start = server_start
        self.status: str | None = None
        self.headers: list[tuple[str, str]] = []
        #: The status line went to the server, and with it (on its first
        #: write) part of the response to the client.
        self.sent = False
        self.written: list[bytes] = []
        self.recorded = False

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: OptExcInfo | None = None
    ) -> Callable[[bytes], object]:
        if exc_info is not None and exc_info[1] is not None and self.sent:
            # PEP 3333: too late to change the status, the error goes up.
            raise exc_info[1].with_traceback(exc_info[2])
        self.status, self.headers = status, list(headers)
        code = int(status.split(" ", 1)[0])
        self.recorder.start(code, [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers])
        return self.written.append  # the legacy write(): its bytes go first

    def forward_start(self) -> None:
        if not self.sent:
            self.sent = True
            assert self.status is not None
            self.server_start(self.status, self.headers)

    def answer(self, problem: Problem) -> bytes:
        """Hand the recorder and the server a problem instead of the app's answer."""
        body = problem_body(problem.status, problem.reason, problem.title, problem.detail)
        headers = [("Content-Type", "application/problem+json")]
        self.start_response(status_line(problem.status), headers)
        self.headers.append(("Content-Length", str(len(body))))
        return body

    def record(self) -> None:
        if not self.recorded:
            self.recorded = True
            background_loop().run(self.recorder.record())

    def take(self, chunk: bytes, *, more: bool) -> None:
        if self.recorder.take(chunk, more=more):
            background_loop().run(self.recorder.spill())


class _Response:
    """The iterable the server gets. Closed early (the client went away), it
    still runs the app's response to its end and records it: the key must
    not stay in flight, and the client's retry gets the answer."""

    def __init__(self, execution: _Execution, error: Exception | None) -> None:
        self.execution = execution
        self.result: Iterable[bytes] | None = None
        self.source: Iterator[bytes] | None = None
        #: The piece read from the app and not yet passed on.
        self.held: bytes | None = None
        #: What the app raised (before returning, or while giving its body).
        self.error = error

    def _pieces(self) -> Iterator[bytes]:
        """The app's non-empty pieces: what it wrote, then what it returned."""
        written = self.execution.written
        iterator = iter(self.result) if self.result is not None else iter(())
        while True:
            while written:
                if piece := written.pop(0):
                    yield piece
            try:
                piece = next(iterator)
            except StopIteration:
                break
            if piece:
                yield piece
        while written:
            if piece := written.pop(0):
                yield piece

    def _source(self) -> Iterator[bytes]:
        """The app's pieces; an exception among them is kept in `error`."""
        try:
            yield from self._pieces()
        except Exception as exc:
            log.exception("the endpoint raised; a 500 is kept for its Idempotency-Key")
            self.error = exc
        finally:
            close = getattr(self.result, "close", None)
            self.result = None
            if close is not None:
                try:
                    close()
                except Exception:
                    log.exception("closing the endpoint's response failed")

    def __iter__(self) -> Iterator[bytes]:
        ex = self.execution
        self.source = self._source()
        for piece in self.source:
            # One piece is held back: the last goes out after the record.
            out, self.held = self.held, piece
            if out is not None:
                ex.take(out, more=True)
                ex.forward_start()
                yield out
        last = self._ending(self.held)
        self.held = None
        if last is None:
            # Part of the answer is out: the client cannot get a whole one
            # now. The 500 is stored; the server cuts the connection.
            ex.record()
            assert self.error is not None
            raise self.error
        ex.take(last, more=False)
        ex.record()
        ex.forward_start()
        if last:
            yield last

    def _ending(self, held: bytes | None) -> bytes | None:
        """The last piece to send: the app's, or a problem's when it failed
        before any of its answer was sent; ``None`` when it failed after."""
        ex = self.execution
        if self.error is None and ex.status is not None:
            return held or b""
        # Raised, or returned without ever calling start_response.
        problem = ex.recorder.failed(sent=ex.sent, complete=False)
        return None if problem is None else ex.answer(problem)

    def close(self) -> None:
        ex = self.execution
        if ex.recorded:
            return
        # The server stopped early: the client went away, or writing to it
        # failed. Keep recording what the app gives; its retry replays it.
        if self.source is None:
            self.source = self._source()
        if self.held is not None:
            ex.take(self.held, more=True)
            self.held = None
        for piece in self.source:
            ex.take(piece, more=True)
        last = self._ending(None)
        if last:
            ex.take(last, more=False)
        ex.record()
