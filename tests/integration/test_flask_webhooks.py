"""Webhooks received in a Flask view (onceonly.contrib.flask.webhook_view) on a
real WSGI server (waitress), answered exactly as ``onceonly serve``'s receiver
answers the same requests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import flask
import httpx
import pytest

from onceonly import Onceonly
from onceonly._threads import background_loop
from onceonly.contrib.flask import webhook_view
from onceonly.providers import Stripe
from ports import free_port
from support import STRIPE_SECRET, live_server, live_wsgi_server, stripe_delivery


@contextlib.contextmanager
def flask_receiver(onceonly: Onceonly) -> Iterator[str]:
    app = flask.Flask("shop")
    app.add_url_rule("/webhooks/<provider>", view_func=webhook_view(onceonly), methods=["POST"])
    try:
        with live_wsgi_server(app) as url:
            yield url
    finally:
        background_loop().run(onceonly.store.close())


def deployment(database_url: str, **settings: int) -> Onceonly:
    return Onceonly(
        database_url=database_url,
        providers={"stripe": Stripe(STRIPE_SECRET)},
        environ={},
        **settings,  # type: ignore[arg-type]
    )


def _requests() -> list[tuple[str, bytes, dict[str, str]]]:
    """One of each answer: new, duplicate, forged, unknown provider, no event
    id, over the body limit."""
    body, headers = stripe_delivery("evt_same_1")
    no_id = json.dumps({"object": "event", "type": "x"}).encode()
    return [
        ("stripe", body, headers),
        ("stripe", body, headers),
        ("stripe", body.replace(b"evt_same_1", b"evt_forged"), headers),
        ("paypal", body, headers),
        ("stripe", *stripe_delivery("evt_big", extra={"pad": "x" * 3000})),
        ("stripe", no_id, Stripe(STRIPE_SECRET).sign(no_id)),
    ]


def _answer(response: httpx.Response) -> tuple[int, str, object, str | None]:
    return (
        response.status_code,
        response.headers["content-type"],
        response.json(),
        response.headers.get("onceonly-duplicate"),
    )


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_the_view_answers_every_delivery_as_onceonly_serve_does(
    database_url: str, tmp_path: object
) -> None:
    other_url = database_url.replace("onceonly.db", "serve.db")
    answers: dict[str, list[tuple[int, str, object, str | None]]] = {}
    served = deployment(other_url, max_body_bytes=2048)
    with live_server(served.asgi()) as url:
        answers["serve"] = [
            _answer(httpx.post(f"{url}/webhooks/{p}", content=b, headers=h))
            for p, b, h in _requests()
        ]
    with flask_receiver(deployment(database_url, max_body_bytes=2048)) as url:
        answers["flask"] = [
            _answer(httpx.post(f"{url}/webhooks/{p}", content=b, headers=h))
            for p, b, h in _requests()
        ]
    assert [a[0] for a in answers["serve"]] == [200, 200, 401, 404, 413, 400]
    assert answers["flask"] == answers["serve"]


@pytest.mark.parametrize("engine", ["sqlite"], indirect=True)
def test_a_chunked_body_is_read_and_one_over_the_limit_refused(database_url: str) -> None:
    body, headers = stripe_delivery("evt_chunked")
    big, big_headers = stripe_delivery("evt_chunked_big", extra={"pad": "x" * 3000})
    with flask_receiver(deployment(database_url, max_body_bytes=2048)) as url:
        # A generator body goes out with Transfer-Encoding: chunked, no length.
        ok = httpx.post(f"{url}/webhooks/stripe", content=iter([body[:10], body[10:]]),
                        headers=headers)  # fmt: skip
        refused = httpx.post(
            f"{url}/webhooks/stripe", content=iter([big[:1000], big[1000:]]), headers=big_headers
        )
    assert ok.status_code == 200, ok.text
    assert ok.json() == {"received": True, "duplicate": False}
    assert refused.status_code == 413
    assert refused.headers["content-type"] == "application/problem+json"


def test_the_database_down_is_503_with_retry_after() -> None:
    closed = free_port()  # nothing listens there
    onceonly = deployment(f"postgresql://postgres@127.0.0.1:{closed}/none")
    body, headers = stripe_delivery("evt_down")
    with flask_receiver(onceonly) as url:
        response = httpx.post(f"{url}/webhooks/stripe", content=body, headers=headers, timeout=30)
    assert response.status_code == 503
    assert response.headers["retry-after"] == str(onceonly.settings.receiver.retry_after)
    assert response.headers["content-type"] == "application/problem+json"
