"""Dashboard rules that need no server: redaction, access, configuration, mounting."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
from starlette.requests import Request

from onceonly import ConfigurationError, Onceonly
from onceonly.asgi import Message, Receive, Scope, Send
from onceonly.dashboard import Access, DashboardMount, Redactor, for_serve, is_loopback_host
from onceonly.dashboard.redaction import REDACTED

# Redaction.


def test_credential_headers_are_always_hidden() -> None:
    shown = Redactor().headers(
        {
            "Stripe-Signature": "t=1,v1=abc",
            "x-hub-signature-256": "sha256=abc",
            "authorization": "Bearer sk_live",
            "cookie": "session=1",
            "asaas-access-token": "tok",
            "x-shopify-hmac-sha256": "mac",
            "x-webhook-secret": "s",
            "content-type": "application/json",
            "user-agent": "Stripe/1.0",
        }
    )
    hidden = {h.name for h in shown if h.redacted}
    assert hidden == {
        "Stripe-Signature",
        "x-hub-signature-256",
        "authorization",
        "cookie",
        "asaas-access-token",
        "x-shopify-hmac-sha256",
        "x-webhook-secret",
    }
    assert all(h.value == REDACTED for h in shown if h.redacted)
    assert {h.name: h.value for h in shown}["user-agent"] == "Stripe/1.0"


def test_configured_json_fields_are_hidden_through_objects_and_lists() -> None:
    body = json.dumps(
        {
            "card": {"number": "4242", "brand": "visa"},
            "payer": {"email": "a@b.c", "name": "Ana"},
            "items": [{"card": {"number": "1111"}}, {"card": {"number": "2222"}}, "x"],
            "meta": {"one": {"token": "t1"}, "two": {"token": "t2"}},
        }
    ).encode()
    redactor = Redactor(["card.number", "payer.email", "items.card.number", "meta.*.token"])
    shown = redactor.body(body, "application/json")
    data = json.loads(shown.text)
    assert shown.kind == "json"
    assert shown.redacted == 6
    assert data["card"] == {"number": REDACTED, "brand": "visa"}
    assert data["payer"] == {"email": REDACTED, "name": "Ana"}
    assert data["items"] == [{"card": {"number": REDACTED}}, {"card": {"number": REDACTED}}, "x"]
    assert data["meta"] == {"one": {"token": REDACTED}, "two": {"token": REDACTED}}


def test_a_path_that_is_not_there_changes_nothing() -> None:
    body = b'{"card": "4242", "list": [1, 2]}'
    shown = Redactor(["card.number", "list.x", "absent"]).body(body)
    assert json.loads(shown.text) == {"card": "4242", "list": [1, 2]}
    assert shown.redacted == 0


def test_form_bodies_are_redacted_by_field_name() -> None:
    shown = Redactor(["notificationCode"]).body(
        b"notificationCode=ABC-123&notificationType=transaction",
        "application/x-www-form-urlencoded; charset=utf-8",
    )
    assert shown.kind == "form"
    assert shown.text == f"notificationCode={REDACTED}\nnotificationType=transaction"


def test_other_bodies_are_shown_as_they_are() -> None:
    assert Redactor(["a"]).body(b"<xml>a</xml>", "application/xml").kind == "text"
    binary = Redactor().body(b"\xff\xfe\x00", None)
    assert binary.kind == "binary"
    assert base64.b64decode(binary.text) == b"\xff\xfe\x00"
    assert Redactor().body(None).kind == "empty"


# Access.


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback


def _request(client: str | None = "127.0.0.1", headers: dict[str, str] | None = None) -> Request:
    scope: Scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "headers": [(k.encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": (client, 5000) if client else None,
    }
    return Request(scope)


@pytest.mark.parametrize(
    ("client", "host", "local"),
    [
        ("127.0.0.1", "127.0.0.1:8000", True),
        ("127.0.0.1", "localhost:8000", True),
        ("::1", "[::1]:8000", True),
        ("10.0.0.5", "127.0.0.1:8000", False),  # a remote client
        ("127.0.0.1", "attacker.example:8000", False),  # DNS rebinding
        (None, "127.0.0.1:8000", False),  # the server could not tell
    ],
)
def test_without_a_token_only_local_requests_are_allowed(
    client: str | None, host: str, local: bool
) -> None:
    access = Access(None)
    assert access.allowed(_request(client, {"host": host})) is local


def test_with_a_token_anyone_may_reach_the_login_but_only_the_token_opens() -> None:
    access = Access("t" * 20)
    remote = _request("203.0.113.9", {"host": "ops.example.com"})
    assert access.allowed(remote)
    assert not access.bearer(remote)
    assert access.bearer(_request(headers={"authorization": "Bearer " + "t" * 20}))
    assert access.bearer(_request(headers={"authorization": "bearer " + "t" * 20}))
    assert not access.bearer(_request(headers={"authorization": "Bearer " + "t" * 19}))
    assert not access.bearer(_request(headers={"authorization": "Basic " + "t" * 20}))


def test_a_session_cookie_names_its_session_only_with_the_right_hmac() -> None:
    access = Access("t" * 20)
    cookie = access.session_cookie("abc123")
    assert "t" * 20 not in cookie  # never the token
    assert access.session_id(_request(headers={"cookie": f"onceonly_dashboard={cookie}"})) == (
        "abc123"
    )
    forged = cookie.replace("abc123", "abc124")
    for value in (forged, "abc123", "abc123.", ".", "t" * 20, ""):
        request = _request(headers={"cookie": f"onceonly_dashboard={value}"})
        assert access.session_id(request) is None, value
    # A cookie from a deployment with another token names nothing here.
    other = Access("u" * 20).session_cookie("abc123")
    assert access.session_id(_request(headers={"cookie": f"onceonly_dashboard={other}"})) is None


def test_session_and_csrf_values_follow_the_token() -> None:
    # Two receivers with the same token accept each other's cookies and forms.
    assert Access("a" * 20).session_cookie("s") == Access("a" * 20).session_cookie("s")
    assert Access("a" * 20).csrf_token == Access("a" * 20).csrf_token
    assert Access("a" * 20).session_cookie("s") != Access("b" * 20).session_cookie("s")
    # Without a token, each process has its own key.
    assert Access(None).csrf_token != Access(None).csrf_token


def test_csrf_needs_the_token_and_no_foreign_origin() -> None:
    access = Access(None)
    good = access.csrf_token
    same = {"host": "127.0.0.1:8000", "origin": "http://127.0.0.1:8000"}
    assert access.csrf_ok(_request(headers=same), good)
    assert access.csrf_ok(_request(headers={"host": "127.0.0.1:8000"}), good)
    assert not access.csrf_ok(_request(headers=same), "0" * 64)
    assert not access.csrf_ok(_request(headers=same), None)
    foreign = {"host": "127.0.0.1:8000", "origin": "http://evil.example"}
    assert not access.csrf_ok(_request(headers=foreign), good)
    opaque = {"host": "127.0.0.1:8000", "origin": "null"}
    assert not access.csrf_ok(_request(headers=opaque), good)


# Configuration.


def test_dashboard_settings_from_the_environment() -> None:
    app = Onceonly(
        environ={
            "ONCEONLY_DASHBOARD_PATH": "ops/dash/",
            "ONCEONLY_DASHBOARD_TOKEN": "x" * 16,
            "ONCEONLY_DASHBOARD_REDACT": " card.number , payer.email,,",
        }
    )
    assert app.dashboard_path == "/ops/dash"
    assert app.dashboard_token == "x" * 16
    assert app.dashboard_redact == ("card.number", "payer.email")
    defaults = Onceonly(environ={})
    assert defaults.dashboard_path == "/dashboard"
    assert defaults.dashboard_token is None
    assert defaults.dashboard_redact == ()
    assert Onceonly(environ={"ONCEONLY_DASHBOARD_PATH": "off"}).dashboard_path is None


def test_the_object_wins_over_the_environment() -> None:
    env = {"ONCEONLY_DASHBOARD_PATH": "/env", "ONCEONLY_DASHBOARD_REDACT": "a"}
    app = Onceonly(environ=env, dashboard_path="/code", dashboard_redact=["b.c"])
    assert app.dashboard_path == "/code"
    assert app.dashboard_redact == ("b.c",)


@pytest.mark.parametrize("path", ["/", "/webhooks", "/webhooks/x", "/healthz", "/metrics"])
def test_the_dashboard_cannot_take_a_receiver_path(path: str) -> None:
    with pytest.raises(ConfigurationError, match="path of its own"):
        Onceonly(environ={}, dashboard_path=path)


def test_a_short_token_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        Onceonly(environ={"ONCEONLY_DASHBOARD_TOKEN": "short"})


# Mounting, as `onceonly serve` does.


def _inner(name: str, seen: list[tuple[str, str, str]]) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((name, scope["path"], scope.get("root_path", "")))

    return app


async def _call(app: Any, path: str, scope_type: str = "http") -> None:
    async def receive() -> Message:
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        pass

    await app({"type": scope_type, "path": path, "root_path": "", "headers": []}, receive, send)


async def test_the_mount_sends_its_path_to_the_dashboard_and_the_rest_to_the_receiver() -> None:
    seen: list[tuple[str, str, str]] = []
    mount = DashboardMount(_inner("receiver", seen), _inner("dashboard", seen), "/dashboard")
    for path in ("/dashboard", "/dashboard/", "/dashboard/events/1", "/dashboards", "/webhooks/x"):
        await _call(mount, path)
    await _call(mount, "/dashboard", scope_type="lifespan")
    assert seen == [
        ("dashboard", "/dashboard", "/dashboard"),
        ("dashboard", "/dashboard/", "/dashboard"),
        ("dashboard", "/dashboard/events/1", "/dashboard"),
        ("receiver", "/dashboards", ""),
        ("receiver", "/webhooks/x", ""),
        ("receiver", "/dashboard", ""),
    ]


def _server() -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        pass

    return app


def test_serve_mounts_it_on_loopback(caplog: pytest.LogCaptureFixture) -> None:
    server = _server()
    with caplog.at_level(logging.INFO, "onceonly.dashboard"):
        served = for_serve(Onceonly(environ={}), server, host="127.0.0.1", port=8000)
    assert isinstance(served, DashboardMount)
    assert "http://127.0.0.1:8000/dashboard/ (this machine only" in caplog.text


def test_serve_leaves_it_off_on_a_public_interface_without_a_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = _server()
    with caplog.at_level(logging.INFO, "onceonly.dashboard"):
        served = for_serve(Onceonly(environ={}), server, host="0.0.0.0", port=8000)
    assert served is server
    assert "dashboard: disabled, because serve binds 0.0.0.0" in caplog.text


def test_serve_mounts_it_anywhere_with_a_token() -> None:
    app = Onceonly(environ={}, dashboard_token="t" * 32)
    assert isinstance(for_serve(app, _server(), host="0.0.0.0", port=80), DashboardMount)
    off = Onceonly(environ={}, dashboard_path="off", dashboard_token="t" * 32)
    server = _server()
    assert for_serve(off, server, host="127.0.0.1", port=80) is server


def test_redaction_ignores_case_and_follows_dotted_keys() -> None:
    payload = {
        "Payer": {"Email": "ana@example.com", "name": "Ana"},
        "payer.email": "flat@example.com",
        "PAYER": {"EMAIL": "upper@example.com"},
        "card": {"number": "4242"},
    }
    shown = Redactor(["payer.email"]).body(json.dumps(payload).encode())
    data = json.loads(shown.text)
    assert data["Payer"] == {"Email": REDACTED, "name": "Ana"}
    assert data["payer.email"] == REDACTED
    assert data["PAYER"]["EMAIL"] == REDACTED
    assert data["card"] == {"number": "4242"}
    assert shown.redacted == 3


@pytest.mark.parametrize("name", ["X-Api_Key", "X_API_KEY", "Asaas-Access-Token", "X-Credential"])
def test_credential_headers_are_hidden_however_they_are_spelled(name: str) -> None:
    (shown,) = Redactor().headers({name: "value"})
    assert shown.value == REDACTED


def test_a_payload_nested_deeper_than_python_parses_still_renders() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert Redactor().body(deep).kind == "text"
    # With fields to hide, a body that cannot be walked is not shown at all.
    hidden = Redactor(["card.number"]).body(deep)
    assert hidden.redacted == 1
    assert "[[[" not in hidden.text
