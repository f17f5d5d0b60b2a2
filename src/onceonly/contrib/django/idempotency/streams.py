"""Streamed responses, and the background loop seen from async code.

Each piece of a streamed response is passed on as it comes and kept by the
recorder; the last one waits for the record (as under ASGI and WSGI).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import (
    AsyncIterator,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
)
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse

from ...._threads import background_loop
from ....idempotency.policy import Recorder

__all__ = [
    "BACKGROUND",
    "LOCAL",
    "Bridge",
    "Drain",
    "Stream",
    "listed",
    "relay",
    "relay_async",
    "set_stream",
]

log = logging.getLogger("onceonly.idempotency")
T = TypeVar("T")


class Bridge:
    """Where a policy's coroutines run, seen from async code.

    ``LOCAL``: on the running loop, whose policy has a store of its own (an
    ASGI server's one loop); no thread switch. ``BACKGROUND``: on the
    process's background loop, whose stores the sync side uses too.

    Cancelling the caller (Django's ASGI handler does, when the client goes
    away) does not cancel the work: a claim or a record half made would
    leave its key in flight until its lock runs out.
    """

    def __init__(self, local: bool) -> None:
        self.local = local
        # Detached work on this loop, kept from the garbage collector.
        self._detached: set[asyncio.Future[Any]] = set()

    def _start(self, work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        if self.local:
            return asyncio.ensure_future(work)
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, background_loop().loop))

    async def run(
        self, work: Coroutine[Any, Any, T], *, abandoned: Callable[[T], None] | None = None
    ) -> T:
        """Await `work`; if the caller is cancelled first, `work` goes on and
        `abandoned` gets what it returns."""
        future = self._start(work)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if abandoned is not None:
                callback = abandoned

                def done(finished: asyncio.Future[T]) -> None:
                    if not finished.cancelled() and finished.exception() is None:
                        callback(finished.result())

                future.add_done_callback(done)
            raise

    def detach(self, work: Coroutine[Any, Any, None]) -> None:
        """Start `work` and do not wait for it: the caller is being cancelled."""
        future = self._start(work)
        self._detached.add(future)
        future.add_done_callback(self._detached.discard)


LOCAL = Bridge(local=True)
BACKGROUND = Bridge(local=False)


# Streamed responses: each piece is passed on as it comes and kept by the
# recorder; the last one waits for the record (as under ASGI and WSGI).


class Drain:
    """Whether a relay, closed early, may read the view's iterator to its end."""

    allowed = False


class Stream:
    """The relay as the response's content: closed before it was ever read
    (the server gave up before the body), it still reads the view's answer
    and records it, as when it is closed part-way."""

    def __init__(self, relay: Generator[bytes], drain: Drain) -> None:
        self.relay = relay
        self.drain = drain
        self.started = False

    def __iter__(self) -> Stream:
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


def set_stream(response: StreamingHttpResponse, recorder: Recorder) -> None:
    """Make a sync streamed `response` pass through a relay to `recorder`."""
    source = iter(cast(Iterable[bytes], response.streaming_content))
    drain = Drain()
    stream = Stream(relay(recorder, source, drain), drain)
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


def relay(recorder: Recorder, source: Iterator[bytes], drain: Drain) -> Generator[bytes]:
    """The view's pieces, passed on one behind and kept by `recorder`."""
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


def listed(pieces: Iterable[bytes]) -> list[bytes]:
    """A sync iterator read whole (off the event loop, by sync_to_async)."""
    return list(pieces)


def relay_async(
    response: StreamingHttpResponse, recorder: Recorder, bridge: Bridge
) -> StreamingHttpResponse:
    """`response`, its content relayed as :func:`relay` does, for async code."""
    content = response.streaming_content
    is_async = response.is_async

    async def pieces() -> AsyncIterator[bytes]:
        if is_async:
            async for piece in cast(AsyncIterator[bytes], content):
                yield piece
        else:
            # A sync iterator under ASGI: consumed off the loop, whole, as
            # Django's own handler does with one.
            whole: list[bytes] = await sync_to_async(listed)(cast(Iterable[bytes], content))
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
                        await bridge.run(recorder.spill())
                    yield out
            last = pending or b""
            recorder.take(last, more=False)
            finished = True
            await bridge.run(recorder.record())
            if last:
                yield last
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                # Cancelled mid-stream (the client went away, under ASGI): what
                # was sent cannot be replayed whole; a 500 is kept.
                recorder.failed(sent=True, complete=False)
                bridge.detach(recorder.record())
            raise
        except Exception:
            if not finished:
                log.exception("the view's streamed response failed; a 500 is kept for its key")
                recorder.failed(sent=True, complete=False)
                await bridge.run(recorder.record())
            raise

    response.streaming_content = relay()
    return response
