"""The part every provider API client shares: HTTP, retries, errors, secrets.

A client reads one object from a payment provider's API: the payment an event
points to, as the provider sees it now. It never writes. The transport is
:class:`httpx.AsyncClient`; one is made per event loop (a worker thread has its
own loop, and an httpx client must not cross loops), and reused for the
connections it keeps alive.

Retry policy: a network error, a timeout, a 5xx or a 429 is retried up to
``retries`` times with exponential backoff and jitter; a ``Retry-After`` header
is honoured when it is no longer than ``max_retry_after`` (a longer one gives
up at once: the handler's transaction should not wait minutes, and the worker
retries the event later). Any other 4xx is an answer, not a hiccup: it is
raised at once as :class:`~onceonly.ApiError`. When the retries run out,
:class:`~onceonly.ApiUnavailable` is raised.

Credentials never appear in an exception message or a log line: messages name
the path without its query, every configured secret is masked in the excerpts
of answers, and a filter on the ``httpx`` logger masks ``token=`` query
parameters (the legacy PagSeguro API takes its token in the query).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import re
import ssl
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, ClassVar, Self
from urllib.parse import quote

from .._exceptions import ApiError, ApiUnavailable, ConfigurationError, NotFetchable
from ..backoff import backoff
from ..events import Event
from .base import env_name

if TYPE_CHECKING:
    # Imported when the first request is made: importing onceonly (a web
    # app, the receiver) does not pay for an HTTP client it may never use.
    import httpx

__all__ = ["RECONCILED_HEADER", "ApiClient", "ApiRetryPolicy", "Listed", "RetryPolicy", "Target"]

log = logging.getLogger("onceonly.clients")

#: Shown to providers that ask for a User-Agent (Asaas requires one).
USER_AGENT = "onceonly-api-client"
#: How much of an error answer is kept in an ApiError.
EXCERPT_CHARS = 300
# Ids go into URL paths. Real ids are short and plain; anything else (a slash,
# "..", a query) in an unsigned notification must not steer the request.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}")


@dataclass(frozen=True, slots=True)
class Target:
    """What an event points to: the kind of object and its id at the provider."""

    kind: str
    id: str


#: The header every reconciled event carries (its value: where it was listed),
#: so a handler can tell it from a delivery (``event.headers``).
RECONCILED_HEADER = "onceonly-reconciled"


@dataclass(frozen=True, slots=True)
class Listed:
    """One item a provider's API lists, as the event ``onceonly reconcile``
    puts through the inbox (see docs/reconcile.md).

    `event_id` is the delivered event's own id where the API lists events
    (Stripe) or where the provider's event id is a function of the object
    (PagBank); otherwise a deterministic ``reconciled:<object id>:<status>``,
    so a rerun finds the same id. `headers` always hold
    :data:`RECONCILED_HEADER`.
    """

    event_id: str
    event_type: str | None
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


def listed_body(data: Mapping[str, Any]) -> bytes:
    """A listed item's body as stored: compact JSON, the shape of a delivery."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class ApiRetryPolicy:
    """How onceonly retries a call to a provider's API: when and how long a
    client waits before asking again.

    Not to be confused with :class:`~onceonly.dev.schedules.DeliverySchedule`,
    how a *provider* retries a webhook delivery to us.

    Retry number n (1-based) waits :func:`onceonly.backoff.backoff` (the same
    formula as the worker's retries: ``min(cap, base * 2**(n-1))`` times a
    jitter in [0.5, 1]), or what ``Retry-After`` asks for, up to `max_retry_after`.
    """

    retries: int = 3
    base: float = 0.5
    cap: float = 8.0
    max_retry_after: float = 30.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ConfigurationError("API retries must be >= 0")
        if self.base < 0 or self.cap < 0 or self.max_retry_after < 0:
            raise ConfigurationError("API retry delays must be >= 0")

    def delay(self, retry: int, retry_after: float | None = None) -> float | None:
        """Seconds before retry number `retry`; ``None``: the server asks for
        longer than this policy waits, so give up now."""
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        return backoff(retry, base=self.base, cap=self.cap)


#: The name this class had first; kept for code written against it.
RetryPolicy = ApiRetryPolicy


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def safe_id(value: Any, what: str) -> str:
    """`value` as an id that is safe in a URL path, or :class:`NotFetchable`."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not _SAFE_ID.fullmatch(value) or ".." in value:
        raise NotFetchable(f"{what} is not a usable id: {str(value)[:60]!r}")
    return value


def body_json(event: Event) -> dict[str, Any]:
    """The event's body as a JSON object, or ``{}`` when it is not one."""
    try:
        data = json.loads(event.body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


class _RedactTokens(logging.Filter):
    """Masks credentials passed in a query string in the ``httpx`` logger's lines."""

    _pattern = re.compile(r"([?&](?:token|access_token|email)=)[^&\s\"']*", re.IGNORECASE)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "=" in message:
            masked = self._pattern.sub(r"\1***", message)
            if masked != message:
                record.msg, record.args = masked, None
        return True


_httpx_logger = logging.getLogger("httpx")
if not any(isinstance(f, _RedactTokens) for f in _httpx_logger.filters):
    _httpx_logger.addFilter(_RedactTokens())


@functools.cache
def _shared_ssl_context() -> ssl.SSLContext:
    # Building one loads the CA bundle (tens of milliseconds): do it once.
    import httpx

    return httpx.create_ssl_context()


class ApiClient(ABC):
    """Reads the objects a provider's events point to, from that provider's API.

    Subclasses set `name` (the provider), `default_base_url` and `kinds` (what
    :meth:`fetch` can read; the first is what an event points to by default)
    and implement :meth:`target` (event -> object) and :meth:`get` (object ->
    the API's answer). Usable on its own::

        async with MercadoPagoClient("APP_USR-...") as mp:
            payment = await mp.get(Target("payment", "123"))

    or, inside a handler, through ``ctx.fetch()`` / ``await ctx.afetch()``.
    `timeout` (seconds) bounds each phase of each request (connect, send, wait
    for the answer); the worst case of one call is about ``(retries + 1) *
    timeout`` plus the waits between retries.
    """

    name: ClassVar[str]
    default_base_url: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    #: False where a client can work without the main token (PagBank's legacy API).
    token_required: ClassVar[bool] = True
    #: Whether :meth:`listing` can list by time (``False``: only the ids given).
    lists_by_time: ClassVar[bool] = False
    #: How far back ``onceonly reconcile`` looks when no ``--since`` is given.
    default_window: ClassVar[float] = 3 * 86400.0
    #: Items per page asked of a listing API.
    page_size: ClassVar[int] = 100
    #: True where the platform's key can act for another account (Stripe
    #: Connect's ``Stripe-Account`` header).
    accounts: ClassVar[bool] = False
    #: The account acted for (set by :meth:`for_tenant`); ``None``: the key's own.
    account: str | None = None

    def __init__(
        self,
        token: str,
        *,
        base_url: str | None = None,
        timeout: float = 10.0,
        retry: ApiRetryPolicy | None = None,
    ) -> None:
        self.token = token.strip()
        if self.token_required and not self.token:
            raise ConfigurationError(f"the {self.name} API client needs a token")
        self.base_url = check_base_url((base_url or self.default_base_url).rstrip("/"), self.name)
        if timeout <= 0:
            raise ConfigurationError(f"{self.name} API timeout must be positive")
        self.timeout = timeout
        self.retry = retry or ApiRetryPolicy()
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:  # never the token
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    def for_tenant(self, *, token: str | None = None, account: str | None = None) -> Self:
        """This client (same base URL, timeout, retries and open connections)
        for one merchant: with the merchant's own `token`, or, where the
        provider has connected accounts (Stripe Connect), the platform's key
        acting for `account`."""
        if account is not None and not self.accounts:
            raise ConfigurationError(
                f"the {self.name} API has no connected accounts: give the tenant's api_token"
            )
        twin = copy.copy(self)  # shares the per-loop HTTP clients: headers are per request
        if token is not None:
            twin.token = token.strip()
            if not twin.token:
                raise ConfigurationError(f"the {self.name} API client needs a token")
        twin.account = account
        return twin

    # What subclasses provide.

    @abstractmethod
    def target(self, event: Event, kind: str | None = None) -> Target:
        """The object `event` points to (of `kind`, default the first of
        :attr:`kinds`); :class:`~onceonly.NotFetchable` when it names none.
        Pure: reads the stored payload only."""

    @abstractmethod
    async def get(self, target: Target) -> dict[str, Any]:
        """The provider's current view of `target`."""

    def auth_headers(self) -> dict[str, str]:
        """Headers that carry the credential (Bearer by default)."""
        return {"authorization": f"Bearer {self.token}"}

    def secrets(self) -> tuple[str, ...]:
        """Every credential this client holds, to mask in messages."""
        return (self.token,)

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings of this client's connections: the shared default,
        unless the API wants a client certificate (Efí's mutual TLS)."""
        return _shared_ssl_context()

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], route: str) -> Self | None:
        """The client configured by ``ONCEONLY_<ROUTE>_API_TOKEN`` (and
        ``_API_BASE``), or ``None`` when no token is set."""
        token = environ.get(env_name(route, "API_TOKEN"), "").strip()
        if not token:
            return None
        return cls(token, **cls.common_options(environ, route))

    @classmethod
    def common_options(cls, environ: Mapping[str, str], route: str) -> dict[str, Any]:
        options: dict[str, Any] = {"base_url": environ.get(env_name(route, "API_BASE")) or None}
        raw = environ.get("ONCEONLY_API_TIMEOUT")
        if raw:
            options["timeout"] = _number(raw, "ONCEONLY_API_TIMEOUT")
        raw = environ.get("ONCEONLY_API_RETRIES")
        if raw:
            options["retry"] = ApiRetryPolicy(retries=int(_number(raw, "ONCEONLY_API_RETRIES")))
        return options

    def listing(
        self, since: datetime, *, ids: Sequence[str] = (), failed_only: bool = False
    ) -> AsyncIterator[Listed]:
        """What the API lists since `since` (or, for `ids`, those objects), as
        events for the inbox; pages are read as they are consumed. `failed_only`
        asks for events whose delivery failed where the API can tell (Stripe).
        The default: this provider's API lists nothing."""
        raise ConfigurationError(f"onceonly cannot reconcile {self.name}: its API lists nothing")

    async def queue_state(self) -> dict[str, Any] | None:
        """The provider's own view of its webhook queue, where it has one
        (Asaas: paused or not); ``None`` where it has none."""
        return None

    # The public calls.

    async def fetch(self, event: Event, kind: str | None = None) -> dict[str, Any]:
        """The object `event` points to, as the API returns it now."""
        return await self.get(self.target(event, kind))

    def kind_or_default(self, kind: str | None) -> str:
        chosen = kind or self.kinds[0]
        if chosen not in self.kinds:
            raise NotFetchable(
                f"{self.name} events point to {', '.join(self.kinds)}; cannot fetch {chosen!r}"
            )
        return chosen

    async def aclose(self) -> None:
        """Close the connections opened on the running event loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # HTTP.

    def _http(self) -> httpx.AsyncClient:
        import httpx

        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None:
                client = httpx.AsyncClient(
                    base_url=self.base_url,
                    timeout=httpx.Timeout(self.timeout),
                    headers={"user-agent": USER_AGENT},
                    verify=self.ssl_context(),
                )
                self._clients[loop] = client
            return client

    def redact(self, text: str) -> str:
        for secret in self.secrets():
            if len(secret) >= 4:
                text = text.replace(secret, "***")
        return text

    async def request(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        """GET `path` with retries; the 2xx answer, or an :class:`ApiError`."""
        import httpx

        client = self._http()
        all_headers = {**self.auth_headers(), **(headers or {})}
        retry = 0
        while True:
            status: int | None = None
            retry_after: float | None = None
            try:
                response = await client.get(path, params=params, headers=all_headers)
            except httpx.RequestError as exc:  # connect/read errors, timeouts, bad encodings
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return response
                excerpt = self.redact(response.text[:EXCERPT_CHARS])
                if status != 429 and status < 500:
                    raise ApiError(
                        f"{self.name} API answered {status} to GET {path}: {excerpt}",
                        provider=self.name,
                        status=status,
                        body=excerpt,
                    )
                problem = f"HTTP {status}: {excerpt}"
                retry_after = parse_retry_after(response.headers.get("retry-after"))
            retry += 1
            if retry > self.retry.retries:
                raise self._unavailable(path, f"{retry} attempts", problem, status)
            delay = self.retry.delay(retry, retry_after)
            if delay is None:
                raise self._unavailable(
                    path, f"it asks to retry after {retry_after:.0f} s", problem, status
                )
            log.info(
                "%s API: GET %s failed (%s); retry %d/%d in %.2f s",
                self.name,
                path,
                self.redact(problem),
                retry,
                self.retry.retries,
                delay,
            )
            await asyncio.sleep(delay)

    def _unavailable(self, path: str, why: str, problem: str, status: int | None) -> ApiUnavailable:
        problem = self.redact(problem)
        return ApiUnavailable(
            f"{self.name} API unavailable for GET {path} ({why}); last: {problem}",
            provider=self.name,
            status=status,
            body=problem,
        )

    async def get_json(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """GET `path` and return its JSON object."""
        response = await self.request(path, params=params, headers={"accept": "application/json"})
        try:
            data = response.json()
        except (ValueError, UnicodeDecodeError):
            data = None
        if not isinstance(data, dict):
            excerpt = self.redact(response.text[:EXCERPT_CHARS])
            raise ApiError(
                f"{self.name} API answered {response.status_code} to GET {path} "
                f"with something that is not a JSON object: {excerpt}",
                provider=self.name,
                status=response.status_code,
                body=excerpt,
            )
        return data

    async def get_page(
        self, path: str, items: str, params: Mapping[str, str]
    ) -> tuple[dict[str, Any], list[Any]]:
        """One page of a listing: the JSON object and its list under `items`
        (:class:`~onceonly.ApiError` when there is none: a reconcile that read
        nothing must not pass for one that found nothing to catch up)."""
        page = await self.get_json(path, params=params)
        found = page.get(items)
        if not isinstance(found, list):
            raise ApiError(
                f"{self.name} API answered GET {path} without a {items} list",
                provider=self.name,
                status=200,
            )
        return page, found


def check_base_url(url: str, provider: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ConfigurationError(
            f"{provider} API base URL must start with http:// or https://, got {url!r}"
        )
    return url


def path_id(value: str) -> str:
    """`value` escaped for a URL path segment (already checked by :func:`safe_id`)."""
    return quote(value, safe="")


def _number(raw: str, what: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{what} must be a number, got {raw!r}") from None
