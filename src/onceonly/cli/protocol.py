"""``onceonly serve``'s HTTP protocol: deliveries answered without an ASGI call.

uvicorn serves every request through ASGI: a task, a scope, a request-response
cycle with its event, four messages between server and app, and the app's
own coroutines. For a webhook delivery, whose whole body nearly always
arrives in the same read as its headers, that plumbing costs the one event
loop about as much as verifying and storing the delivery does.

:class:`ServeProtocol` is :class:`~onceonly.cli.transport.OneWriteProtocol`
(uvicorn's httptools protocol, one write per answer) with a hot path: a
``POST`` whose body is complete by the end of the read that completed its
headers goes to :meth:`Receiver.receive_now
<onceonly.receiver.Receiver.receive_now>`, straight into the group commit,
and the answer is written from the commit's callback. Everything else takes
uvicorn's own path, untouched: other methods and routes, tenants, the
dashboard, ``/metrics`` and ``/healthz``, a body that trickles in, a body
without ``Content-Length`` or over :data:`HOT_BODY_BYTES`, ``Expect:
100-continue``, upgrades, requests pipelined behind an answer not yet sent,
tracing, the access log. The answers are the same either way (the
receiver decides them; the tests send every case both ways).

A request for the hot path is held, not started, until the read that
completed its headers has been parsed: if its body is complete by then it is
answered here, otherwise it is handed to uvicorn as if it had just arrived.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from typing import Any

import httptools
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from ..dashboard import DashboardMount
from ..receiver import Pending, Receiver
from ..reception import Answer
from .transport import OneWriteProtocol

__all__ = ["HOT_BODY_BYTES", "ServeProtocol", "hot_receiver"]

log = logging.getLogger("uvicorn.error")

#: The largest body the hot path takes (the rest go through ASGI, which reads
#: them as they come): webhook bodies are a few KiB; a larger one gains little.
HOT_BODY_BYTES = 64 * 1024

# What uvicorn writes, after its default headers, to answer an app that
# failed before answering.
_INTERNAL_ERROR = (
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\n"
    b"connection: close\r\n\r\n"
    b"Internal Server Error"
)


class _Held:
    """A hot-path request between its headers and the end of the read."""

    __slots__ = ("body", "keep_alive", "path", "query", "receiver")

    def __init__(self, receiver: Receiver, path: str, query: bytes, keep_alive: bool) -> None:
        self.receiver = receiver
        self.path = path
        self.query = query
        self.keep_alive = keep_alive
        self.body = b""


class _Answering:
    """Stands in for uvicorn's request-response cycle while a hot-path
    delivery waits for its commit: uvicorn's protocol reads these attributes
    (a request pipelined behind it waits; shutdown and a lost connection
    say so here)."""

    __slots__ = ("disconnected", "keep_alive", "response_complete")

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.disconnected = False
        self.response_complete = False

    @property
    def message_event(self) -> _Answering:
        return self

    def set(self) -> None:
        """uvicorn wakes the cycle's reader on a lost connection: nobody reads here."""


def hot_receiver(app: Any, path: str) -> Receiver | None:
    """The :class:`Receiver` that `app` (uvicorn's loaded app) hands a request
    for `path` to, through wrappers known to pass it on unchanged; ``None``
    when anything else may see it first."""
    return _receiver_for(_route_of(app), path)


def _route_of(app: Any) -> tuple[Receiver | None, tuple[str, ...]]:
    """The receiver under `app`'s known wrappers, and the paths those keep
    for themselves (a mounted dashboard's)."""
    taken: list[str] = []
    while True:
        if isinstance(app, Receiver):
            return app, tuple(taken)
        if isinstance(app, ProxyHeadersMiddleware):
            # It rewrites the client address and scheme: the receiver reads neither.
            app = app.app
        elif isinstance(app, DashboardMount):
            taken.append(app.path)
            app = app.app
        else:
            return None, ()


def _receiver_for(route: tuple[Receiver | None, tuple[str, ...]], path: str) -> Receiver | None:
    """`route`'s receiver (see :func:`_route_of`), unless a wrapper keeps `path`."""
    receiver, taken = route
    if receiver is None or any(path == p or path.startswith(p + "/") for p in taken):
        return None
    return receiver


def _render(defaults: list[tuple[bytes, bytes]], answer: Answer, keep_alive: bool) -> bytes:
    """`answer` as uvicorn writes it: status line, its own headers (date,
    server), the answer's, then ``connection: close`` when the connection ends."""
    parts = _head(defaults, answer.status)
    for name, value in answer.asgi_headers:
        parts += (name, b": ", value, b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", answer.body)
    return b"".join(parts)


def _head(defaults: list[tuple[bytes, bytes]], status: int) -> list[bytes]:
    """The status line and uvicorn's own headers, as it writes them."""
    parts = [STATUS_LINE[status]]
    for name, value in defaults:
        parts += (name, b": ", value, b"\r\n")
    return parts


class ServeProtocol(OneWriteProtocol):
    """Pass it as ``uvicorn.run(app, http=ServeProtocol)``, `app` being an
    :meth:`Onceonly.asgi <onceonly.Onceonly.asgi>` (optionally with the
    dashboard mounted by :func:`onceonly.dashboard.for_serve`). With any
    other app it is :class:`~onceonly.cli.transport.OneWriteProtocol`."""

    _held: _Held | None = None
    _route: tuple[Receiver | None, tuple[str, ...]] | None = None
    _idle_since: float | None = None
    _idle_timer: asyncio.TimerHandle | None = None
    _ignored = False

    def on_message_begin(self) -> None:
        # uvicorn builds the request's ASGI scope here; the hot path needs
        # none, so it is built only when uvicorn's path takes the request.
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._ignored = False

    def on_headers_complete(self) -> None:
        if self.transport.is_closing():
            # An answer written during this read closed the connection
            # (``Connection: close``, HTTP/1.0, a 500): what the client sent
            # after that request is not served, as uvicorn serves nothing
            # pipelined behind an answer that closes.
            self._ignored = True
            return
        # A request is under way: no keep-alive timer may run. (uvicorn stops
        # it when a read arrives; an answer written during a read, which only
        # this protocol does, starts it again.)
        self._unset_keepalive_if_required()
        held = self._hold()
        if held is None:
            self._to_uvicorn()
        else:
            self._held = held

    def _to_uvicorn(self) -> None:
        """uvicorn's own handling of a request whose headers are parsed: its
        scope made as uvicorn makes it, then its task started (or queued)."""
        url, headers, expect = self.url, self.headers, self.expect_100_continue
        super().on_message_begin()
        self.url, self.expect_100_continue = url, expect
        self.headers.extend(headers)  # the new list is the scope's
        super().on_headers_complete()

    def _hold(self) -> _Held | None:
        """The request as the hot path takes it, or ``None`` for uvicorn's path."""
        parser = self.parser
        if (
            parser.get_method() != b"POST"
            or self.access_log
            or self.root_path
            or self.limit_concurrency is not None
            or self.expect_100_continue
            or parser.should_upgrade()
            or (self.cycle is not None and not self.cycle.response_complete)
            or self.pipeline
        ):
            return None
        length = self._content_length()
        if length is None or length > HOT_BODY_BYTES:
            return None
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        if self._route is None:
            self._route = _route_of(self.app)  # once per connection
        receiver = _receiver_for(self._route, path)
        if receiver is None or length > receiver.reception.max_body_bytes:
            return None
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        return _Held(receiver, path, url.query or b"", keep_alive)

    def _content_length(self) -> int | None:
        """The one Content-Length header's value; ``None`` for none, several,
        or one that is not plain digits (uvicorn's path judges those)."""
        found: int | None = None
        for name, value in self.headers:
            if name == b"content-length":
                if found is not None or not value.isdigit() or len(value) > 18:
                    return None
                found = int(value)
            elif name == b"transfer-encoding":
                return None
        return found

    def on_body(self, body: bytes) -> None:
        held = self._held
        if held is not None:
            held.body = held.body + body if held.body else body
        elif not self._ignored:
            super().on_body(body)

    def on_message_complete(self) -> None:
        held = self._held
        if held is None:
            if not self._ignored:
                super().on_message_complete()
            return
        self._held = None
        if not self._receive(held):
            self._hand_over(held, complete=True)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        held = self._held
        if held is not None:
            # Headers complete, body not: uvicorn's path reads the rest.
            self._held = None
            self._hand_over(held, complete=False)

    def _receive(self, held: _Held) -> bool:
        """`held`, whole, on the hot path: answered now, or once its commit is
        done. False when the receiver leaves it to uvicorn's path."""
        waiting = _Answering(held.keep_alive)
        try:
            outcome = held.receiver.receive_now(
                held.path,
                held.query,
                self.headers,
                held.body,
                lambda answer: self._settle(answer, waiting),
            )
        except Exception:
            log.exception("Exception in onceonly's receive path")
            self._internal_error()
            return True
        if outcome is None:
            return False
        if isinstance(outcome, Pending):
            # uvicorn's protocol looks at its cycle to queue a request pipelined
            # behind this one, and to mark a shutdown or a lost connection.
            self.cycle = waiting  # type: ignore[assignment]
        else:
            self._answer(outcome, held.keep_alive)
        return True

    def _settle(self, answer: Answer | BaseException, waiting: _Answering) -> None:
        """From the group commit, once the delivery's batch is done: its
        answer on its connection. Never raises: the commit's other
        deliveries are answered after it."""
        waiting.response_complete = True
        try:
            if isinstance(answer, BaseException):
                log.error("Exception in onceonly's receive path", exc_info=answer)
                self._internal_error()
            elif not (waiting.disconnected or self.transport.is_closing()):
                self._answer(answer, waiting.keep_alive)
            # else: its client went away; the event is stored all the same
        except Exception:
            log.exception("Exception while answering a delivery")
            self.transport.abort()

    def _answer(self, answer: Answer, keep_alive: bool) -> None:
        """`answer` as uvicorn would write it, then what uvicorn does after
        an answer: the next pipelined request, or the keep-alive timer."""
        self._write(answer, keep_alive)
        if not keep_alive:
            self.transport.close()
        # uvicorn's on_response_complete, but for the keep-alive timer: a
        # timer set and cancelled per answer cost more than the answer's
        # write; one timer per connection checks how long it has been idle.
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self._idle_timer is None:
            self._idle_timer = self.loop.call_later(self.timeout_keep_alive, self._idle_check)

    def _idle_check(self) -> None:
        """The keep-alive timeout of hot-path answers: close a connection idle
        that long; while a request is under way, the next answer sets it again."""
        self._idle_timer = None
        idle_since = self._idle_since
        if idle_since is None or self.transport.is_closing():
            return
        left = idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self._idle_timer = self.loop.call_later(left, self._idle_check)
        else:
            self.transport.close()

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when a read arrives: the connection is not idle.
        self._idle_since = None
        super()._unset_keepalive_if_required()

    def _write(self, answer: Answer, keep_alive: bool) -> None:
        self.one_write.write_whole(_render(self.server_state.default_headers, answer, keep_alive))

    def _internal_error(self) -> None:
        """As uvicorn answers an app that raised: 500, and the connection closed."""
        if not self.transport.is_closing():
            head = _head(self.server_state.default_headers, 500)
            self.transport.write(b"".join([*head, _INTERNAL_ERROR]))
            self.transport.close()

    def _hand_over(self, held: _Held, *, complete: bool) -> None:
        """`held` to uvicorn's path, as if its headers had just been parsed
        (the parser is still on this request) and its body read so far."""
        self._to_uvicorn()
        if held.body:
            super().on_body(bytes(held.body))
        if complete:
            super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._held = None
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        super().connection_lost(exc)
