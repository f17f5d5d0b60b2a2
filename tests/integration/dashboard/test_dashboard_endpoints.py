"""The dashboard's pages, JSON endpoints and actions over real HTTP, on both engines."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from onceonly import Event, NewEvent, Onceonly, create_store
from onceonly.dashboard import DashboardMount
from onceonly.dashboard.access import COOKIE_NAME
from onceonly.providers import Stripe
from support import STRIPE_SECRET, live_server, stripe_delivery

TOKEN = "dashboard-token-0123456789"
BEARER = {"authorization": f"Bearer {TOKEN}"}
CARD = "4111111111111111"


def deployment(database_url: str, *, token: str | None = TOKEN) -> Onceonly:
    app = Onceonly(
        database_url,
        {"stripe": Stripe(STRIPE_SECRET), "shop": Stripe(STRIPE_SECRET)},
        environ={},
        max_attempts=1,
        dashboard_token=token,
        dashboard_redact="data.card.number",
    )

    @app.handler("stripe", "charge.failed")
    def decline(event: Event, ctx: object) -> None:
        raise RuntimeError("declined by <b>upstream</b>")

    return app


@contextmanager
def serving(app: Onceonly) -> Iterator[str]:
    """The receiver with the dashboard at /dashboard, as `onceonly serve` composes them."""
    with live_server(DashboardMount(app.asgi(), app.dashboard(), "/dashboard")) as url:
        yield url


def deliver(
    url: str,
    event_id: str,
    *,
    provider: str = "stripe",
    event_type: str = "payment_intent.succeeded",
    extra: dict[str, object] | None = None,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body, signed = stripe_delivery(event_id, event_type=event_type, extra=extra)
    response = httpx.post(
        f"{url}/webhooks/{provider}", content=body, headers={**signed, **(headers or {})}
    )
    assert response.status_code == 200, response.text
    return response


def shown_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'data-event-row="(\d+)"', html)]


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, "no CSRF field on the page"
    return match[1]


@contextmanager
def signed_in(url: str) -> Iterator[httpx.Client]:
    """A client signed in through the login form (it holds the cookie)."""
    with httpx.Client(base_url=url) as client:
        response = client.post("/dashboard/login", data={"token": TOKEN, "next": "/dashboard/"})
        assert response.status_code == 303
        yield client


def count_cell(html: str, key: str) -> str:
    match = re.search(rf'data-count="{re.escape(key)}">([^<]*)<', html)
    assert match, key
    return match[1]


@pytest.fixture
def app(database_url: str) -> Onceonly:
    return deployment(database_url)


def ids_by_event(client: httpx.Client) -> dict[str, int]:
    rows = client.get("/dashboard/api/events", headers=BEARER).json()
    return {row["event_id"]: row["id"] for row in rows}


def test_counts_by_provider_and_status_with_duplicates(app: Onceonly) -> None:
    with serving(app) as url:
        deliver(url, "evt_ok")
        deliver(url, "evt_declined", event_type="charge.failed")
        assert deliver(url, "evt_ok").headers["onceonly-duplicate"] == "true"
        assert deliver(url, "evt_ok").headers["onceonly-duplicate"] == "true"
        app.worker(concurrency=1).run_until_idle()
        deliver(url, "evt_shop", provider="shop")

        counts = httpx.get(f"{url}/dashboard/api/counts", headers=BEARER).json()
        assert counts["total"] == 3
        assert counts["by_status"]["processed"] == 1
        assert counts["by_status"]["dead"] == 1
        assert counts["by_status"]["pending"] == 1
        assert counts["by_provider"]["stripe"]["dead"] == 1
        assert counts["by_provider"]["shop"]["pending"] == 1
        assert counts["duplicates"] == {"total": 2, "by_provider": {"shop": 0, "stripe": 2}}

        with signed_in(url) as client:
            html = client.get("/dashboard/").text
        assert count_cell(html, "stripe|processed") == "1"
        assert count_cell(html, "stripe|dead") == "1"
        assert count_cell(html, "shop|pending") == "1"
        assert count_cell(html, "*|duplicates") == "2"
        assert "evt_declined" in html  # the dead list


def test_the_event_list_filters_by_provider_status_and_type(app: Onceonly) -> None:
    with serving(app) as url:
        deliver(url, "evt_paid")
        deliver(url, "evt_declined", event_type="charge.failed")
        app.worker(concurrency=1).run_until_idle()
        deliver(url, "evt_shop", provider="shop", event_type="orders/create")
        with signed_in(url) as client:
            ids = ids_by_event(client)
            by_status = client.get("/dashboard/events", params={"status": "dead"}).text
            assert shown_ids(by_status) == [ids["evt_declined"]]
            by_provider = client.get("/dashboard/events", params={"provider": "shop"}).text
            assert shown_ids(by_provider) == [ids["evt_shop"]]
            by_type = client.get(
                "/dashboard/events", params={"type": "payment_intent.succeeded"}
            ).text
            assert shown_ids(by_type) == [ids["evt_paid"]]
            everything = client.get("/dashboard/events").text
            assert shown_ids(everything) == sorted(ids.values(), reverse=True)
            nothing = client.get("/dashboard/events", params={"provider": "shop", "status": "dead"})
            assert shown_ids(nothing.text) == []


def test_the_event_page_shows_attempts_and_a_redacted_escaped_payload(app: Onceonly) -> None:
    with serving(app) as url:
        deliver(
            url,
            "evt_<script>alert(1)</script>",
            event_type="charge.failed",
            extra={"card": {"number": CARD, "brand": "visa"}, "note": "<img src=x onerror=1>"},
            headers={
                "cookie": "session=s3cr3t-session",
                "authorization": "Basic dXNlcjpwYXNz",
                "user-agent": "<b>bold</b>",
                "x-shop-note": "<i>not stored</i>",
            },
        )
        app.worker(concurrency=1).run_until_idle()
        with signed_in(url) as client:
            (pk,) = ids_by_event(client).values()
            page = client.get(f"/dashboard/events/{pk}")
        html = page.text
        assert page.status_code == 200
        assert "script-src 'self'" in page.headers["content-security-policy"]
        # Attempts and the last error, escaped like everything else.
        assert 'id="event-status" class="status status-dead">dead<' in html
        assert "RuntimeError: declined by &lt;b&gt;upstream&lt;/b&gt;" in html
        assert "<b>upstream" not in html
        assert html.count("<tr>", html.index('id="attempts"')) >= 2  # header + one attempt
        # Attacker-controlled text is shown as text.
        assert "evt_&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<script>alert" not in html
        assert "&lt;img src=x onerror=1&gt;" in html
        assert "<img src=x" not in html
        assert "&lt;b&gt;bold&lt;/b&gt;" in html
        # Headers no verification or debugging needs were never stored.
        assert "x-shop-note" not in html
        assert "not stored" not in html
        # Secrets: credential headers are never stored; the signature and the
        # configured field are hidden.
        assert CARD not in html
        assert "s3cr3t-session" not in html
        assert "<th>cookie</th>" not in html
        assert "dXNlcjpwYXNz" not in html
        assert "<th>authorization</th>" not in html
        assert '<th>stripe-signature</th><td class="redacted">[redacted]</td>' in html
        assert html.count("[redacted]") >= 2  # the signature and the card number
        assert "visa" in html  # fields not configured stay visible


def test_replay_needs_the_csrf_token_and_the_same_origin(app: Onceonly) -> None:
    with serving(app) as url:
        deliver(url, "evt_declined", event_type="charge.failed")
        app.worker(concurrency=1).run_until_idle()
        with signed_in(url) as client:
            pk = ids_by_event(client)["evt_declined"]

            def status() -> str:
                return str(client.get(f"/dashboard/api/events/{pk}").json()["status"])

            csrf = csrf_of(client.get(f"/dashboard/events/{pk}").text)
            replay = f"/dashboard/events/{pk}/replay"
            assert client.post(replay, data={}).status_code == 403
            assert client.post(replay, data={"csrf": "0" * 64}).status_code == 403
            cross_site = client.post(
                replay, data={"csrf": csrf}, headers={"origin": "http://evil.example"}
            )
            assert cross_site.status_code == 403
            assert status() == "dead"

            done = client.post(replay, data={"csrf": csrf, "next": "//evil.example/"})
            assert done.status_code == 303
            assert done.headers["location"] == f"/dashboard/events/{pk}?notice=replayed"
            assert status() == "pending"
            again = client.post(replay, data={"csrf": csrf})
            assert again.headers["location"].endswith("notice=not-replayable")

            # A script with the bearer token needs no CSRF token (browsers never
            # send that header on their own).
            app.worker(concurrency=1).run_until_idle()
            assert status() == "dead"
        scripted = httpx.post(f"{url}/dashboard/replay-dead", headers=BEARER)
        assert scripted.json() == {"replayed": [pk]}


def test_every_page_and_action_needs_the_token(app: Onceonly) -> None:
    with serving(app) as url:
        deliver(url, "evt_private")
        with httpx.Client(base_url=url) as anonymous:
            page = anonymous.get("/dashboard/events")
            assert page.status_code == 401
            assert 'name="token"' in page.text
            assert "evt_private" not in page.text
            api = anonymous.get("/dashboard/api/counts")
            assert api.status_code == 401
            assert api.headers["www-authenticate"].startswith("Bearer")
            guessed = {"authorization": "Bearer " + "x" * len(TOKEN)}
            assert anonymous.get("/dashboard/api/counts", headers=guessed).status_code == 401
            assert anonymous.post("/dashboard/replay-dead").status_code == 401

            wrong = anonymous.post("/dashboard/login", data={"token": TOKEN + "x"})
            assert wrong.status_code == 401
            assert "set-cookie" not in wrong.headers

            right = anonymous.post(
                "/dashboard/login", data={"token": TOKEN, "next": "https://evil.example/"}
            )
            assert right.status_code == 303
            assert right.headers["location"] == "/dashboard/"  # no open redirect
            cookie = right.headers["set-cookie"].lower()
            for attribute in ("httponly", "samesite=strict", "path=/dashboard/"):
                assert attribute in cookie
            assert TOKEN.lower() not in cookie
            assert "evt_private" in anonymous.get("/dashboard/events").text  # now signed in


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, True),
        ({"host": "localhost"}, True),
        # A proxy on this machine forwarding a remote client (uvicorn trusts
        # X-Forwarded-For from 127.0.0.1): not local.
        ({"x-forwarded-for": "203.0.113.7"}, False),
        # DNS rebinding: the browser is local, the name it asked for is not.
        ({"host": "evil.example"}, False),
    ],
)
def test_without_a_token_only_loopback_clients_get_in(
    database_url: str, headers: dict[str, str], allowed: bool
) -> None:
    app = deployment(database_url, token=None)
    with serving(app) as url:
        deliver(url, "evt_local")
        response = httpx.get(f"{url}/dashboard/events", headers=headers)
        api = httpx.get(f"{url}/dashboard/api/counts", headers=headers)
    if allowed:
        assert response.status_code == 200
        assert "evt_local" in response.text
        assert api.json()["total"] == 1
    else:
        assert response.status_code == 403
        assert "evt_local" not in response.text
        assert "ONCEONLY_DASHBOARD_TOKEN" in response.text
        assert api.status_code == 403


@pytest.mark.parametrize(
    "query",
    [
        "before=" + "9" * 5000,
        "before=99999999999999999999",
        "limit=" + "9" * 40,
        "before=%C2%B2",  # a superscript two: a digit to str.isdigit(), not to int()
        "provider=%00",
        "type=" + "x" * 5000,
    ],
)
def test_hostile_query_strings_get_a_400_never_a_500(app: Onceonly, query: str) -> None:
    with serving(app) as url:
        deliver(url, "evt_ok")
        for path in ("/dashboard/events", "/dashboard/api/events"):
            response = httpx.get(f"{url}{path}?{query}", headers=BEARER)
            assert response.status_code == 400, (path, response.status_code)
        huge = httpx.get(f"{url}/dashboard/api/events/{2**70}", headers=BEARER)
        assert huge.status_code == 404
        page = httpx.get(f"{url}/dashboard/events/{2**64}", headers=BEARER)
        assert page.status_code == 404


def test_a_payload_nested_100000_deep_renders(app: Onceonly) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000

    async def store_it() -> int:
        async with create_store(app.database_url) as store:
            (receipt,) = await store.insert_events(
                [NewEvent("stripe", "evt_deep", "x", deep, {"content-type": "application/json"})]
            )
            assert receipt.id is not None
            return receipt.id

    pk = asyncio.run(store_it())
    with serving(app) as url:
        page = httpx.get(f"{url}/dashboard/events/{pk}", headers=BEARER)
        assert page.status_code == 200
        assert "evt_deep" in page.text
        # Fields are configured to be hidden, and cannot be found in it: not shown.
        assert "[[[[" not in page.text
        assert httpx.get(f"{url}/dashboard/api/events/{pk}", headers=BEARER).status_code == 200


def test_logout_ends_the_session_on_every_receiver_and_sessions_expire(app: Onceonly) -> None:
    """A copied cookie (a shared machine, a stolen one) dies with logout, on
    every receiver of the database, and an expired session is refused by the
    server whatever the browser still sends."""
    other = deployment(app.database_url)  # a second receiver, same database
    with serving(app) as url, serving(other) as url_b:
        deliver(url, "evt_session")
        with signed_in(url) as client:
            cookie = client.cookies.get("onceonly_dashboard")
            assert cookie
            copied = {"cookie": f"onceonly_dashboard={cookie}"}
            assert httpx.get(f"{url}/dashboard/events", headers=copied).status_code == 200
            assert httpx.get(f"{url_b}/dashboard/events", headers=copied).status_code == 200
            page = client.get("/dashboard/events")
            out = client.post("/dashboard/logout", data={"csrf": csrf_of(page.text)})
            assert out.status_code == 303
        for base in (url, url_b):
            assert httpx.get(f"{base}/dashboard/events", headers=copied).status_code == 401

        with signed_in(url) as client:
            assert client.get("/dashboard/events").status_code == 200
            with app.engine.begin() as conn:
                conn.execute(sa.text("UPDATE onceonly_dashboard_sessions SET expires_at = 0"))
            assert client.get("/dashboard/events").status_code == 401


def test_a_database_that_is_away_is_a_503_page_or_json(engine: str, tmp_path: Path) -> None:
    # Nothing answers there: SQLite cannot open a directory as its file.
    url = (
        "postgresql://postgres@127.0.0.1:9/none"
        if engine == "postgresql"
        else f"sqlite:///{tmp_path}"
    )
    app = deployment(url)
    dashboard = app.dashboard()
    with live_server(dashboard) as base, httpx.Client(base_url=base) as client:
        # The bearer token needs no database: the page's read fails.
        response = client.get("/api/counts", headers=BEARER)
        assert response.status_code == 503
        assert response.json() == {"error": "database not reachable"}
        # A login cookie is checked against its session row: that read fails.
        cookie = {"cookie": f"{COOKIE_NAME}={dashboard.access.session_cookie('s-1')}"}
        response = client.get("/events", headers=cookie)
        assert response.status_code == 503
        assert "Database not reachable" in response.text


def test_the_object_search_lists_every_provider_s_events_of_one_object(app: Onceonly) -> None:
    with serving(app) as url:
        deliver(url, "evt_paid", extra={"object": {"id": "pi_same"}})
        deliver(url, "evt_shop_paid", provider="shop", extra={"object": {"id": "pi_same"}})
        deliver(url, "evt_other", extra={"object": {"id": "pi_other"}})
        with httpx.Client(base_url=url, headers=BEARER) as client:
            ids = ids_by_event(client)
            page = client.get("/dashboard/events", params={"object_id": " pi_same "})
            api = client.get("/dashboard/api/events", params={"object_id": "pi_same"}).json()
            detail = client.get(f"/dashboard/events/{ids['evt_paid']}").text
            none = client.get("/dashboard/events", params={"object_id": "pi_sam"}).text
    assert page.status_code == 200
    assert shown_ids(page.text) == [ids["evt_shop_paid"], ids["evt_paid"]]
    assert 'value="pi_same"' in page.text  # the search box keeps what was searched
    assert [(row["event_id"], row["object_id"]) for row in api] == [
        ("evt_shop_paid", "pi_same"),
        ("evt_paid", "pi_same"),
    ]
    # The event page links its object to that search.
    assert 'href="/dashboard/events?object_id=pi_same"' in detail
    assert shown_ids(none) == []
    assert 'id="no-match"' in none


def test_the_activity_chart_and_its_json_count_this_minute_s_events(app: Onceonly) -> None:
    with serving(app) as url:
        deliver(url, "evt_ok")
        assert deliver(url, "evt_ok").headers["onceonly-duplicate"] == "true"
        deliver(url, "evt_declined", event_type="charge.failed")
        app.worker(concurrency=1).run_until_idle()
        with httpx.Client(base_url=url, headers=BEARER) as client:
            activity = client.get("/dashboard/api/activity", params={"minutes": "5"}).json()
            overview = client.get("/dashboard/", params={"minutes": "5"}, headers={"accept": ""})
            default = client.get("/dashboard/api/activity").json()
            hostile = {
                value: client.get("/dashboard/api/activity", params={"minutes": value})
                for value in ("0", "1441", "-1", "1e3", "²", "9" * 40, "abc")
            }
            page_400 = client.get("/dashboard/", params={"minutes": "0"}, headers={"accept": ""})
    series = activity["series"]
    assert activity["minutes"] == len(series) == 5
    assert default["minutes"] == 60
    # The minute may have turned between the deliveries: sum over the window.
    totals = {k: sum(m[k] for m in series) for k in ("received", "processed", "failed")}
    assert totals == {"received": 2, "processed": 1, "failed": 1}
    assert sum(m["duplicates"] for m in series) == 1
    lags = [m["lag_max"] for m in series if m["processed"]]
    assert len(lags) == 1
    assert 0 <= lags[0] < 60
    assert activity["oldest_pending_age"] == 0
    html = overview.text
    assert overview.status_code == 200
    for name in ("received", "duplicates", "processed", "failed"):
        assert f'data-series="{name}" data-points="5"' in html
    assert html.count("<tr data-minute=") == 5
    for value, response in hostile.items():
        assert response.status_code == 400, value
        assert response.headers["content-type"] == "application/problem+json", value
        assert response.json()["status"] == 400
    assert page_400.status_code == 400
