"""Who may see the dashboard and press its buttons.

Two modes, chosen by whether an access token is configured:

- **Token** (``ONCEONLY_DASHBOARD_TOKEN``): every page, JSON endpoint and action
  needs it, from anywhere: as ``Authorization: Bearer <token>``, or through the
  login form, which sets an ``HttpOnly``, ``SameSite=Strict`` cookie. The cookie
  holds a session's random id and its HMAC, never the token; the session
  lives in the database, expires there, and logout ends it (see
  :mod:`onceonly.dashboard.sessions`). Every comparison is constant time.
- **No token**: the dashboard answers loopback clients only, and only when the
  request names a loopback host. The second check stops DNS rebinding: a web
  page on ``evil.example`` whose name an attacker re-points at 127.0.0.1 reaches
  a loopback server from the operator's own browser, but with ``Host:
  evil.example``.

State-changing requests (replay) also need a CSRF token, derived from the
same key, in the form, and a matching ``Origin`` when the browser sends one.
A request authenticated with ``Authorization: Bearer`` needs no CSRF token:
browsers never add that header on their own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ["COOKIE_NAME", "MIN_TOKEN_LENGTH", "Access", "is_loopback_host"]

COOKIE_NAME = "onceonly_dashboard"
MIN_TOKEN_LENGTH = 16


def is_loopback_host(host: str) -> bool:
    """``localhost``, ``127.x.y.z`` or ``::1`` (an IPv6 address may be in brackets)."""
    host = host.strip().lower().removeprefix("[").removesuffix("]")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(host_header: str) -> str:
    """The host of a ``Host`` header, without its port."""
    if host_header.startswith("["):
        return host_header.split("]", 1)[0] + "]"
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Access:
    """The access rules for one dashboard (see the module docstring)."""

    def __init__(self, token: str | None) -> None:
        self.token = token or None
        if self.token is not None:
            # Derived from the token, so that every receiver behind a load
            # balancer accepts the same cookie and form tokens.
            self._key = hashlib.sha256(b"onceonly-dashboard:" + self.token.encode()).digest()
        else:
            # Nothing to share between processes in local mode: a fresh key
            # (forms from before a restart are refused; reload the page).
            self._key = secrets.token_bytes(32)

    @property
    def requires_token(self) -> bool:
        return self.token is not None

    def _mac(self, purpose: str) -> str:
        return hmac.new(self._key, purpose.encode(), hashlib.sha256).hexdigest()

    def session_cookie(self, session_id: str) -> str:
        """What the login cookie holds: the session's id and its HMAC."""
        return f"{session_id}.{self._mac('session:' + session_id)}"

    def session_id(self, request: Request) -> str | None:
        """The session the request's cookie names, if the cookie is ours
        (whether the session is still open is the session store's to say)."""
        if self.token is None:
            return None
        session_id, dot, mac = request.cookies.get(COOKIE_NAME, "").rpartition(".")
        if not dot or not session_id:
            return None
        expected = self._mac("session:" + session_id)
        return session_id if hmac.compare_digest(mac.encode(), expected.encode()) else None

    @property
    def csrf_token(self) -> str:
        return self._mac("csrf")

    def token_matches(self, candidate: str) -> bool:
        if self.token is None:
            return False
        return hmac.compare_digest(candidate.encode(), self.token.encode())

    def bearer(self, request: Request) -> bool:
        """Whether the request carries ``Authorization: Bearer <the token>``."""
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(credentials.strip())

    @staticmethod
    def local(request: Request) -> bool:
        """A loopback client that asked for a loopback host."""
        client = request.client
        if client is None or not is_loopback_host(client.host):
            return False
        return is_loopback_host(_host_name(request.headers.get("host", "")))

    def allowed(self, request: Request) -> bool:
        """May this request see the dashboard at all (before any login)?"""
        return self.requires_token or self.local(request)

    def same_origin(self, request: Request) -> bool:
        """No ``Origin`` (not a browser's cross-site form), or one naming this host."""
        origin = request.headers.get("origin")
        if origin is None:
            return True
        return urlsplit(origin).netloc.lower() == request.headers.get("host", "").lower()

    def csrf_ok(self, request: Request, submitted: str | None) -> bool:
        if self.bearer(request):
            return True
        if not self.same_origin(request):
            return False
        return hmac.compare_digest((submitted or "").encode(), self.csrf_token.encode())
