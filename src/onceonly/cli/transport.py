"""One write per HTTP response, for ``onceonly serve``.

uvicorn writes a response's status line and headers with one
``transport.write`` and its body with another, and the transport sends each
at once: two ``write`` system calls, and two TCP segments, for every answer.
On the receive path, where every answer is a few dozen bytes of JSON, the
second one cost the server 7-8 µs per delivery, about a tenth of its CPU
with no database, and the load generator as much again (docs/benchmarks.md,
2026-12-06 00:00 UTC). An endpoint with an empty body never pays it, since
uvicorn's write of an empty body sends nothing.

:class:`OneWriteProtocol` is uvicorn's httptools protocol (what ``http="auto"``
picks; httptools is one of onceonly's dependencies) on a transport
that holds a small write back until the next write or the end of the event
loop's turn, whichever comes first. uvicorn writes a response that the app
sends in one go (headers, then the whole body) in a single turn, so it leaves
in one system call. A response that streams its body (the app awaits between
the parts) still has its headers sent at the end of the turn that wrote them:
nothing is held longer than one turn, and the order of the bytes never
changes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["HOLD_BYTES", "OneWriteProtocol", "OneWriteTransport"]

#: A write this large or larger is sent at once rather than held: joining it
#: to the next one would copy it, and it fills segments of its own anyway.
HOLD_BYTES = 16 * 1024


class OneWriteTransport(asyncio.Transport):
    """`transport`, with each small write held until the next write (sent
    with it) or the end of the loop's turn. Everything else is the wrapped
    transport's own: reading, flow control, closing, its extra info."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        if not data:
            return
        held = self._held
        if held is None:
            if len(data) >= HOLD_BYTES:
                self._transport.write(data)
                return
            # A copy of a mutable buffer: its owner may change it after this.
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
            return
        self._held = None
        if len(data) >= HOLD_BYTES:
            self._transport.write(held)
            self._transport.write(data)
        else:
            self._transport.write(held + bytes(data))

    def write_whole(self, data: bytes) -> None:
        """`data`, a whole answer, sent now (after anything held): there is
        no second part to wait for, so no turn of the loop to wait."""
        held, self._held = self._held, None
        self._transport.write(data if held is None else held + data)

    def _flush(self) -> None:
        held, self._held = self._held, None
        # A connection already closing has nobody left to read the bytes.
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        # What was written before close() is sent, as with any transport.
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()


class OneWriteProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`OneWriteTransport`: pass it
    as ``uvicorn.run(..., http=OneWriteProtocol)``."""

    #: The connection's transport, as this protocol wraps it.
    one_write: OneWriteTransport

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.one_write = OneWriteTransport(transport, asyncio.get_running_loop())
        super().connection_made(self.one_write)
