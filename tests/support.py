"""Helpers for tests: signed deliveries, a live server on loopback, a TCP proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
import uvicorn

from onceonly.cli.protocol import ServeProtocol
from onceonly.providers import Provider, Stripe
from ports import free_port

STRIPE_SECRET = "whsec_test_secret"

#: The engines store-backed tests run on (``ONCEONLY_TEST_ENGINES``).
ENGINES = [
    e.strip() for e in os.environ.get("ONCEONLY_TEST_ENGINES", "sqlite,postgresql").split(",")
]

CHROMIUM = os.environ.get("ONCEONLY_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("ONCEONLY_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
#: Set by CI: a missing browser fails the browser test instead of skipping it.
REQUIRE_BROWSER = os.environ.get("ONCEONLY_TEST_REQUIRE_BROWSER", "") not in ("", "0")
#: The real command, run with this interpreter.
ONCEONLY = [sys.executable, "-m", "onceonly.cli"]


def signed(
    body: bytes,
    provider: Provider | None = None,
    *,
    timestamp: int | None = None,
    delivery_id: str | None = None,
    query: dict[str, str] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """`body` and the headers `provider`'s sender would send with it (default:
    Stripe with :data:`STRIPE_SECRET`), a JSON content type included.

    The one signing helper of the tests that need a genuine delivery to reach
    what comes after verification. It signs with the provider's own
    :meth:`~onceonly.providers.Provider.sign`, so it follows the provider; the
    tests of the signature schemes themselves sign independently (published
    vectors, the providers' SDKs, the documented formulas in
    ``tests/unit/test_providers*.py``) and must not use it.
    """
    signer = provider if provider is not None else Stripe(STRIPE_SECRET)
    headers = signer.sign(body, timestamp=timestamp, delivery_id=delivery_id, query=query)
    return body, {"content-type": "application/json", **headers}


def stripe_delivery(
    event_id: str,
    *,
    event_type: str = "payment_intent.succeeded",
    secret: str = STRIPE_SECRET,
    timestamp: int | None = None,
    extra: dict[str, Any] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """A Stripe event's body and the headers Stripe signs it with."""
    body = json.dumps(
        {"id": event_id, "object": "event", "type": event_type, "data": extra or {}}
    ).encode()
    return signed(body, Stripe(secret), timestamp=timestamp)


def browser_missing() -> str | None:
    """Why the browser test cannot run here, or None when it can."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    if not missing:
        return None
    return (
        f"{' and '.join(missing)} not found, so the browser test did not run. To run it: "
        "apt-get install -y chromium chromium-driver (or set ONCEONLY_TEST_CHROMIUM "
        "and ONCEONLY_TEST_CHROMEDRIVER)"
    )


class _Closeable(Protocol):
    async def close(self) -> None: ...


class _ClosingServer(uvicorn.Server):
    """uvicorn's server, closing `closing` on its own loop once it has stopped."""

    def __init__(self, config: uvicorn.Config, closing: Sequence[_Closeable]) -> None:
        super().__init__(config)
        self.closing = closing

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().serve(sockets)
        finally:
            for resource in self.closing:
                await resource.close()


@contextlib.contextmanager
def live_server(
    app: Any,
    *,
    closing: Sequence[_Closeable] = (),
    http: Any = ServeProtocol,
    timeout_keep_alive: float = 60,
) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a loopback port, in a thread.

    `closing` (stores, typically) are closed when the server stops, on the
    server's event loop: their connections were opened there, and an app
    without a lifespan of its own never closes what it was handed. `http`:
    uvicorn's HTTP protocol, a name or a class; by default the one ``onceonly
    serve`` runs (:class:`onceonly.cli.protocol.ServeProtocol`: a receiver's
    deliveries on its hot path, anything else as uvicorn's own protocol
    serves it; "auto" is uvicorn's as it comes).
    """
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        access_log=False,
        http=http,
        # uvicorn closes a keep-alive connection idle for 5 s by default; with
        # the server and a test's client sharing one busy process (three xdist
        # workers on two cores), a client could send its next request on a
        # connection just as the server closed it (httpx.ReadError).
        timeout_keep_alive=timeout_keep_alive,  # type: ignore[arg-type]
    )
    server = _ClosingServer(config, closing)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def until_closed(port: int, request: bytes) -> bytes:
    """Send `request` on a new loopback connection to `port`; all that comes
    back until the server closes it."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        while chunk := sock.recv(65536):
            received += chunk
    return received


def read_http_response(sock: socket.socket, buffer: bytearray) -> bytes:
    """One whole HTTP/1.1 response (head and a Content-Length body, none
    without one) from `sock`; what follows it stays in `buffer`."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-head: {bytes(buffer)!r}"
        buffer += chunk
    head = bytes(buffer).partition(b"\r\n\r\n")[0]
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    size = len(head) + 4 + length
    while len(buffer) < size:
        chunk = sock.recv(65536)
        assert chunk, "connection closed mid-body"
        buffer += chunk
    response = bytes(buffer[:size])
    del buffer[:size]
    return response


class TcpProxy:
    """A loopback TCP proxy that can be cut and restored, standing in for the
    network path to a database: cut, every connection through it drops and new
    ones are refused, exactly as when the database host goes away."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.target)
            except OSError:
                writer.close()
                return
            self._writers |= {writer, up_writer}
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
            self._writers -= {writer, up_writer}
        finally:
            self._handlers.discard(handler)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._writers.clear()

    def start(self) -> None:
        self._call(self._start())

    def cut(self) -> None:
        self._call(self._stop())

    async def _finish(self) -> None:
        """Cut, then end the connections' handlers: a loop stopped with them
        still pending prints "Task was destroyed but it is pending!" when it
        is collected, in the middle of some later test's output."""
        await self._stop()
        handlers = list(self._handlers)
        for handler in handlers:
            handler.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)

    def close(self) -> None:
        self._call(self._finish())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()


class Server:
    """``onceonly serve`` as a subprocess on a free loopback port, up and healthy."""

    def __init__(self, env: dict[str, str], cwd: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [*ONCEONLY, "serve", "--port", str(self.port), *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                output = self.stop()
                raise RuntimeError(f"onceonly serve did not come up:\n{output}")
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGTERM) -> str:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        out, _ = self.process.communicate(timeout=20)
        return out


@contextlib.contextmanager
def live_wsgi_server(app: Any, *, threads: int = 32) -> Iterator[str]:
    """Serve a WSGI app with waitress (a threaded production server) on a
    loopback port, in a thread of this process."""
    from waitress import wasyncore
    from waitress.server import create_server

    server = create_server(app, host="127.0.0.1", port=0, threads=threads)
    port = server.effective_port  # type: ignore[union-attr]
    stop = threading.Event()

    def run() -> None:
        # waitress's own run() loops until its sockets close, and closing
        # them from another thread breaks its select(): poll here instead,
        # and close everything on this thread.
        while not stop.is_set():
            wasyncore.loop(timeout=0.02, map=server._map, count=1)  # type: ignore[union-attr]
        wasyncore.close_all(server._map)  # type: ignore[union-attr]

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(10)
        server.task_dispatcher.shutdown()
