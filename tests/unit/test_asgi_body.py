"""onceonly.asgi.read_body: an ASGI request's whole body, against a limit,
however the server splits it into messages, and None when the client leaves."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from onceonly import BodyTooLarge
from onceonly.asgi import Message, Receive, read_body


def messages(*parts: Message) -> tuple[Receive, list[Message]]:
    """A receive() that hands out `parts` in order, and the list of those handed out."""
    given: list[Message] = []

    async def receive() -> Message:
        message = parts[len(given)]
        given.append(message)
        return message

    return receive, given


def body(data: bytes, *, more: bool = False) -> Message:
    return {"type": "http.request", "body": data, "more_body": more}


async def read(
    parts: Sequence[Message], limit: int = 100, length: str | None = None
) -> bytes | None:
    receive, _ = messages(*parts)
    headers = {} if length is None else {"content-length": length}
    return await read_body(headers, receive, limit)


async def test_a_body_in_one_message_comes_back_as_sent() -> None:
    sent = b'{"amount": 100}'
    assert await read([body(sent)]) is sent


async def test_a_body_in_several_messages_is_joined_in_order() -> None:
    parts = [body(b"ab", more=True), body(b"", more=True), body(b"cd", more=True), body(b"e")]
    assert await read(parts) == b"abcde"


async def test_a_message_without_a_body_key_is_an_empty_body() -> None:
    assert await read([{"type": "http.request"}]) == b""
    assert await read([{"type": "http.request", "more_body": True}, body(b"x")]) == b"x"


@pytest.mark.parametrize(
    "parts",
    [
        [{"type": "http.disconnect"}],
        [body(b"half", more=True), {"type": "http.disconnect"}],
    ],
    ids=["before-the-body", "mid-body"],
)
async def test_a_client_that_leaves_gives_no_body(parts: list[Message]) -> None:
    assert await read(parts) is None


@pytest.mark.parametrize(
    "parts",
    [
        [body(b"x" * 101)],
        [body(b"x" * 60, more=True), body(b"x" * 41)],
    ],
    ids=["one-message", "across-messages"],
)
async def test_more_than_the_limit_is_refused_whatever_the_split(parts: list[Message]) -> None:
    with pytest.raises(BodyTooLarge):
        await read(parts, limit=100)
    # At the limit exactly, it is read.
    assert await read([body(b"x" * 100)], limit=100) == b"x" * 100


async def test_a_declared_length_over_the_limit_is_refused_before_anything_is_read() -> None:
    receive, given = messages(body(b"x"))
    with pytest.raises(BodyTooLarge):
        await read_body({"content-length": "101"}, receive, 100)
    assert given == []
    # A huge declared length is refused without turning it into a number.
    with pytest.raises(BodyTooLarge):
        await read_body({"content-length": "9" * 5000}, receive, 100)
    assert given == []


async def test_a_declared_length_that_is_not_a_number_is_left_to_the_body_itself() -> None:
    assert await read([body(b"ok")], length="²") == b"ok"
    assert await read([body(b"ok")], length="12") == b"ok"  # under the limit: read as sent
