"""ASGI types and the two ways onceonly answers: JSON and RFC 9457 problems."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from ._exceptions import BodyTooLarge, HeadersTooLarge

__all__ = [
    "ASGIApp",
    "Receive",
    "Scope",
    "Send",
    "lower_header_list",
    "lower_headers",
    "problem_body",
    "read_body",
    "send_problem",
    "send_response",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_PROBLEM = (b"content-type", b"application/problem+json")


def lower_headers(scope: Scope, limit: int | None = None) -> dict[str, str]:
    """Request headers by lower-case name; repeated headers joined with ", ".

    With `limit`, more than that many bytes of names and values together is
    refused (:class:`HeadersTooLarge`, 431) before any of them is looked at.
    """
    return lower_header_list(scope["headers"], limit)


def lower_header_list(
    raw_headers: Sequence[tuple[bytes, bytes]], limit: int | None = None
) -> dict[str, str]:
    """:func:`lower_headers` of the scope's ``headers`` list itself."""
    headers: dict[str, str] = {}
    size = 0
    for raw_name, raw_value in raw_headers:
        size += len(raw_name) + len(raw_value)
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    # Counted in the same pass (decoding is linear in the same bytes), and
    # refused before anything reads them.
    if limit is not None and size > limit:
        raise HeadersTooLarge(f"request headers are over the {limit}-byte limit")
    return headers


async def read_body(headers: Mapping[str, str], receive: Receive, limit: int) -> bytes | None:
    """The whole request body, refusing more than `limit` bytes before reading
    them when Content-Length says so; ``None`` if the client went away.
    (Callers bound the time it may take: see :mod:`onceonly.deadlines`.)"""
    declared = headers.get("content-length")
    # ASCII digits only ("²" is a digit to str.isdigit), and few enough of
    # them that int() cannot be made to work hard.
    if (
        declared is not None
        and declared.isascii()
        and declared.isdigit()
        and (len(declared) > 18 or int(declared) > limit)
    ):
        raise BodyTooLarge(f"body of {declared[:20]} bytes is over the {limit}-byte limit")
    message = await receive()
    # Most bodies come in one message: taken here, without a second coroutine.
    if message["type"] == "http.request" and not message.get("more_body", False):
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise BodyTooLarge(f"body is over the {limit}-byte limit")
        return body
    return await _read_rest(receive, limit, message)


async def _read_rest(receive: Receive, limit: int, message: Message) -> bytes | None:
    """The body from `message` on, the first of several (or a disconnect)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()


async def send_response(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_problem(
    send: Send,
    status: int,
    reason: str,
    title: str,
    detail: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """An RFC 9457 problem document; `reason` names its type."""
    body = problem_body(status, reason, title, detail)
    await send_response(send, status, body, [_PROBLEM, *(extra or [])])


def problem_body(status: int, reason: str, title: str, detail: str) -> bytes:
    """The JSON of an RFC 9457 problem document (``application/problem+json``)."""
    return json.dumps(
        {
            "type": f"urn:onceonly:problem:{reason}",
            "title": title,
            "status": status,
            "detail": detail,
        }
    ).encode()
