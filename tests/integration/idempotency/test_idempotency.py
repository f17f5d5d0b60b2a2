"""Idempotency-Key middleware over real HTTP, on a real SQLite file and PostgreSQL.

The conformance tests (those taking `frontend`) run twice: against the ASGI
middleware around a Starlette app on uvicorn, and against the WSGI middleware
around the same shop as a Flask app on waitress (a threaded WSGI server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import flask
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from onceonly import create_store
from onceonly._threads import background_loop
from onceonly.idempotency import IdempotencyMiddleware, WSGIIdempotencyMiddleware, by_header
from onceonly.idempotency.records import Completion, KeyClaim, StoredResponse
from support import live_server, live_wsgi_server

REPORT_LINES = 3 * 1024  # 3 MiB in 1 KiB pieces
TRICKLE = 10  # pieces, 50 ms apart


class Shop:
    """A small API whose side effects we can count."""

    def __init__(self) -> None:
        self.orders: list[dict[str, Any]] = []
        self.runs: dict[str, int] = {}
        self._lock = threading.Lock()  # the WSGI server runs views on many threads

    def count(self, name: str) -> None:
        with self._lock:
            self.runs[name] = self.runs.get(name, 0) + 1

    def order(self, payload: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            order = {"id": len(self.orders) + 1, **payload}
            self.orders.append(order)
        return order

    async def create_order(self, request: Request) -> Response:
        self.count("orders")
        order = self.order(await request.json())
        return JSONResponse(
            order,
            status_code=201,
            headers={"location": f"/orders/{order['id']}", "set-cookie": "session=abc"},
        )

    async def slow(self, request: Request) -> Response:
        self.count("slow")
        await asyncio.sleep(0.5)
        return JSONResponse({"run": self.runs["slow"]}, status_code=201)

    async def boom(self, request: Request) -> Response:
        self.count("boom")
        raise RuntimeError("payment provider exploded")

    async def invalid(self, request: Request) -> Response:
        self.count("invalid")
        return JSONResponse({"error": "amount must be positive"}, status_code=422)

    async def report(self, request: Request) -> Response:
        self.count("report")

        async def lines() -> AsyncIterator[bytes]:
            for i in range(REPORT_LINES):
                yield _line(i)

        return StreamingResponse(lines(), media_type="text/plain")

    async def trickle(self, request: Request) -> Response:
        self.count("trickle")

        async def pieces() -> AsyncIterator[bytes]:
            for i in range(TRICKLE):
                await asyncio.sleep(0.05)
                yield _line(i)

        return StreamingResponse(pieces(), media_type="text/plain")

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/orders", self.create_order, methods=["POST"]),
                Route("/slow", self.slow, methods=["POST"]),
                Route("/boom", self.boom, methods=["POST"]),
                Route("/invalid", self.invalid, methods=["POST"]),
                Route("/report", self.report, methods=["POST"]),
                Route("/trickle", self.trickle, methods=["POST"]),
            ]
        )

    def flask_app(self) -> flask.Flask:
        """The same shop as a Flask app."""
        app = flask.Flask("shop")

        @app.post("/orders")
        def create_order() -> flask.Response:
            self.count("orders")
            response = flask.jsonify(self.order(flask.request.get_json()))
            response.status_code = 201
            response.headers["location"] = f"/orders/{response.json['id']}"  # type: ignore[index]
            response.set_cookie("session", "abc")
            return response

        @app.post("/slow")
        def slow() -> tuple[dict[str, int], int]:
            self.count("slow")
            time.sleep(0.5)
            return {"run": self.runs["slow"]}, 201

        @app.post("/boom")
        def boom() -> flask.Response:
            self.count("boom")
            raise RuntimeError("payment provider exploded")

        @app.post("/invalid")
        def invalid() -> tuple[dict[str, str], int]:
            self.count("invalid")
            return {"error": "amount must be positive"}, 422

        @app.post("/report")
        def report() -> flask.Response:
            self.count("report")
            return flask.Response(map(_line, range(REPORT_LINES)), mimetype="text/plain")

        @app.post("/trickle")
        def trickle() -> flask.Response:
            self.count("trickle")

            def pieces() -> Iterator[bytes]:
                for i in range(TRICKLE):
                    time.sleep(0.05)
                    yield _line(i)

            return flask.Response(pieces(), mimetype="text/plain")

        return app


def _line(i: int) -> bytes:
    return (f"{i:08d}" + "x" * 1015 + "\n").encode()


@pytest.fixture
def shop() -> Shop:
    return Shop()


@pytest.fixture(params=["asgi", "wsgi"])
def frontend(request: pytest.FixtureRequest) -> str:
    """Which middleware: ASGI (Starlette on uvicorn) or WSGI (Flask on waitress)."""
    return str(request.param)


@contextlib.contextmanager
def serve(shop: Shop, database_url: str, frontend: str = "asgi", **options: Any) -> Iterator[str]:
    store = create_store(database_url)
    options.setdefault("required", [r"^/orders$"])
    if frontend == "asgi":
        asgi = IdempotencyMiddleware(shop.app(), store=store, **options)
        with live_server(asgi, closing=[store]) as url:
            yield url
        return
    app = shop.flask_app()
    app.wsgi_app = WSGIIdempotencyMiddleware(app.wsgi_app, store=store, **options)  # type: ignore[method-assign]
    try:
        with live_wsgi_server(app) as url:
            yield url
    finally:
        # The WSGI side's store lives on the process's background loop.
        background_loop().run(store.close())


@pytest.fixture
def server(shop: Shop, database_url: str, frontend: str) -> Iterator[str]:
    with serve(shop, database_url, frontend) as url:
        yield url


def key(value: str) -> dict[str, str]:
    return {"idempotency-key": value, "authorization": "Bearer client-a"}


async def test_first_request_runs_and_repeats_replay_it(server: str, shop: Shop) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        first = await client.post("/orders", json={"sku": "A1"}, headers=key("k-1"))
        again = await client.post("/orders", json={"sku": "A1"}, headers=key("k-1"))
        other = await client.post("/orders", json={"sku": "A1"}, headers=key("k-2"))
    assert first.status_code == again.status_code == 201
    assert first.content == again.content
    assert again.headers["location"] == first.headers["location"] == "/orders/1"
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert "set-cookie" not in again.headers  # documented policy: cookies are not replayed
    assert other.json()["id"] == 2
    assert shop.runs["orders"] == 2


async def test_one_cookie_users_response_is_never_replayed_to_another(
    shop: Shop, database_url: str, frontend: str
) -> None:
    """Cookie sessions send no Authorization. By default such a request has no
    client to scope its key to and is refused; scoped by the cookie, each user
    gets their own answer."""
    ana = {"idempotency-key": "checkout-1", "cookie": "session=ana"}
    bia = {"idempotency-key": "checkout-1", "cookie": "session=bia"}
    with serve(shop, database_url, frontend) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            refused = await client.post("/orders", json={"card": "**** 4242"}, headers=ana)
    assert refused.status_code == 400
    assert refused.json()["type"].endswith("idempotency-key-unscoped")
    assert shop.runs.get("orders", 0) == 0  # not run unprotected either
    with serve(shop, database_url, frontend, scope=by_header("cookie")) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            first = await client.post("/orders", json={"card": "**** 4242"}, headers=ana)
            other = await client.post("/orders", json={"card": "**** 1881"}, headers=bia)
            again = await client.post("/orders", json={"card": "**** 4242"}, headers=ana)
    assert (first.status_code, other.status_code, again.status_code) == (201, 201, 201)
    assert "4242" not in other.text
    assert again.headers["idempotent-replayed"] == "true"
    assert shop.runs["orders"] == 2


async def test_50_concurrent_requests_with_one_key_run_the_endpoint_once(
    server: str, shop: Shop
) -> None:
    async with httpx.AsyncClient(
        base_url=server, limits=httpx.Limits(max_connections=50), timeout=30
    ) as client:
        responses = await asyncio.gather(
            *(client.post("/slow", json={}, headers=key("same")) for _ in range(50))
        )
        later = await client.post("/slow", json={}, headers=key("same"))
    assert shop.runs["slow"] == 1
    statuses = [r.status_code for r in responses]
    assert statuses.count(201) >= 1
    assert set(statuses) <= {201, 409}
    for r in responses:
        if r.status_code == 409:
            assert r.headers["retry-after"] == "1"
            assert r.headers["content-type"] == "application/problem+json"
    assert later.status_code == 201
    assert later.headers["idempotent-replayed"] == "true"


async def test_wait_mode_gives_every_concurrent_repeat_the_same_response(
    shop: Shop, database_url: str, frontend: str
) -> None:
    with serve(shop, database_url, frontend, on_conflict="wait") as url:
        async with httpx.AsyncClient(
            base_url=url, limits=httpx.Limits(max_connections=20), timeout=30
        ) as client:
            responses = await asyncio.gather(
                *(client.post("/slow", json={}, headers=key("wait")) for _ in range(20))
            )
    assert shop.runs["slow"] == 1
    assert {r.status_code for r in responses} == {201}
    assert len({r.content for r in responses}) == 1


async def test_a_500_is_stored_and_replayed_not_run_again(server: str, shop: Shop) -> None:
    # Under ASGI the exception still reaches the server (it logs it and closes
    # that connection, as for any ASGI app that raises): one connection per
    # request. Flask answers its own 500 page.
    async with httpx.AsyncClient(base_url=server) as client:
        first = await client.post("/boom", json={}, headers=key("b-1"))
    async with httpx.AsyncClient(base_url=server) as client:
        again = await client.post("/boom", json={}, headers=key("b-1"))
    assert first.status_code == again.status_code == 500
    assert again.headers["idempotent-replayed"] == "true"
    assert first.content == again.content
    assert b"Internal Server Error" in first.content
    assert shop.runs["boom"] == 1


async def test_same_key_different_request_is_422(server: str, shop: Shop) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        await client.post("/orders", json={"sku": "A1"}, headers=key("k-x"))
        body = await client.post("/orders", json={"sku": "B2"}, headers=key("k-x"))
        path = await client.post("/slow", json={"sku": "A1"}, headers=key("k-x"))
    assert body.status_code == path.status_code == 422
    assert body.headers["content-type"] == "application/problem+json"
    assert "different request" in body.json()["detail"]
    assert shop.runs["orders"] == 1


@pytest.mark.parametrize(
    ("header", "status"),
    [(None, 400), ('"unterminated', 400), ("", 400), ("x" * 256, 400), ("é", 400)],
)
async def test_missing_or_malformed_keys_are_400(
    server: str, shop: Shop, header: str | None, status: int
) -> None:
    headers = {} if header is None else {"idempotency-key": header}
    async with httpx.AsyncClient(base_url=server) as client:
        response = await client.post(
            "/orders",
            json={"sku": "A1"},
            headers=[(k.encode(), v.encode()) for k, v in headers.items()],
        )
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    assert "orders" not in shop.runs


async def test_quoted_and_bare_keys_are_the_same_key(server: str, shop: Shop) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        bare = await client.post("/orders", json={}, headers=key("8e03978e"))
        quoted = await client.post("/orders", json={}, headers=key('"8e03978e"'))
    assert quoted.headers["idempotent-replayed"] == "true"
    assert bare.content == quoted.content
    assert shop.runs["orders"] == 1


async def test_keys_are_scoped_by_client_identity(server: str, shop: Shop) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        a = await client.post("/orders", json={}, headers=key("shared"))
        b = await client.post(
            "/orders", json={}, headers={"idempotency-key": "shared", "authorization": "Bearer b"}
        )
    assert a.json()["id"] != b.json()["id"]
    assert "idempotent-replayed" not in b.headers
    assert shop.runs["orders"] == 2


async def test_validation_failures_are_not_stored(server: str, shop: Shop) -> None:
    async with httpx.AsyncClient(base_url=server) as client:
        first = await client.post("/invalid", json={"amount": -1}, headers=key("v-1"))
        fixed = await client.post("/invalid", json={"amount": 5}, headers=key("v-1"))
    assert first.status_code == fixed.status_code == 422
    assert "idempotent-replayed" not in fixed.headers
    assert shop.runs["invalid"] == 2  # released: the corrected request ran


async def test_large_streamed_responses_replay_byte_for_byte(
    server: str, shop: Shop, database_url: str
) -> None:
    async with httpx.AsyncClient(base_url=server, timeout=30) as client:
        first = await client.post("/report", json={}, headers=key("r-1"))
        again = await client.post("/report", json={}, headers=key("r-1"))
    assert len(first.content) == 3 * 1024 * 1024
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert shop.runs["report"] == 1
    from onceonly.db import create_engine

    engine = create_engine(database_url)
    with engine.connect() as conn:
        chunks = conn.exec_driver_sql("SELECT count(*) FROM onceonly_idempotency_chunks").scalar()
    engine.dispose()
    assert chunks == 48  # stored as 64 KiB chunks, never as one 3 MiB value


async def test_requests_over_the_limit_are_refused_not_run_unprotected(
    shop: Shop, database_url: str, frontend: str
) -> None:
    with serve(shop, database_url, frontend, max_request_bytes=100) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            response = await client.post("/orders", json={"pad": "x" * 200}, headers=key("big"))
    assert response.status_code == 413
    assert "orders" not in shop.runs


async def test_expired_keys_run_again_and_purge_forgets_them(
    shop: Shop, database_url: str, frontend: str
) -> None:
    with serve(shop, database_url, frontend, ttl=1.0, lock_timeout=0.5, cache_bytes=0) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            await client.post("/orders", json={}, headers=key("e-1"))
            await asyncio.sleep(1.1)
            again = await client.post("/orders", json={}, headers=key("e-1"))
    assert "idempotent-replayed" not in again.headers
    assert shop.runs["orders"] == 2
    store = create_store(database_url)
    keys = store.idempotency_keys()
    assert await keys.purge(now=time.time() + 2) == 1
    await store.close()


async def test_purging_an_expired_record_drops_its_response_chunks(database_url: str) -> None:
    # The chunks reference their record ON DELETE CASCADE; on SQLite the
    # cascade only happens on a connection with foreign_keys on, and the key
    # store once purged through one without it, leaving the chunks behind.
    store = create_store(database_url)
    keys = store.idempotency_keys()
    now = time.time()
    (claimed,) = await keys.claim([KeyClaim("c", "big", "fp")], now=now, lock_seconds=10, ttl=1)
    await keys.append_chunks("c", "big", claimed.fence, 0, [b"one", b"two"])
    response = StoredResponse(200, (), None)
    assert await keys.complete([Completion("c", "big", claimed.fence, response)], now=now) == [True]
    assert await keys.read_chunks("c", "big", claimed.fence, 0, 10) == [b"one", b"two"]
    assert await keys.purge(now=now + 2) == 1
    assert await keys.read_chunks("c", "big", claimed.fence, 0, 10) == []
    await store.close()


async def test_a_stale_owner_cannot_overwrite_a_newer_one(database_url: str) -> None:
    store = create_store(database_url)
    keys = store.idempotency_keys()
    claim = KeyClaim("client", "k", "fp")
    now = time.time()
    (first,) = await keys.claim([claim], now=now, lock_seconds=1, ttl=100)
    (blocked,) = await keys.claim([claim], now=now + 0.5, lock_seconds=1, ttl=100)
    (taken,) = await keys.claim([claim], now=now + 2, lock_seconds=1, ttl=100)
    other = await keys.claim(
        [KeyClaim("client", "k", "other-fp")], now=now + 4, lock_seconds=1, ttl=100
    )
    assert (first.state, blocked.state, taken.state) == ("acquired", "running", "acquired")
    assert taken.fence == first.fence + 1
    assert other[0].state == "running"  # a different request never takes over a crashed one
    response = StoredResponse(201, (("content-type", "application/json"),), b"{}")
    stale = await keys.complete([Completion("client", "k", first.fence, response)], now=now + 3)
    fresh = await keys.complete([Completion("client", "k", taken.fence, response)], now=now + 3)
    assert (stale, fresh) == ([False], [True])
    await store.close()


async def test_repeats_in_one_batch_see_the_first_as_running(database_url: str) -> None:
    store = create_store(database_url)
    keys = store.idempotency_keys()
    outcomes = await keys.claim(
        [KeyClaim("c", "dup", "fp"), KeyClaim("c", "dup", "fp"), KeyClaim("c", "solo", "fp")],
        now=time.time(),
        lock_seconds=10,
        ttl=100,
    )
    assert [o.state for o in outcomes] == ["acquired", "running", "acquired"]
    await store.close()


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
async def test_store_unreachable_fails_closed_with_503(
    shop: Shop, database_url: str, frontend: str
) -> None:
    import sqlite3
    from urllib.parse import urlsplit

    with serve(shop, database_url + "?busy_timeout=200", frontend) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            await client.post("/orders", json={}, headers=key("warm"))
            blocker = sqlite3.connect(urlsplit(database_url).path, isolation_level=None)
            blocker.execute("BEGIN EXCLUSIVE")
            try:
                response = await client.post("/orders", json={}, headers=key("during"))
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
    assert response.status_code == 503
    assert shop.runs["orders"] == 1  # never run without protection


async def _post_twice(
    app: Any, database_url: str, name: str
) -> tuple[httpx.Response, httpx.Response]:
    """POST /charge twice with one key, behind the middleware."""
    store = create_store(database_url)
    with live_server(IdempotencyMiddleware(app, store=store), closing=[store]) as url:
        # One connection each: the server closes a connection whose request raised.
        async with httpx.AsyncClient(base_url=url) as client:
            first = await client.post("/charge", json={}, headers=key(name))
        async with httpx.AsyncClient(base_url=url) as client:
            again = await client.post("/charge", json={}, headers=key(name))
    return first, again


async def test_a_bare_asgi_app_that_raises_gets_a_stored_problem_500(database_url: str) -> None:
    runs = 0

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        if scope["type"] != "http":
            return  # no lifespan support, like many bare apps
        runs += 1
        raise RuntimeError("no framework to catch this")

    first, again = await _post_twice(bare, database_url, "raw")
    assert first.status_code == again.status_code == 500
    assert first.headers["content-type"] == "application/problem+json"
    assert again.json() == first.json()
    assert runs == 1


async def test_replayed_headers_are_the_bytes_the_endpoint_sent(database_url: str) -> None:
    # Header values with JSON's special characters, a Latin-1 byte and a
    # repeated name go through the database as JSON (nested in the batch's
    # parameter on PostgreSQL) and must come back byte for byte, in order.
    sent = [
        (b"content-type", b"application/json"),
        (b"x-quoted", b'say "hi" \\ back\\slash, tab\there'),
        (b"x-latin", b"caf\xe9"),
        (b"link", b"</a>; rel=next"),
        (b"link", b"</b>; rel=prev"),
    ]
    runs = 0

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        if scope["type"] != "http":
            return
        runs += 1
        await send({"type": "http.response.start", "status": 201, "headers": sent})
        await send({"type": "http.response.body", "body": b"{}"})

    first, again = await _post_twice(bare, database_url, "odd-headers")
    assert runs == 1
    assert again.headers["idempotent-replayed"] == "true"
    for response in (first, again):
        kept = [(n, v) for n, v in response.headers.raw if n.lower() in {n for n, _ in sent}]
        assert kept == sent


async def test_one_batch_completes_and_claims_together(database_url: str) -> None:
    """A group commit carries finished responses and new claims in one go: every
    caller still gets its own answer, as if each had gone alone."""
    store = create_store(database_url)
    keys = store.idempotency_keys()
    now = time.time()
    ok = StoredResponse(201, (("content-type", "application/json"),), b'{"id": 1}')
    a, b, done, _running = await keys.claim(
        [KeyClaim("c", k, "fp") for k in ("a", "b", "done", "running")],
        now=now,
        lock_seconds=10,
        ttl=100,
    )
    assert await keys.complete([Completion("c", "done", done.fence, ok)], now=now) == [True]
    landed, outcomes = await keys.apply(
        [Completion("c", "a", a.fence, ok), Completion("c", "b", b.fence + 1, ok)],
        [
            KeyClaim("c", "fresh", "fp"),
            KeyClaim("c", "fresh", "fp"),
            KeyClaim("c", "done", "fp"),
            KeyClaim("c", "running", "fp"),
            KeyClaim("c", "done", "other-fp"),
        ],
        now=now + 1,
        lock_seconds=10,
        ttl=100,
    )
    assert landed == [True, False]  # b's completion came from a stale owner
    assert [o.state for o in outcomes] == ["acquired", "running", "done", "running", "done"]
    assert (outcomes[2].response, outcomes[2].fingerprint) == (ok, "fp")
    assert outcomes[4].fingerprint == "fp"  # the middleware answers 422 from this
    # A key completed and claimed again in the same batch: the claim sees it done.
    fresh = outcomes[0]
    landed, (again,) = await keys.apply(
        [Completion("c", "fresh", fresh.fence, ok)],
        [KeyClaim("c", "fresh", "fp")],
        now=now + 2,
        lock_seconds=10,
        ttl=100,
    )
    assert landed == [True]
    assert (again.state, again.response) == ("done", ok)
    await store.close()


async def test_an_expired_record_is_claimed_again_in_a_batch(database_url: str) -> None:
    store = create_store(database_url)
    keys = store.idempotency_keys()
    now = time.time()
    ok = StoredResponse(200, (), b"old")
    (first,) = await keys.claim([KeyClaim("c", "old", "fp")], now=now, lock_seconds=1, ttl=2)
    await keys.complete([Completion("c", "old", first.fence, ok)], now=now)
    replay, taken = await keys.claim(
        [KeyClaim("c", "old", "fp"), KeyClaim("c", "x", "fp")], now=now + 1, lock_seconds=1, ttl=2
    )
    assert (replay.state, taken.state) == ("done", "acquired")
    (renewed,) = await keys.claim(
        [KeyClaim("c", "old", "new-fp")], now=now + 3, lock_seconds=1, ttl=2
    )
    assert (renewed.state, renewed.fence) == ("acquired", first.fence + 1)
    await store.close()


async def test_a_failure_after_the_status_line_is_stored_and_answered_as_one_500(
    database_url: str,
) -> None:
    """The status line is held with the body: an endpoint that fails after
    starting its answer gives the client a whole 500, and the retry the same."""
    runs = 0

    async def half(scope: Any, receive: Any, send: Any) -> None:
        nonlocal runs
        if scope["type"] != "http":
            return
        runs += 1
        await send({"type": "http.response.start", "status": 201, "headers": []})
        raise RuntimeError("failed after the status line")

    first, again = await _post_twice(half, database_url, "half")
    assert first.status_code == again.status_code == 500
    assert first.headers["content-type"] == "application/problem+json"
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert runs == 1


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_a_claim_racing_the_completion_of_its_key_waits_and_sees_it_done(
    database_url: str,
) -> None:
    """A completion in flight in another transaction (another server process):
    a claim of its key, whose lock has run out, tries to take it over, waits
    for the row and re-checks it under its lock; it finds the stored response,
    never becomes a second owner."""
    import asyncpg

    from onceonly.store.idempotency_postgres import PostgresKeyStore

    store = create_store(database_url)
    keys = store.idempotency_keys()
    now = time.time()
    claim = KeyClaim("c", "k", "fp")
    ok = StoredResponse(201, (("content-type", "application/json"),), b'{"id": 1}')
    (first,) = await keys.claim([claim], now=now, lock_seconds=1, ttl=100)
    assert first.state == "acquired"
    completing = await asyncpg.connect(database_url)
    try:
        in_flight = completing.transaction()
        await in_flight.start()
        rows = await completing.fetch(
            PostgresKeyStore._COMPLETE,
            *PostgresKeyStore._complete_args([Completion("c", "k", first.fence, ok)], now + 2),
        )
        assert len(rows) == 1  # updated, not committed: the row is locked
        racing = asyncio.ensure_future(keys.claim([claim], now=now + 2, lock_seconds=1, ttl=100))
        await asyncio.sleep(0.3)
        assert not racing.done()  # waiting for the completion's row lock
        await in_flight.commit()
        (outcome,) = await racing
    finally:
        await completing.close()
    assert (outcome.state, outcome.fence, outcome.response) == ("done", first.fence, ok)
    await store.close()


async def test_replays_from_memory_are_not_changed_by_a_middleware_outside(
    shop: Shop, database_url: str
) -> None:
    # GZip rewrites the headers of the responses that pass through it; a
    # replay served from the cache must not carry what it added to an earlier one.
    from starlette.middleware.gzip import GZipMiddleware

    store = create_store(database_url)
    app = GZipMiddleware(IdempotencyMiddleware(shop.app(), store=store), minimum_size=0)
    gzip, identity = {"accept-encoding": "gzip"}, {"accept-encoding": "identity"}
    with live_server(app, closing=[store]) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            first = await client.post("/orders", json={"sku": "A1"}, headers=key("gz"))
            replays = [
                await client.post("/orders", json={"sku": "A1"}, headers={**key("gz"), **h})
                for h in (gzip, gzip, identity, identity)
            ]
    assert shop.runs["orders"] == 1
    assert all(r.headers["idempotent-replayed"] == "true" for r in replays)
    assert all(r.content == first.content for r in replays)
    assert [r.headers.get("content-encoding") for r in replays] == ["gzip", "gzip", None, None]
    assert all(r.headers.get_list("content-type") == ["application/json"] for r in replays)


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_batches_look_keys_up_by_primary_key_in_a_table_of_many_keys(
    database_url: str,
) -> None:
    """Batches are planned once per connection, on whatever the table holds
    then: a plan made on an empty table must still look keys up by primary
    key once it holds tens of thousands (a plan that scans the table whole
    took 4.5 ms instead of 1 ms a batch at 24,000 keys)."""
    from onceonly.store.idempotency_postgres import PostgresKeyStore as Keys
    from onceonly.store.postgres import PostgresStore

    store = create_store(database_url)
    assert isinstance(store, PostgresStore)
    now = time.time()
    claims = json.dumps([("c", f"new-{i}", "fp") for i in range(8)])
    done = '[["content-type", "application/json"]]'
    completions = json.dumps([("c", f"key-{i}", 1, 201, done, "7b7d", False) for i in range(8)])
    claim_args = f"'{claims}', {now}, 60, 3600, 8"
    both_args = f"{claim_args}, '{completions}', {now}, 8"
    try:
        async with store.lookup_connection() as conn:
            await conn.execute(
                f"PREPARE claim(json, float8, float8, float8, bigint) AS {Keys._CLAIM}"
            )
            await conn.execute(
                "PREPARE both_kinds(json, float8, float8, float8, bigint, json, float8, bigint)"
                f" AS {Keys._COMPLETE_AND_CLAIM}"
            )
            planning = conn.transaction()  # plan both on the empty table, keep nothing
            await planning.start()
            await conn.execute(f"EXECUTE claim({claim_args})")
            await conn.execute(f"EXECUTE both_kinds({both_args})")
            await planning.rollback()
            await conn.execute(
                "INSERT INTO onceonly_idempotency_keys"
                " (scope, key, fingerprint, status, locked_until, expires_at, created_at)"
                " SELECT 'c', 'key-' || i, 'fp', 'running', $1::float8, $1::float8 + 3600,"
                " $1::float8 FROM generate_series(0, 29999) AS i",
                now + 60,
            )
            # No ANALYZE: it would have the plans made again; autovacuum runs
            # it at its own pace, a minute or more after the table has grown.
            plans = {
                name: "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE {call}"))
                for name, call in (
                    ("claim", f"claim({claim_args})"),
                    ("complete and claim", f"both_kinds({both_args})"),
                )
            }
    finally:
        await store.close()
    for name, plan in plans.items():
        assert "Seq Scan on onceonly_idempotency_keys" not in plan, f"{name}:\n{plan}"
        assert "Index Scan using onceonly_idempotency_keys_pkey" in plan, f"{name}:\n{plan}"
        assert "Hash" not in plan, f"{name}:\n{plan}"
        assert "Merge" not in plan, f"{name}:\n{plan}"


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_a_claim_racing_a_new_claim_of_its_key_sees_it_running(database_url: str) -> None:
    """Two processes claim a new key at once: the one that reads no record and
    then loses the insert finds the winner's claim, in flight, and does not run."""
    import asyncpg

    from onceonly.store.idempotency_postgres import PostgresKeyStore

    store = create_store(database_url)
    keys = store.idempotency_keys()
    await store.open()
    now = time.time()
    winner = await asyncpg.connect(database_url)
    try:
        in_flight = winner.transaction()
        await in_flight.start()
        rows = await winner.fetch(
            PostgresKeyStore._CLAIM,
            *PostgresKeyStore._claim_args([KeyClaim("c", "k", "fp-1")], now, 60, 3600),
        )
        assert [row["kind"] for row in rows] == ["c"]  # inserted, not committed
        racing = asyncio.ensure_future(
            keys.claim([KeyClaim("c", "k", "fp-1")], now=now, lock_seconds=60, ttl=3600)
        )
        await asyncio.sleep(0.3)
        assert not racing.done()  # waiting to learn whether the insert commits
        await in_flight.commit()
        (outcome,) = await racing
    finally:
        await winner.close()
        await store.close()
    assert (outcome.state, outcome.fence, outcome.fingerprint) == ("running", 1, "fp-1")


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
async def test_a_broken_lookup_connection_is_replaced(database_url: str) -> None:
    """The connection claims and completions run on is cut (a server restart,
    a proxy timeout): at worst the batch on it fails as unavailable (never as
    an unexpected error), and the next one gets a new connection."""
    import asyncpg

    from onceonly import StoreUnavailable

    store = create_store(database_url)
    keys = store.idempotency_keys()
    now = time.time()
    (first,) = await keys.claim([KeyClaim("c", "k-1", "fp")], now=now, lock_seconds=60, ttl=3600)
    admin = await asyncpg.connect(database_url)
    try:
        cut = await admin.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND query LIKE '%onceonly_idempotency_keys%'"
        )
    finally:
        await admin.close()
    assert cut >= 1
    await asyncio.sleep(0.1)
    # Whether the client has already seen the connection close is a race: if
    # it has, this batch already goes through on a new one.
    with contextlib.suppress(StoreUnavailable):
        await keys.claim([KeyClaim("c", "k-2", "fp")], now=now, lock_seconds=60, ttl=3600)
    (again,) = await keys.claim([KeyClaim("c", "k-3", "fp")], now=now, lock_seconds=60, ttl=3600)
    await store.close()
    assert (first.state, again.state) == ("acquired", "acquired")


async def test_a_client_that_goes_away_mid_response_leaves_its_key_answered(
    server: str, shop: Shop
) -> None:
    """The client reads the first piece of a streamed answer and hangs up. The
    endpoint's answer is still recorded whole: the retry gets it replayed,
    never a key stuck "in progress" until its lock runs out."""
    async with (
        httpx.AsyncClient(base_url=server, timeout=10) as client,
        client.stream("POST", "/trickle", json={}, headers=key("gone")) as first,
    ):
        assert first.status_code == 200
        async for _ in first.aiter_raw():
            break  # one piece, then the connection is closed
    deadline = time.monotonic() + 5
    async with httpx.AsyncClient(base_url=server, timeout=10) as client:
        while True:
            again = await client.post("/trickle", json={}, headers=key("gone"))
            if again.status_code != 409 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert again.status_code == 200
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == b"".join(_line(i) for i in range(TRICKLE))
    assert shop.runs["trickle"] == 1


def _post_twice_wsgi(
    app: Any, database_url: str, name: str
) -> tuple[httpx.Response | None, httpx.Response]:
    """POST /charge twice with one key, behind the WSGI middleware; the first
    answer is None when the connection broke off mid-response."""
    store = create_store(database_url)
    try:
        with live_wsgi_server(WSGIIdempotencyMiddleware(app, store=store)) as url:
            first: httpx.Response | None
            try:
                first = httpx.post(f"{url}/charge", json={}, headers=key(name))
            except httpx.TransportError:
                first = None
            again = httpx.post(f"{url}/charge", json={}, headers=key(name))
    finally:
        background_loop().run(store.close())
    return first, again


def test_a_bare_wsgi_app_that_raises_gets_a_stored_problem_500(database_url: str) -> None:
    runs = 0

    def bare(environ: Any, start_response: Any) -> list[bytes]:
        nonlocal runs
        runs += 1
        raise RuntimeError("no framework to catch this")

    first, again = _post_twice_wsgi(bare, database_url, "raw")
    assert first is not None
    assert first.status_code == again.status_code == 500
    assert first.headers["content-type"] == "application/problem+json"
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert runs == 1


def test_a_wsgi_app_failing_mid_response_is_stored_as_a_500(database_url: str) -> None:
    """Part of the answer went out when the app raised: the client's answer is
    cut short, and the retry gets a 500, not a replay of half a response."""
    runs = 0

    def half(environ: Any, start_response: Any) -> Iterator[bytes]:
        nonlocal runs
        runs += 1
        start_response("201 Created", [("Content-Type", "text/plain")])
        yield b"x" * 70_000
        yield b"y" * 70_000
        raise RuntimeError("failed mid-response")

    first, again = _post_twice_wsgi(half, database_url, "half")
    assert first is None or len(first.content) < 140_000
    assert again.status_code == 500
    assert again.headers["idempotent-replayed"] == "true"
    assert runs == 1


def test_flask_keys_scoped_by_the_logged_in_user(shop: Shop, database_url: str) -> None:
    """environ_scope: keys belong to the user of the Flask session (a signed
    cookie whose value changes), not to a header."""
    from onceonly.contrib.flask import user_scope

    app = shop.flask_app()
    app.secret_key = "test-secret"
    app.config["SESSION_COOKIE_NAME"] = "user_session"  # the shop sets a cookie "session"

    @app.post("/login/<user>")
    def login(user: str) -> dict[str, str]:
        flask.session["user"] = user
        return {"user": user}

    store = create_store(database_url)
    app.wsgi_app = WSGIIdempotencyMiddleware(  # type: ignore[method-assign]
        app.wsgi_app,
        store=store,
        paths=[r"^/orders$"],
        environ_scope=user_scope(app, lambda: flask.session.get("user")),
    )
    same_key = {"idempotency-key": "checkout-1"}
    try:
        with live_wsgi_server(app) as url:
            with httpx.Client(base_url=url) as anonymous:
                refused = anonymous.post("/orders", json={"card": "4242"}, headers=same_key)
            with httpx.Client(base_url=url) as ana, httpx.Client(base_url=url) as bia:
                ana.post("/login/ana")
                bia.post("/login/bia")
                first = ana.post("/orders", json={"card": "4242"}, headers=same_key)
                other = bia.post("/orders", json={"card": "1881"}, headers=same_key)
                again = ana.post("/orders", json={"card": "4242"}, headers=same_key)
    finally:
        background_loop().run(store.close())
    assert refused.status_code == 400
    assert refused.json()["type"].endswith("idempotency-key-unscoped")
    assert (first.status_code, other.status_code, again.status_code) == (201, 201, 201)
    assert "4242" not in other.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content
    assert shop.runs["orders"] == 2


async def test_a_chunked_request_body_is_read_whole_and_held_to_the_limit(
    shop: Shop, database_url: str, frontend: str
) -> None:
    """No Content-Length (Transfer-Encoding: chunked): the body is read to its
    end for the fingerprint and the endpoint, and refused past the limit."""
    body = json.dumps({"sku": "A1", "pad": "x" * 50}).encode()

    async def pieces(data: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(data), 16):
            yield data[i : i + 16]

    typed = {**key("chunked"), "content-type": "application/json"}
    with serve(shop, database_url, frontend, max_request_bytes=200) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            first = await client.post("/orders", content=pieces(body), headers=typed)
            again = await client.post("/orders", content=pieces(body), headers=typed)
            big = await client.post(
                "/orders", content=pieces(body * 5), headers={**typed, "idempotency-key": "big"}
            )
    assert first.status_code == again.status_code == 201
    assert first.json()["pad"] == "x" * 50
    assert again.headers["idempotent-replayed"] == "true"
    assert big.status_code == 413
    assert shop.runs["orders"] == 1
