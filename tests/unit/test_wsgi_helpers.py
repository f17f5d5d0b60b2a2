"""onceonly.wsgi: reading a WSGI request's body against a limit, whatever the
client declares; and the background loop WSGI threads share."""

from __future__ import annotations

import io
from typing import Any

import pytest

from onceonly import BodyTooLarge, ConfigurationError
from onceonly._threads import background_loop
from onceonly.wsgi import environ_headers, read_input, read_upto, request_path, status_line


class Dropping(io.BytesIO):
    """A connection that breaks after its bytes: the server raises (gunicorn's
    NoMoreData is an IOError)."""

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if not data:
            raise OSError("connection reset")
        return data


def environ(body: bytes, length: str | None, *, terminated: bool = False) -> dict[str, Any]:
    env: dict[str, Any] = {"wsgi.input": io.BytesIO(body), "REQUEST_METHOD": "POST"}
    if length is not None:
        env["CONTENT_LENGTH"] = length
    if terminated:
        env["wsgi.input_terminated"] = True
    return env


def test_a_body_is_read_to_its_content_length_and_no_further() -> None:
    assert read_input(environ(b"hello, and more", "5"), 100) == b"hello"


@pytest.mark.parametrize("length", ["101", "9" * 40])
def test_a_declared_length_over_the_limit_is_refused_unread(length: str) -> None:
    env = environ(b"x" * 200, length)
    with pytest.raises(BodyTooLarge):
        read_input(env, 100)
    assert env["wsgi.input"].tell() == 0


def test_a_chunked_body_over_the_limit_is_refused_one_byte_past_it() -> None:
    env = environ(b"x" * 10_000, None, terminated=True)
    with pytest.raises(BodyTooLarge):
        read_input(env, 100)
    assert env["wsgi.input"].tell() == 101
    assert read_input(environ(b"y" * 100, None, terminated=True), 100) == b"y" * 100


@pytest.mark.parametrize("length", [None, "", "\u00b2", "-1", "abc"])
def test_without_a_usable_length_or_a_terminated_stream_there_is_no_body(
    length: str | None,
) -> None:
    assert read_input(environ(b"unannounced", length), 100) == b""


def test_a_client_that_goes_away_mid_body_reads_as_none() -> None:
    assert read_input(environ(b"short", "50"), 100) is None
    env = {"wsgi.input": Dropping(b"abc"), "CONTENT_LENGTH": "10"}
    assert read_input(env, 100) is None


def test_read_upto_stops_at_its_cap() -> None:
    assert read_upto(environ(b"x" * 500, "500"), 11) == b"x" * 11
    assert read_upto(environ(b"x" * 500, None, terminated=True), 11) == b"x" * 11


def test_headers_come_lower_case_with_the_unprefixed_two() -> None:
    env = {
        "HTTP_IDEMPOTENCY_KEY": "k-1",
        "HTTP_AUTHORIZATION": "Bearer a",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": "",
        "PATH_INFO": "/orders",
    }
    assert environ_headers(env) == {
        "idempotency-key": "k-1",
        "authorization": "Bearer a",
        "content-type": "application/json",
    }


def test_status_lines() -> None:
    assert status_line(201) == "201 Created"
    assert status_line(299) == "299 Status 299"


def test_the_path_is_the_one_asgi_would_give() -> None:
    # PEP 3333: the URL-decoded bytes as Latin-1 text; ASGI: decoded as UTF-8.
    latin = "/pedidos/a\u00e7a\u00ed".encode().decode("latin-1")
    environ = {"SCRIPT_NAME": "/api", "PATH_INFO": latin}
    assert request_path(environ) == "/api/pedidos/a\u00e7a\u00ed"
    assert request_path({"PATH_INFO": "/caf\u00e9"}) == "/caf\u00e9"  # not UTF-8: kept as is


def test_the_loop_refuses_to_wait_on_itself() -> None:
    loop = background_loop()

    async def nested() -> None:
        async def inner() -> None:
            return None

        loop.run(inner())

    with pytest.raises(ConfigurationError, match="own loop"):
        loop.run(nested())


def test_the_flask_helpers_and_the_wsgi_middleware_import_no_framework() -> None:
    import subprocess
    import sys

    code = (
        "import sys, onceonly.contrib.flask, onceonly.idempotency\n"
        "loaded = {'flask', 'werkzeug', 'waitress', 'gunicorn'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
