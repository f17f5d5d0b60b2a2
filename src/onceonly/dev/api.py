"""The fake provider API: the objects events point to, served at each provider's real paths.

Point an API client's base URL at it (``ONCEONLY_MERCADOPAGO_API_BASE=http://127.0.0.1:8001``)
and ``ctx.fetch()`` reads what the fake holds; change an object's status and
the next fetch sees the change. It checks the credential the way the provider
does and can misbehave on purpose (5xx answers, 429 with ``Retry-After``,
slow answers), so tests and local development exercise the client's retries.

- stripe ``event``: ``GET /v1/events/{id}``, ``Authorization: Bearer <token>``
- stripe ``payment_intent``: ``GET /v1/payment_intents/{id}``, Bearer
- mercadopago ``payment``: ``GET /v1/payments/{id}``, Bearer
- asaas ``payment``: ``GET /v3/payments/{id}``, header ``access_token: <token>``
- pagbank ``order``: ``GET /orders/{id}``, Bearer
- pagbank ``charge``: ``GET /charges/{id}``, Bearer
- pagbank ``notification`` (legacy PagSeguro):
  ``GET /v3/transactions/notifications/{code}?email=<email>&token=<token>``
- pagarme ``order`` / ``charge``: ``GET /core/v5/orders/{id}``,
  ``GET /core/v5/charges/{id}``, HTTP Basic with the token as the user
- efi ``token``: ``POST /oauth/token``, HTTP Basic ``<any client id>:<token>``,
  answers an access token derived from the token (no state kept)
- efi ``pix``: ``GET /v2/pix/{e2eid}``, ``Authorization: Bearer <that access token>``

and the listings ``onceonly reconcile`` reads, from the same objects:

- stripe ``GET /v1/events`` (``created[gte]``, ``delivery_success``,
  ``types[]``, ``limit``, ``starting_after``; newest first)
- asaas ``GET /v3/payments`` (``dateCreated[ge]``, ``offset``, ``limit``,
  ``hasMore``) and ``GET /v3/webhooks`` (the queue's ``interrupted``)
- mercadopago ``GET /v1/payments/search`` (``range``, ``begin_date``,
  ``end_date``, ``offset``, ``limit``; ``results`` and ``paging``)

Which events were delivered (Stripe's ``delivery_success``) and whether the
queue paused (Asaas) come from :meth:`FakeApi.record_delivery` and
:meth:`FakeApi.set_queue` (``onceonly dev gateway`` calls them after its
deliveries, see :func:`onceonly.dev.gateway.record_deliveries`).

Many merchants (see docs/tenants.md): :meth:`FakeApi.add_merchant` gives a
merchant's account its own token, :meth:`FakeApi.connect` makes an account a
Stripe Connect account the platform's token reaches with ``Stripe-Account``;
objects put under an `account` are served only to that account's credential.

The paths do not overlap, so one server serves every provider at once. The
legacy PagSeguro lookup answers XML (``<transaction>`` built from the stored
dict); the others answer JSON. Unknown objects get the provider's kind of 404,
a wrong credential its kind of 401.

The paths, credentials and answers come from each provider's profile
(``onceonly/providers/<name>/profile.py``, through
:mod:`onceonly.dev.profiles`); this module holds no provider of its own. It
is an ASGI app (Starlette) that any server can run.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ..providers.profile import ApiAnswer, DevProfile, ListingState
from .profiles import profile_for, profiles

__all__ = ["DEFAULT_TOKEN", "KINDS", "ApiRequest", "FakeApi"]

#: The credential every provider accepts unless told otherwise.
DEFAULT_TOKEN = "onceonly-dev-token"
#: Provider -> the kinds of object the fake serves for it.
KINDS: dict[str, tuple[str, ...]] = {
    route: profile.kinds for route, profile in profiles().items() if profile.routes
}


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """One request the fake answered: what was asked and the status it got."""

    provider: str
    kind: str
    object_id: str
    status: int
    #: Whose credential asked: ``""`` the platform's own, else the merchant's
    #: account (its token, or Stripe Connect's ``Stripe-Account``).
    account: str = ""


@dataclass(slots=True)
class _Fault:
    remaining: int | None  # None: until reset
    provider: str | None
    status: int = 0
    retry_after: str | None = None
    delay: float = 0.0


def _profile(provider: str) -> DevProfile:
    # Only providers with a profile have paths or objects here (see _key).
    profile = profile_for(provider)
    assert profile is not None, provider
    return profile


def _response(answer: ApiAnswer) -> Response:
    if answer.content is not None:
        return Response(answer.content, answer.status, media_type=answer.media_type)
    return JSONResponse(answer.data, answer.status)


class FakeApi:
    """An in-memory stand-in for the providers' APIs, as an ASGI app.

    ::

        api = FakeApi()                                  # accepts DEFAULT_TOKEN
        api.put("mercadopago", "payment", "123", {"id": 123, "status": "pending"})
        # serve `api` (uvicorn, onceonly dev gateway); point the client at it
        api.set_status("mercadopago", "payment", "123", "approved")
        api.fail(2, status=503)                          # the next 2 requests get 503
        api.slow(1.5, count=1)                           # the next request waits 1.5 s
        api.hold(); ...; api.release()                   # requests hang until released
        api.hits("mercadopago", "payment", "123")        # requests answered for it

    `token` is the credential accepted for every provider; `tokens` overrides
    it per provider. The legacy PagSeguro lookup accepts `legacy_email` with
    the ``pagbank`` token. Objects are stored and returned as copies; every
    method is safe to call from another thread while the app serves.

    With `admin` (default on), ``GET``/``PUT /_fake/{provider}/{kind}/{id}``
    read and replace an object over HTTP and ``POST
    /_fake/{provider}/{kind}/{id}/status`` (JSON ``{"status": ...}``) changes
    its status, without credentials: for a fake run as its own process. Serve
    it on loopback only.
    """

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        *,
        tokens: Mapping[str, str] | None = None,
        legacy_email: str = "seller@example.com",
        admin: bool = True,
    ) -> None:
        self.token = token
        self.tokens = dict(tokens or {})
        self.legacy_email = legacy_email
        self._objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._delivered: dict[tuple[str, str], bool] = {}
        self._queues: dict[str, dict[str, Any]] = {}
        #: (provider, token) -> account; provider -> connected accounts.
        self._merchants: dict[tuple[str, str], str] = {}
        self._connected: dict[str, set[str]] = {}
        self._faults: list[_Fault] = []
        self._requests: list[ApiRequest] = []
        self._lock = threading.Lock()
        self._open = threading.Event()
        self._open.set()
        self._held = 0
        # Bumped by clear(): a request that arrived before it (a slow answer
        # still on its way) belongs to the past and is not recorded after it.
        self._generation = 0
        # Listings first: MP's /v1/payments/search would otherwise be read as
        # the payment "search" of /v1/payments/{object_id}.
        routes = [
            Route(listing.path, self._lister(name, listing.name))
            for name, profile in profiles().items()
            for listing in profile.listings
        ]
        routes += [
            Route(route.path, self._endpoint(name, route.kind), methods=list(route.methods))
            for name, profile in profiles().items()
            for route in profile.routes
        ]
        if admin:
            routes += [
                Route("/_fake/{provider}/{kind}/{object_id}", self._admin, methods=["GET", "PUT"]),
                Route(
                    "/_fake/{provider}/{kind}/{object_id}/status",
                    self._admin_status,
                    methods=["POST"],
                ),
            ]
        self.app = Starlette(routes=routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    # Objects.

    @staticmethod
    def _key(
        provider: str, kind: str, object_id: str | int, account: str = ""
    ) -> tuple[str, str, str, str]:
        profile = profile_for(provider)
        if profile is None or kind not in profile.kinds:
            known = ", ".join(f"{p}/{k}" for p, pr in profiles().items() for k in pr.kinds)
            raise ValueError(f"the fake API serves no {provider}/{kind} (it serves {known})")
        return provider, kind, str(object_id), account

    def put(
        self,
        provider: str,
        kind: str,
        object_id: str | int,
        obj: Mapping[str, Any],
        *,
        account: str = "",
    ) -> None:
        """Store (or replace) the object served at `provider`'s path for `kind`
        (to `account`'s credential only, when given).

        For ``pagbank``/``notification`` `object_id` is the notification code
        and `obj` the transaction it resolves to (``{"code": ..., "status": "3"}``).
        """
        key = self._key(provider, kind, object_id, account)
        with self._lock:
            self._objects[key] = copy.deepcopy(dict(obj))

    def get(
        self, provider: str, kind: str, object_id: str | int, *, account: str = ""
    ) -> dict[str, Any] | None:
        """A copy of the stored object, or ``None``."""
        key = self._key(provider, kind, object_id, account)
        with self._lock:
            found = self._objects.get(key)
            return copy.deepcopy(found) if found is not None else None

    def remove(self, provider: str, kind: str, object_id: str | int, *, account: str = "") -> None:
        """Forget an object: its path answers 404 from now on."""
        key = self._key(provider, kind, object_id, account)
        with self._lock:
            self._objects.pop(key, None)

    def update(
        self, provider: str, kind: str, object_id: str | int, *, account: str = "", **fields: Any
    ) -> None:
        """Change top-level fields of a stored object (``KeyError`` if absent)."""
        key = self._key(provider, kind, object_id, account)
        with self._lock:
            self._objects[key].update(copy.deepcopy(fields))

    def set_status(
        self, provider: str, kind: str, object_id: str | int, status: Any, *, account: str = ""
    ) -> None:
        """Change an object's status: its ``status`` field (for a Stripe event,
        that of ``data.object``, the object the event carries)."""
        key = self._key(provider, kind, object_id, account)
        with self._lock:
            _profile(provider).set_status(kind, self._objects[key], status)

    def record_delivery(self, provider: str, event_id: str, delivered: bool) -> None:
        """Remember whether a delivery of `event_id` was acknowledged (what
        Stripe's ``delivery_success`` filter lists by)."""
        with self._lock:
            self._delivered[(provider, event_id)] = delivered

    def set_queue(self, provider: str, **state: Any) -> None:
        """Set what `provider`'s webhook queue reports (Asaas: ``interrupted``,
        ``penalized``, ``url``)."""
        with self._lock:
            self._queues.setdefault(provider, {}).update(state)

    # Merchants.

    def add_merchant(self, provider: str, account: str, token: str) -> None:
        """Accept `token` on `provider`'s paths as `account`'s own credential
        (each merchant's Asaas key, PagBank token, Mercado Pago access token)."""
        with self._lock:
            self._merchants[(provider, token)] = account

    def connect(self, provider: str, account: str) -> None:
        """Make `account` reachable with the platform's token plus the header
        ``Stripe-Account: <account>`` (Stripe Connect)."""
        with self._lock:
            self._connected.setdefault(provider, set()).add(account)

    def clear(self) -> None:
        """Forget every object, fault and recorded request (including the ones
        still being answered)."""
        with self._lock:
            self._delivered.clear()
            self._queues.clear()
            self._objects.clear()
            self._faults.clear()
            self._requests.clear()
            self._generation += 1

    # Faults.

    def fail(
        self,
        count: int,
        status: int = 503,
        *,
        retry_after: int | str | None = None,
        provider: str | None = None,
    ) -> None:
        """Answer the next `count` requests (to `provider`, or any) with `status`
        (5xx or 429), with a ``Retry-After`` header when given."""
        with self._lock:
            self._faults.append(
                _Fault(
                    count,
                    provider,
                    status=status,
                    retry_after=None if retry_after is None else str(retry_after),
                )
            )

    def slow(
        self, seconds: float, count: int | None = None, *, provider: str | None = None
    ) -> None:
        """Wait `seconds` before answering the next `count` requests (``None``:
        every request until :meth:`reset_faults`)."""
        with self._lock:
            self._faults.append(_Fault(count, provider, delay=seconds))

    def reset_faults(self) -> None:
        """Answer normally again (held requests are released)."""
        with self._lock:
            self._faults.clear()
        self.release()

    def hold(self) -> None:
        """Make every request wait, unanswered, until :meth:`release`: an API
        that hangs, for as long as a test needs to look at what waits on it."""
        self._open.clear()

    def release(self) -> None:
        """Answer the held requests, and the next ones at once."""
        self._open.set()

    @property
    def held(self) -> int:
        """How many requests are waiting on :meth:`hold` now."""
        with self._lock:
            return self._held

    def _take_faults(self, provider: str) -> tuple[float, _Fault | None]:
        delay, failure = 0.0, None
        with self._lock:
            for fault in list(self._faults):
                if fault.provider not in (None, provider):
                    continue
                if fault.status and failure is not None:
                    continue  # one failure per request; the next one waits its turn
                if fault.status:
                    failure = fault
                delay = max(delay, fault.delay)
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
        return delay, failure

    # What was asked.

    @property
    def requests(self) -> list[ApiRequest]:
        """Every request answered so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def hits(
        self,
        provider: str | None = None,
        kind: str | None = None,
        object_id: str | int | None = None,
    ) -> int:
        """How many requests matched (``None`` matches anything)."""
        return sum(
            1
            for r in self.requests
            if provider in (None, r.provider)
            and kind in (None, r.kind)
            and (object_id is None or str(object_id) == r.object_id)
        )

    def token_for(self, provider: str) -> str:
        """The credential `provider`'s paths accept."""
        return self.tokens.get(provider, self.token)

    # Serving.

    def _authorized(self, request: Request, provider: str, kind: str, token: str) -> bool:
        return _profile(provider).authorized(
            kind, request.headers, request.query_params, token, self.legacy_email
        )

    def _account(self, request: Request, provider: str, kind: str) -> str | None:
        """Whose credential the request carries (``""``: the platform's), or
        ``None`` when it is nobody's."""
        if self._authorized(request, provider, kind, self.token_for(provider)):
            acting_for = request.headers.get("stripe-account")
            if acting_for is None:
                return ""
            with self._lock:
                connected = acting_for in self._connected.get(provider, ())
            return acting_for if connected else None
        with self._lock:
            merchants = [(t, a) for (p, t), a in self._merchants.items() if p == provider]
        for token, account in merchants:
            if self._authorized(request, provider, kind, token):
                return account
        return None

    def _endpoint(self, provider: str, kind: str) -> Any:
        async def endpoint(request: Request) -> Response:
            # A path the profile answers itself (a token endpoint) names no object.
            object_id = request.path_params.get("object_id", "")
            generation = self._generation
            response, account = await self._answer(request, provider, kind, object_id)
            with self._lock:
                if generation == self._generation:
                    record = ApiRequest(
                        provider, kind, object_id, response.status_code, account or ""
                    )
                    self._requests.append(record)
            return response

        return endpoint

    def _listing_state(self, provider: str, account: str) -> ListingState:
        """What `account`'s credential may list (``""``: the platform's own)."""
        with self._lock:
            objects: dict[str, list[dict[str, Any]]] = {}
            for (p, kind, _, owner), obj in self._objects.items():
                if p == provider and owner == account:
                    objects.setdefault(kind, []).append(copy.deepcopy(obj))
            delivered = {e: ok for (p, e), ok in self._delivered.items() if p == provider}
            queue = dict(self._queues.get(provider, {}))
        return ListingState(objects, delivered, queue)

    def _lister(self, provider: str, name: str) -> Any:
        async def endpoint(request: Request) -> Response:
            generation = self._generation
            response = await self._list(request, provider, name)
            with self._lock:
                if generation == self._generation:
                    self._requests.append(ApiRequest(provider, name, "", response.status_code))
            return response

        return endpoint

    async def _list(self, request: Request, provider: str, name: str) -> Response:
        early = await self._misbehave(provider)
        if early is not None:
            return early
        profile = _profile(provider)
        account = self._account(request, provider, name)
        if account is None:
            return _response(profile.unauthorized(name))
        query: dict[str, list[str]] = {}
        for key, value in request.query_params.multi_items():
            query.setdefault(key, []).append(value)
        return _response(profile.listing(name, self._listing_state(provider, account), query))

    async def _misbehave(self, provider: str) -> Response | None:
        """Hold, slow down or fail this request as the faults say; the failure
        answer, or ``None`` to answer normally."""
        if not self._open.is_set():
            with self._lock:
                self._held += 1
            try:
                # release() comes from another thread: poll the threading.Event.
                while not self._open.is_set():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            finally:
                with self._lock:
                    self._held -= 1
        delay, failure = self._take_faults(provider)
        if delay:
            await asyncio.sleep(delay)
        if failure is not None:
            headers = {"retry-after": failure.retry_after} if failure.retry_after else None
            return JSONResponse(
                {"error": "fault injected by the fake API", "status": failure.status},
                failure.status,
                headers=headers,
            )
        return None

    async def _answer(
        self, request: Request, provider: str, kind: str, object_id: str
    ) -> tuple[Response, str | None]:
        early = await self._misbehave(provider)
        if early is not None:
            return early, None
        profile = _profile(provider)
        account = self._account(request, provider, kind)
        if account is None:
            return _response(profile.unauthorized(kind)), None
        own = profile.answer(kind, request.headers, self.token_for(provider))
        if own is not None:
            return _response(own), account
        # One account's objects are invisible to every other credential.
        obj = self.get(provider, kind, object_id, account=account)
        if obj is None:
            return _response(profile.not_found(kind, object_id)), account
        return _response(profile.render(kind, obj)), account

    async def _admin(self, request: Request) -> Response:
        provider, kind, object_id = (
            request.path_params[k] for k in ("provider", "kind", "object_id")
        )
        try:
            if request.method == "PUT":
                try:
                    obj = json.loads(await request.body())
                except ValueError:
                    return JSONResponse({"error": "body is not JSON"}, 400)
                if not isinstance(obj, dict):
                    return JSONResponse({"error": "body is not a JSON object"}, 400)
                self.put(provider, kind, object_id, obj)
                return JSONResponse(obj)
            found = self.get(provider, kind, object_id)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, 404)
        return JSONResponse(found) if found is not None else JSONResponse({"error": "absent"}, 404)

    async def _admin_status(self, request: Request) -> Response:
        provider, kind, object_id = (
            request.path_params[k] for k in ("provider", "kind", "object_id")
        )
        try:
            data = json.loads(await request.body())
            status = data["status"]
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": 'send {"status": ...}'}, 400)
        try:
            self.set_status(provider, kind, object_id, status)
        except (ValueError, KeyError):
            return JSONResponse({"error": "no such object"}, 404)
        return JSONResponse(self.get(provider, kind, object_id))
