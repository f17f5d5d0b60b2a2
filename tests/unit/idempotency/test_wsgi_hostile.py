"""The WSGI middleware, called as a server calls it, over the in-memory store:
whatever a client puts in the key, the length or the body, the answer is the
app's or a 4xx problem document, never a 500, and the app runs at most once
per key."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onceonly.idempotency import WSGIIdempotencyMiddleware
from onceonly.store.memory import MemoryStore


class Shop:
    def __init__(self) -> None:
        #: Runs per (credential, key header) that came with a key.
        self.runs: dict[tuple[str | None, str | None], int] = {}

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        body = environ["wsgi.input"].read()  # an in-memory stream: read to its end
        ident = (environ.get("HTTP_AUTHORIZATION"), environ.get("HTTP_IDEMPOTENCY_KEY"))
        self.runs[ident] = self.runs.get(ident, 0) + 1
        start_response("201 Created", [("Content-Type", "application/json")])
        return [json.dumps({"size": len(body)}).encode()]


def call(app: Any, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str], bytes]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": "/orders",
        "QUERY_STRING": "",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        **headers,
    }
    answer: dict[str, Any] = {}

    def start_response(
        status: str, response_headers: list[tuple[str, str]], exc: Any = None
    ) -> Any:
        answer["status"] = int(status.split(maxsplit=1)[0])
        answer["headers"] = {n.lower(): v for n, v in response_headers}
        return lambda data: None

    result = app(environ, start_response)
    try:
        content = b"".join(result)
    finally:
        getattr(result, "close", lambda: None)()
    return answer["status"], answer["headers"], content


SHOP = Shop()
MIDDLEWARE = WSGIIdempotencyMiddleware(SHOP, store=MemoryStore(), max_request_bytes=64)
# Header text as a WSGI server hands it over: Latin-1 characters.
LATIN = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=300)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.one_of(st.none(), LATIN, st.sampled_from(['"k-1"', "k-1", '"k\\"1"', "k 1"])),
    length=st.one_of(st.none(), LATIN, st.integers(-5, 10**30).map(str)),
    body=st.binary(max_size=200),
    credential=st.one_of(st.none(), LATIN),
)
def test_hostile_requests_get_the_app_or_a_4xx_problem(
    key: str | None, length: str | None, body: bytes, credential: str | None
) -> None:
    headers = {"CONTENT_TYPE": "application/json"}
    if key is not None:
        headers["HTTP_IDEMPOTENCY_KEY"] = key
    if length is not None:
        headers["CONTENT_LENGTH"] = length
    if credential is not None:
        headers["HTTP_AUTHORIZATION"] = credential
    status, response_headers, content = call(MIDDLEWARE, headers, body)
    assert status < 500
    if status >= 400:
        assert response_headers["content-type"] == "application/problem+json"
        problem = json.loads(content)
        assert problem["status"] == status
        assert problem["type"].startswith("urn:onceonly:problem:")
    assert all(runs == 1 for (_, key), runs in SHOP.runs.items() if key is not None)
