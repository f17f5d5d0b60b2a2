"""``onceonly serve``'s HTTP protocol (:mod:`onceonly.cli.transport`) on real
loopback connections to uvicorn: each answer leaves in one write, and no byte
is held past its turn, lost or reordered (streamed bodies, large bodies,
pipelined requests, closing)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from onceonly import Onceonly
from onceonly.asgi import Receive, Scope, Send
from onceonly.cli.transport import HOLD_BYTES, OneWriteProtocol, OneWriteTransport
from onceonly.providers import Stripe
from support import (
    STRIPE_SECRET,
    live_server,
    read_http_response,
    stripe_delivery,
    until_closed,
)


class _Counting:
    """The connection's real transport, keeping each write that reaches it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


# The writes of every connection the servers below accepted, in order.
CONNECTIONS: list[_Counting] = []


class CountedOneWrite(OneWriteProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        counting = _Counting(transport)
        CONNECTIONS.append(counting)
        super().connection_made(counting)  # type: ignore[arg-type]


class CountedPlain(HttpToolsProtocol):
    """uvicorn's protocol as it comes, for comparison."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        counting = _Counting(transport)
        CONNECTIONS.append(counting)
        super().connection_made(counting)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _fresh_connections() -> Iterator[None]:
    CONNECTIONS.clear()
    yield
    CONNECTIONS.clear()


def receiver(tmp_path: Path) -> Onceonly:
    return Onceonly(
        database_url=f"sqlite:///{tmp_path / 'onceonly.db'}",
        providers={"stripe": Stripe(STRIPE_SECRET)},
        environ={},
    )


def deliver_five(url: str) -> list[httpx.Response]:
    """Four events and one of them again, on one keep-alive connection."""
    with httpx.Client(base_url=url, timeout=10) as client:
        deliveries = [stripe_delivery(f"evt_one_write_{n}") for n in range(4)]
        deliveries.append(deliveries[1])
        return [
            client.post("/webhooks/stripe", content=body, headers=headers)
            for body, headers in deliveries
        ]


def test_each_answer_of_the_receiver_leaves_in_one_write(tmp_path: Path) -> None:
    app = receiver(tmp_path)
    with live_server(app.asgi(), http=CountedOneWrite) as url:
        answers = deliver_five(url)
    assert [a.status_code for a in answers] == [200] * 5
    assert [a.json()["duplicate"] for a in answers] == [False] * 4 + [True]
    (connection,) = CONNECTIONS
    # One write per answer, each a whole response: status line, headers, body.
    assert len(connection.writes) == 5
    for write, answer in zip(connection.writes, answers, strict=True):
        assert write.startswith(b"HTTP/1.1 200 OK\r\n")
        assert write.endswith(b"\r\n\r\n" + answer.content)


def test_uvicorn_as_it_comes_writes_headers_and_body_apart(tmp_path: Path) -> None:
    """What the protocol saves: the same five answers are ten writes."""
    app = receiver(tmp_path)
    with live_server(app.asgi(), http=CountedPlain) as url:
        answers = deliver_five(url)
    assert [a.status_code for a in answers] == [200] * 5
    (connection,) = CONNECTIONS
    assert len(connection.writes) == 10
    assert connection.writes[1] == answers[0].content


def test_a_streamed_body_does_not_hold_its_headers_back() -> None:
    got_headers = threading.Event()

    async def streaming(scope: Scope, receive: Receive, send: Send) -> None:
        """Headers, then a body in parts, sent once the client has the headers."""
        if scope["type"] != "http":
            return
        start = {"type": "http.response.start", "status": 200, "headers": [(b"x-part", b"1")]}
        await send(start)
        for _ in range(500):
            if got_headers.is_set():
                break
            await asyncio.sleep(0.01)
        else:
            await send({"type": "http.response.body", "body": b"headers held back"})
            return
        await send({"type": "http.response.body", "body": b"first ", "more_body": True})
        await asyncio.sleep(0.02)
        await send({"type": "http.response.body", "body": b"second"})

    with (
        live_server(streaming, http=OneWriteProtocol) as url,
        httpx.Client(timeout=10) as client,
        client.stream("GET", url + "/") as response,
    ):
        # The headers came while the app waits for this very event.
        assert response.headers["x-part"] == "1"
        got_headers.set()
        body = response.read()
    assert body == b"first second"


async def sized(scope: Scope, receive: Receive, send: Send) -> None:
    """GET /N: N bytes of a pattern, so a lost or moved byte shows."""
    if scope["type"] != "http":
        return
    size = int(scope["path"].strip("/"))
    body = bytes(n % 251 for n in range(size))
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(size).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[bytes, bytes]:
    """One response's head and body from `sock` (what follows stays in `buffer`)."""
    head, _, body = read_http_response(sock, buffer).partition(b"\r\n\r\n")
    return head, body


def pattern(size: int) -> bytes:
    return bytes(n % 251 for n in range(size))


def test_pipelined_requests_get_their_own_bodies_in_order_large_or_small() -> None:
    sizes = [10, HOLD_BYTES * 4, 0, HOLD_BYTES - 1, 300_000, 7]
    with live_server(sized, http=CountedOneWrite) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            # All the requests in one send: the server reads them together.
            sock.sendall(b"".join(f"GET /{n} HTTP/1.1\r\nHost: t\r\n\r\n".encode() for n in sizes))
            buffer = bytearray()
            for size in sizes:
                head, body = read_response(sock, buffer)
                assert head.startswith(b"HTTP/1.1 200 OK")
                assert body == pattern(size), size
    (connection,) = CONNECTIONS
    # Small answers in one write each; a large body goes out apart from its head.
    assert b"".join(connection.writes).count(b"HTTP/1.1 200 OK") == len(sizes)
    assert len(connection.writes) == len(sizes) + 2


def test_closing_sends_what_was_written_first() -> None:
    with live_server(sized, http=OneWriteProtocol) as url:
        port = int(url.rsplit(":", 1)[1])
        # The client asks to close: the answer, then the end of the connection.
        received = until_closed(port, b"GET /20 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert received.startswith(b"HTTP/1.1 200 OK")
        assert received.endswith(b"\r\n\r\n" + pattern(20))
        # A request uvicorn cannot parse: its 400, written just before it closes.
        received = until_closed(port, b"NOT HTTP AT ALL\r\n\r\n")
        assert received.startswith(b"HTTP/1.1 400 Bad Request")
        assert b"Invalid HTTP request" in received


def test_a_whole_answer_leaves_at_once_after_what_is_held() -> None:
    """`write_whole` (the hot path's answers): no wait for the end of the
    turn, and never ahead of bytes already held."""

    class Sink:
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        def write(self, data: bytes) -> None:
            self.writes.append(bytes(data))

        def is_closing(self) -> bool:
            return False

    sink = Sink()
    loop = asyncio.new_event_loop()
    try:
        transport = OneWriteTransport(sink, loop)  # type: ignore[arg-type]
        transport.write(b"held head ")
        transport.write_whole(b"whole answer")
        transport.write_whole(b"another")
        assert sink.writes == [b"held head whole answer", b"another"]
        loop.run_until_complete(asyncio.sleep(0))  # the end of the turn: nothing left
        assert sink.writes == [b"held head whole answer", b"another"]
    finally:
        loop.close()
