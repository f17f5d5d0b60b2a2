"""WSGI types and helpers: request headers and body, problem answers, and one
request of an ASGI app served from a WSGI thread.

The WSGI counterpart of :mod:`onceonly.asgi`, for the Idempotency-Key
middleware's WSGI front end and for receiving webhooks in a Flask view.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Any, NamedTuple

from ._exceptions import BodyTooLarge
from ._threads import background_loop
from .asgi import ASGIApp, Message, problem_body

__all__ = [
    "Answer",
    "Environ",
    "call_asgi",
    "declared_length",
    "environ_headers",
    "problem_body",
    "read_input",
    "read_upto",
    "request_path",
    "status_line",
]

#: PEP 3333's environ (typeshed's ``WSGIEnvironment``, what Flask is typed with).
Environ = dict[str, Any]

_READ = 64 * 1024
# Request headers WSGI keeps outside the HTTP_ prefix.
_UNPREFIXED = {"CONTENT_TYPE": "content-type", "CONTENT_LENGTH": "content-length"}


def status_line(status: int) -> str:
    """``"201 Created"``; an unregistered code goes out with a generic phrase."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Status {status}"


def request_path(environ: Environ) -> str:
    """The request's path as ASGI gives it: the mount point (``SCRIPT_NAME``)
    included, decoded as UTF-8 (PEP 3333 hands it over as Latin-1 text)."""
    raw = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
    try:
        return str(raw.encode("latin-1").decode("utf-8"))
    except UnicodeError:
        return str(raw)


def environ_headers(environ: Environ) -> dict[str, str]:
    """Request headers by lower-case name, as :func:`onceonly.asgi.lower_headers`
    gives them (servers join repeats with ", " or "," themselves)."""
    headers: dict[str, str] = {}
    for name, value in environ.items():
        if name.startswith("HTTP_"):
            headers[name[5:].replace("_", "-").lower()] = value
        elif name in _UNPREFIXED and value != "":
            headers[_UNPREFIXED[name]] = value
    return headers


def declared_length(environ: Environ) -> int | None:
    """The Content-Length, if it is one; huge values come back as ``1 << 62``."""
    declared: str = environ.get("CONTENT_LENGTH") or ""
    # ASCII digits only, and few enough of them that int() cannot be made to work hard.
    if not (declared.isascii() and declared.isdigit()):
        return None
    return int(declared) if len(declared) <= 18 else 1 << 62


def read_input(environ: Environ, limit: int) -> bytes | None:
    """The whole request body from ``wsgi.input``; ``None`` if the client went
    away before sending all of it.

    Refuses more than `limit` bytes (:class:`~onceonly.BodyTooLarge`) before
    reading them when ``Content-Length`` says so, and after `limit` + 1 bytes
    of a chunked body (which servers pass on with ``wsgi.input_terminated``).
    """
    declared = declared_length(environ)
    if declared is not None and declared > limit:
        raise BodyTooLarge(f"body of {declared} bytes is over the {limit}-byte limit")
    body = read_upto(environ, limit + 1)
    if body is not None and len(body) > limit:
        raise BodyTooLarge(f"body is over the {limit}-byte limit")
    return body


def read_upto(environ: Environ, cap: int) -> bytes | None:
    """At most `cap` bytes of the request body; ``None`` if the client went away
    before the ``Content-Length`` it announced. Never reads past that length,
    nor (without one) past the end of a chunked body; without either, PEP 3333
    says there is no body."""
    stream = environ["wsgi.input"]
    declared = declared_length(environ)
    if declared is None and not environ.get("wsgi.input_terminated"):
        return b""
    left = cap if declared is None else min(declared, cap)
    chunks: list[bytes] = []
    while left > 0:
        try:
            chunk = stream.read(min(left, _READ))
        except OSError:  # the connection broke (gunicorn: NoMoreData, an IOError)
            return None
        if not chunk:
            if declared is not None:
                return None  # shorter than announced: the client went away
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Answer(NamedTuple):
    """A whole response an ASGI app gave."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def call_asgi(app: ASGIApp, environ: Environ, path: str, body: bytes) -> Answer:
    """One request to an ASGI app, from a WSGI thread: the request of `environ`,
    at `path`, with its `body` already read; run on the process's background
    loop (:func:`onceonly._threads.background_loop`), so that the app's store
    is only ever used from that loop."""
    raw = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in environ_headers(environ).items()
    ]
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": environ.get("SERVER_PROTOCOL", "HTTP/1.1").partition("/")[2] or "1.1",
        "method": environ["REQUEST_METHOD"],
        "scheme": environ.get("wsgi.url_scheme", "http"),
        "path": path,
        "raw_path": path.encode("utf-8"),
        "root_path": "",
        "query_string": environ.get("QUERY_STRING", "").encode("latin-1"),
        "headers": raw,
        "client": (environ.get("REMOTE_ADDR", ""), int(environ.get("REMOTE_PORT") or 0)),
        "server": (environ.get("SERVER_NAME", ""), int(environ.get("SERVER_PORT") or 0)),
    }
    return background_loop().run(_call(app, scope, body))


async def _call(app: ASGIApp, scope: dict[str, Any], body: bytes) -> Answer:
    delivered = False
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    parts: list[bytes] = []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        # The body was read whole: nothing left to hear but a disconnect,
        # which a WSGI server does not report.
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(n), bytes(v)) for n, v in message.get("headers", ())]
        elif message["type"] == "http.response.body":
            parts.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    return Answer(status, headers, b"".join(parts))
