"""``onceonly serve``'s hot path (:mod:`onceonly.cli.protocol`) on real loopback
connections to uvicorn: deliveries skip the ASGI call, every request gets the
answer uvicorn's own protocol gives it, byte for byte, and nothing is lost or
reordered on a connection (pipelining, a body that trickles in, a client that
goes away before the commit)."""

from __future__ import annotations

import json
import socket
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from onceonly import NewEvent, Onceonly, Receipt
from onceonly.cli.protocol import HOT_BODY_BYTES, ServeProtocol, hot_receiver
from onceonly.dashboard import DashboardMount
from onceonly.events import Delivery
from onceonly.providers import Stripe
from onceonly.receiver import Receiver
from onceonly.store import Store
from onceonly.store.memory import MemoryStore
from support import STRIPE_SECRET, live_server, stripe_delivery, until_closed
from support import read_http_response as read_response

MAX_BODY_BYTES = 4096


def onceonly_app(tmp_path: Path, name: str, **options: Any) -> Onceonly:
    return Onceonly(
        database_url=f"sqlite:///{tmp_path / name}",
        providers={"stripe": Stripe(STRIPE_SECRET), "billing": Stripe.for_tenants()},
        environ={},
        max_body_bytes=MAX_BODY_BYTES,
        **options,
    )


def request(
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    method: str = "POST",
    version: str = "1.1",
) -> bytes:
    """A request as the client writes it, with a Content-Length for a body."""
    lines = [f"{method} {path} HTTP/{version}", "Host: test"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body and not any(k.lower() == "transfer-encoding" for k in headers or {}):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def delivery(event_id: str, **changes: str) -> bytes:
    """A signed delivery to /webhooks/stripe, with `changes` to its headers
    (names in any case; an empty value leaves the header out)."""
    body, headers = stripe_delivery(event_id)
    changed = {k.lower() for k in changes}
    kept = {k: v for k, v in headers.items() if k.lower() not in changed}
    return request("/webhooks/stripe", body, kept | {k: v for k, v in changes.items() if v})


def without_date(response: bytes) -> bytes:
    head, sep, body = response.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return b"\r\n".join(lines) + sep + body


def exchange(url: str, requests: Sequence[bytes], *, together: bool = False) -> list[bytes]:
    """Each request's whole response, on one connection, in order; with
    `together`, all the requests sent in one write (pipelined)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        buffer = bytearray()
        if together:
            sock.sendall(b"".join(requests))
            return [read_response(sock, buffer) for _ in requests]
        answers = []
        for one in requests:
            sock.sendall(one)
            answers.append(read_response(sock, buffer))
        return answers


def closed_after(url: str, one: bytes) -> bytes:
    """The one response to `one`, checking the server then closes the connection."""
    return until_closed(int(url.rsplit(":", 1)[1]), one)


def stored_ids(app: Onceonly) -> list[str]:
    path = app.store.url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        return [row[0] for row in conn.execute("SELECT event_id FROM onceonly_events ORDER BY id")]


@pytest.fixture
def asgi_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests the receiver served through its ASGI call."""
    calls: list[str] = []
    through_asgi = Receiver._http

    async def counted(self: Receiver, scope: Any, receive: Any, send: Any) -> None:
        calls.append(scope["path"])
        await through_asgi(self, scope, receive, send)

    monkeypatch.setattr(Receiver, "_http", counted)
    return calls


def test_deliveries_skip_the_asgi_call_and_everything_else_takes_it(
    tmp_path: Path, asgi_calls: list[str]
) -> None:
    app = onceonly_app(tmp_path, "hot.db")
    with live_server(app.asgi()) as url:
        answers = exchange(
            url,
            [
                delivery("evt_hot_1"),
                delivery("evt_hot_2"),
                delivery("evt_hot_1"),
                request("/healthz", method="GET"),
                request("/webhooks/billing/acme", b"{}"),
            ],
        )
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 404 Not Found",
    ]
    assert answers[2].endswith(b'{"received":true,"duplicate":true}')
    assert stored_ids(app) == ["evt_hot_1", "evt_hot_2"]
    # The three deliveries never reached the ASGI call; the rest did.
    assert asgi_calls == ["/healthz", "/webhooks/billing/acme"]


def _too_large_headers() -> bytes:
    return delivery("evt_big_headers", **{"X-Padding": "p" * 40_000})


def _signed(body: bytes, path: str = "/webhooks/stripe", **extra: str) -> bytes:
    headers = Stripe(STRIPE_SECRET).sign(body) | {"Content-Type": "application/json"} | extra
    return request(path, body, headers)


def _chunked(event_id: str) -> bytes:
    body, headers = stripe_delivery(event_id)
    chunks = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    return request("/webhooks/stripe", chunks, headers | {"Transfer-Encoding": "chunked"})


# Every kind of request the receiver tells apart, and the ways HTTP may carry
# one: each gets the same answer from both protocols.
CASES: dict[str, Callable[[], Sequence[bytes]]] = {
    "new, then the same again": lambda: [delivery("evt_same")] * 2,
    "wrong signature": lambda: [delivery("evt_bad", **{"Stripe-Signature": "t=1,v1=00"})],
    "no signature": lambda: [delivery("evt_unsigned", **{"Stripe-Signature": ""})],
    "stale signature": lambda: [
        request("/webhooks/stripe", *stripe_delivery("evt_stale", timestamp=1_000_000))
    ],
    "body not JSON": lambda: [_signed(b"not json")],
    "no event id": lambda: [_signed(b'{"type": "charge.succeeded"}')],
    "event id too long": lambda: [_signed(json.dumps({"id": "e" * 300}).encode())],
    "unknown provider": lambda: [_signed(b"{}", "/webhooks/nobody")],
    "provider that needs a tenant": lambda: [_signed(b"{}", "/webhooks/billing")],
    "unknown tenant": lambda: [_signed(b"{}", "/webhooks/stripe/acme")],
    "not a route": lambda: [_signed(b"{}", "/elsewhere"), _signed(b"{}", "/webhooks/")],
    "percent-encoded provider": lambda: [_signed(b'{"id": "evt_pct"}', "/webhooks/%73tripe")],
    "query string": lambda: [_signed(b'{"id": "evt_query"}', "/webhooks/stripe?x=1&y=%20")],
    "GET": lambda: [request("/webhooks/stripe", method="GET")],
    "headers over the limit": lambda: [_too_large_headers()],
    "body over the limit": lambda: [_signed(json.dumps({"id": "e", "p": "x" * 5000}).encode())],
    "chunked body": lambda: [_chunked("evt_chunked")],
    "Expect: 100-continue": lambda: [delivery("evt_expect", Expect="100-continue")],
    # What a hostile client writes: the parser's 400, or the receiver's answer.
    "a byte that is not ASCII in the path": lambda: [
        b"POST /webhooks/str\xffipe HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
    ],
    "a percent escape that is not UTF-8": lambda: [_signed(b"{}", "/webhooks/%ff")],
    "Content-Length twice": lambda: [
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: t\r\n"
        b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}"
    ],
    "Content-Length with a sign": lambda: [
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: t\r\nContent-Length: +2\r\n\r\n{}"
    ],
    "a broken query escape": lambda: [_signed(b'{"id": "evt_q"}', "/webhooks/stripe?%zz=%")],
    "an absolute URL": lambda: [_signed(b'{"id": "evt_abs"}', "http://elsewhere/webhooks/stripe")],
    "a control character in a header": lambda: [
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: t\r\nX: \x01\r\nContent-Length: 2\r\n\r\n{}"
    ],
    "health and metrics": lambda: [
        request("/healthz", method="GET"),
        request("/metrics", method="GET"),
    ],
}


def _first_lines(response: bytes) -> bytes:
    """The status line and the two headers after it (the date taken out)."""
    return b"\r\n".join(response.split(b"\r\n")[:3])


@pytest.mark.parametrize("case", CASES)
def test_the_same_answers_as_uvicorns_own_protocol(tmp_path: Path, case: str) -> None:
    answers = {}
    for protocol in (ServeProtocol, "httptools"):
        requests = CASES[case]()
        app = onceonly_app(tmp_path, f"{protocol!s:.9}.db", metrics=True)
        with live_server(app.asgi(), http=protocol) as url:
            answers[protocol] = [without_date(a) for a in exchange(url, requests)]
        if protocol is ServeProtocol:
            stored = stored_ids(app)
        else:
            assert stored_ids(app) == stored, "the two stored different events"
    hot, plain = answers[ServeProtocol], answers["httptools"]
    if case == "health and metrics":
        # The metrics' text differs in its timings: compare the status and type.
        hot, plain = [_first_lines(a) for a in hot], [_first_lines(a) for a in plain]
    assert hot == plain


@pytest.mark.parametrize(
    ("case", "version", "headers"),
    [
        ("HTTP/1.0", "1.0", {}),
        ("Connection: close", "1.1", {"Connection": "close"}),
    ],
)
def test_a_client_that_asks_to_close_gets_its_answer_then_the_close(
    tmp_path: Path, case: str, version: str, headers: dict[str, str]
) -> None:
    answers = {}
    for protocol in (ServeProtocol, "httptools"):
        app = onceonly_app(tmp_path, f"{protocol!s:.9}-close.db")
        body, signed = stripe_delivery("evt_close")
        one = request("/webhooks/stripe", body, signed | headers, version=version)
        with live_server(app.asgi(), http=protocol) as url:
            answers[protocol] = without_date(closed_after(url, one))
        assert stored_ids(app) == ["evt_close"]
    assert b"connection: close\r\n" in answers[ServeProtocol], case
    assert answers[ServeProtocol] == answers["httptools"]


class _Broken(Stripe):
    def verify(self, delivery: Delivery) -> None:
        raise RuntimeError("a bug in the provider")


@pytest.mark.parametrize("first", ["Connection: close", "a 500"])
def test_nothing_pipelined_behind_an_answer_that_closes_is_served(
    tmp_path: Path, first: str
) -> None:
    """A request answered at once with the connection's end (refused with
    ``Connection: close``, or a 500), then a valid delivery in the same write:
    that answer, the close, and the delivery neither answered nor stored, as
    with uvicorn's own protocol."""
    body, headers = stripe_delivery("evt_after_close")
    after = request("/webhooks/stripe", body, headers)
    if first == "a 500":
        closing = _signed(b'{"id": "evt_bug"}', "/webhooks/broken")
    else:
        closing = delivery(
            "evt_refused", **{"Stripe-Signature": "t=1,v1=00", "Connection": "close"}
        )
    answers = {}
    for protocol in (ServeProtocol, "httptools"):
        app = Onceonly(
            database_url=f"sqlite:///{tmp_path / f'{protocol!s:.9}-after-close.db'}",
            providers={"stripe": Stripe(STRIPE_SECRET), "broken": _Broken(STRIPE_SECRET)},
            environ={},
        )
        with live_server(app.asgi(), http=protocol) as url:
            answers[protocol] = without_date(closed_after(url, closing + after))
        assert stored_ids(app) == []
    assert answers[ServeProtocol].count(b"HTTP/1.1") == 1
    assert answers[ServeProtocol] == answers["httptools"]


def test_pipelined_requests_are_answered_in_order(tmp_path: Path, asgi_calls: list[str]) -> None:
    """Requests sent in one write, deliveries and others mixed: each answer
    waits for the one before it, whichever path either took."""
    app = onceonly_app(tmp_path, "pipelined.db")
    requests = [
        delivery("evt_pipe_1"),
        delivery("evt_pipe_2"),
        request("/healthz", method="GET"),
        delivery("evt_pipe_1"),
        delivery("evt_pipe_bad", **{"Stripe-Signature": "t=1,v1=00"}),
        delivery("evt_pipe_3"),
    ]
    with live_server(app.asgi()) as url:
        answers = exchange(url, requests, together=True)
    bodies = [a.partition(b"\r\n\r\n")[2] for a in answers]
    assert bodies[0] == bodies[1] == bodies[5] == b'{"received":true,"duplicate":false}'
    assert bodies[2] == b'{"status":"ok"}'
    assert bodies[3] == b'{"received":true,"duplicate":true}'
    assert answers[4].startswith(b"HTTP/1.1 401 ")
    assert stored_ids(app) == ["evt_pipe_1", "evt_pipe_2", "evt_pipe_3"]
    # The first went by the hot path; the rest waited behind it on uvicorn's.
    assert len(asgi_calls) == 5


def test_a_connection_closes_once_idle_for_the_keep_alive_timeout(tmp_path: Path) -> None:
    """Counted from the last answer, not the first: a connection in use stays
    open, an idle one is closed, whichever path answered last."""
    app = onceonly_app(tmp_path, "idle.db")
    with live_server(app.asgi(), timeout_keep_alive=1) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            buffer = bytearray()
            for n in range(4):  # 1.8 s in all, never 1 s idle
                sock.sendall(delivery(f"evt_idle_{n}"))
                assert read_response(sock, buffer).startswith(b"HTTP/1.1 200 OK")
                time.sleep(0.6)
            sock.sendall(request("/healthz", method="GET"))  # uvicorn's path, then idle
            assert read_response(sock, buffer).startswith(b"HTTP/1.1 200 OK")
            sock.sendall(delivery("evt_idle_last"))  # the hot path, then idle
            assert read_response(sock, buffer).startswith(b"HTTP/1.1 200 OK")
            began = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server
            assert 0.8 < time.monotonic() - began < 5
    assert len(stored_ids(app)) == 5


def test_a_body_that_arrives_later_is_read_by_uvicorns_path(
    tmp_path: Path, asgi_calls: list[str]
) -> None:
    app = onceonly_app(tmp_path, "trickled.db")
    whole = delivery("evt_trickled")
    head, _, body = whole.partition(b"\r\n\r\n")
    with live_server(app.asgi()) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head + b"\r\n\r\n" + body[:10])
            time.sleep(0.2)
            sock.sendall(body[10:])
            answer = read_response(sock, bytearray())
    assert answer.endswith(b'{"received":true,"duplicate":false}')
    assert stored_ids(app) == ["evt_trickled"]
    assert asgi_calls == ["/webhooks/stripe"]


def test_a_body_over_the_hot_paths_size_goes_through_asgi(
    tmp_path: Path, asgi_calls: list[str]
) -> None:
    app = Onceonly(
        database_url=f"sqlite:///{tmp_path / 'large.db'}",
        providers={"stripe": Stripe(STRIPE_SECRET)},
        environ={},
    )
    padding = {"padding": "x" * HOT_BODY_BYTES}
    body, headers = stripe_delivery("evt_large", extra=padding)
    with live_server(app.asgi()) as url:
        (answer,) = exchange(url, [request("/webhooks/stripe", body, headers)])
    assert answer.endswith(b'{"received":true,"duplicate":false}')
    assert asgi_calls == ["/webhooks/stripe"]


class _SlowStore(MemoryStore):
    """Commits after `delay` seconds, so a client can leave before the answer."""

    delay = 0.5

    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        import asyncio

        await asyncio.sleep(self.delay)
        return await super().insert_events(events)


class _BrokenStore(MemoryStore):
    """A store whose commit fails with an error that is not a store error: a bug."""

    async def insert_events(self, events: Sequence[NewEvent]) -> list[Receipt]:
        raise RuntimeError("a bug in the store")


def with_store(store: Store) -> Onceonly:
    class WithStore(Onceonly):
        @property
        def store(self) -> Store:
            return store

    return WithStore(providers={"stripe": Stripe(STRIPE_SECRET)}, environ={})


def test_a_client_gone_before_the_commit_leaves_its_event_stored(
    asgi_calls: list[str],
) -> None:
    store = _SlowStore()
    app = with_store(store)
    with live_server(app.asgi()) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(delivery("evt_left"))
        # Gone before the commit: the event is stored all the same, and the
        # server goes on answering.
        time.sleep(store.delay + 0.3)
        (answer,) = exchange(url, [delivery("evt_left")])
    assert answer.endswith(b'{"received":true,"duplicate":true}')
    assert asgi_calls == []


def test_an_error_that_is_a_bug_is_a_500_and_a_closed_connection_both_ways() -> None:
    answers = {}
    for protocol in (ServeProtocol, "httptools"):
        app = with_store(_BrokenStore())
        with live_server(app.asgi(), http=protocol) as url:
            answers[protocol] = without_date(closed_after(url, delivery("evt_bug")))
    assert answers[ServeProtocol].startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert answers[ServeProtocol] == answers["httptools"]


def test_a_provider_that_raises_is_a_500_too(tmp_path: Path) -> None:
    answers = {}
    for protocol in (ServeProtocol, "httptools"):
        app = Onceonly(
            database_url=f"sqlite:///{tmp_path / f'{protocol!s:.9}-broken.db'}",
            providers={"stripe": _Broken(STRIPE_SECRET)},
            environ={},
        )
        with live_server(app.asgi(), http=protocol) as url:
            answers[protocol] = without_date(closed_after(url, delivery("evt_raise")))
    assert answers[ServeProtocol].startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert answers[ServeProtocol] == answers["httptools"]


def test_only_the_receiver_itself_or_known_wrappers_are_hot(tmp_path: Path) -> None:
    app = onceonly_app(tmp_path, "wrapped.db")
    receiver = app.asgi()
    mounted = DashboardMount(receiver, app.dashboard(), "/dashboard")
    proxied = ProxyHeadersMiddleware(mounted)  # type: ignore[arg-type]
    assert hot_receiver(receiver, "/webhooks/stripe") is receiver
    assert hot_receiver(proxied, "/webhooks/stripe") is receiver
    # The dashboard's paths are the dashboard's.
    assert hot_receiver(proxied, "/dashboard") is None
    assert hot_receiver(proxied, "/dashboard/events") is None
    assert hot_receiver(proxied, "/dashboardx") is receiver

    async def other(scope: Any, receive: Any, send: Any) -> None:
        """Any other app or middleware may look at what it is handed."""

    assert hot_receiver(other, "/webhooks/stripe") is None


def test_serve_runs_this_protocol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`onceonly serve` hands uvicorn this protocol (uvicorn's run is replaced
    by a recorder here: the protocol itself is tested over real sockets above,
    and the receive benchmark measures it in the real server)."""
    import sys

    import uvicorn
    from click.testing import CliRunner

    from onceonly.cli import main

    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: runs.append(options))
    interval = sys.getswitchinterval()  # serve sets it for its own process
    try:
        result = CliRunner().invoke(
            main,
            ["serve", "--database-url", f"sqlite:///{tmp_path / 'onceonly.db'}"],
            env={"ONCEONLY_APP": None, "ONCEONLY_STRIPE_SECRET": STRIPE_SECRET},
        )
    finally:
        sys.setswitchinterval(interval)
    assert result.exit_code == 0, result.output
    [options] = runs
    assert options["http"] is ServeProtocol
