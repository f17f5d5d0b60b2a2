"""Serve an ASGI app on a loopback port from a thread, for the fake gateway and the demo."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

from .._exceptions import ConfigurationError

__all__ = ["free_port", "serve_in_thread"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_in_thread(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    lifespan: Literal["auto", "on", "off"] = "on",
    limit_concurrency: int | None = None,
) -> Iterator[str]:
    """Run `app` under uvicorn in a daemon thread; yield its base URL; stop it on exit."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port or free_port(host),
        log_level="warning",
        lifespan=lifespan,
        access_log=False,
        limit_concurrency=limit_concurrency,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="onceonly-dev-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ConfigurationError(
                f"could not serve on {host}:{config.port} (is the port in use? try another)"
            )
        time.sleep(0.01)
    try:
        yield f"http://{host}:{config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
