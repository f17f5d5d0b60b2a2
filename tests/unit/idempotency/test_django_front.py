"""The Django front end of the Idempotency-Key policy, called as Django calls it
(sync and async), on the in-memory store: no database, no server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip("django")

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.test import RequestFactory, override_settings

import django_support
from conftest import POSTGRES
from onceonly import ConfigurationError
from onceonly.contrib.django.idempotency import IdempotencyMiddleware, idempotent
from onceonly.store.memory import MemoryStore
from support import ENGINES


@pytest.fixture(scope="module", autouse=True)
def _django() -> None:
    # The set of aliases is fixed at set-up, for the Django tests after these.
    django_support.setup(POSTGRES.url if "postgresql" in ENGINES else None)


KEY = {"idempotency-key": "k-1"}


class User:
    """What the default scope reads of ``request.user``."""

    def __init__(self, pk: int | None) -> None:
        self.pk = pk
        self.is_authenticated = pk is not None


def post(user: int | None, body: bytes = b"{}", key: str = "k-1") -> HttpRequest:
    request = RequestFactory().post(
        "/orders", data=body, content_type="application/json", headers={"idempotency-key": key}
    )
    request.user = User(user)  # type: ignore[assignment]

    async def auser() -> User:
        return User(user)

    request.auser = auser  # type: ignore[assignment]
    return request


def body_of(response: HttpResponseBase) -> bytes:
    if isinstance(response, StreamingHttpResponse):
        return b"".join(response.streaming_content)  # type: ignore[arg-type]
    assert isinstance(response, HttpResponse)
    return response.content


def test_the_middleware_is_sync_or_async_as_django_calls_it() -> None:
    def sync_view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    async def async_view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    assert IdempotencyMiddleware.sync_capable
    assert IdempotencyMiddleware.async_capable
    assert not iscoroutinefunction(IdempotencyMiddleware(sync_view))
    assert iscoroutinefunction(IdempotencyMiddleware(async_view))
    assert iscoroutinefunction(idempotent()(async_view))
    assert not iscoroutinefunction(idempotent()(sync_view))


def test_unknown_settings_are_refused() -> None:
    with (
        override_settings(ONCEONLY_IDEMPOTENCY={"requierd": True}),
        pytest.raises(ConfigurationError, match="requierd"),
    ):
        IdempotencyMiddleware(lambda request: HttpResponse())


def test_without_request_user_the_error_says_where_the_middleware_goes() -> None:
    @idempotent(store=MemoryStore())
    def view(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    request = RequestFactory().post("/orders", data=b"{}", content_type="text/plain", headers=KEY)
    with pytest.raises(ConfigurationError, match=r"after .*AuthenticationMiddleware"):
        view(request)


def test_users_get_their_own_answers_and_an_outage_fails_closed() -> None:
    store = MemoryStore()
    runs = 0

    @idempotent(store=store)
    def view(request: HttpRequest) -> HttpResponse:
        nonlocal runs
        runs += 1
        return HttpResponse(f"order {runs}", status=201, content_type="text/plain")

    first, again, other = view(post(1)), view(post(1)), view(post(2))
    reused = view(post(1, b'{"other": 1}'))
    store.unavailable = True
    down = view(post(1, key="k-2"))
    assert (first.content, again.content, other.content) == (b"order 1", b"order 1", b"order 2")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Content-Type"] == "text/plain"
    assert "Idempotent-Replayed" not in other.headers
    assert reused.status_code == 422
    assert (down.status_code, down.headers["Retry-After"]) == (503, "5")
    assert down.headers["Content-Type"] == "application/problem+json"
    assert runs == 2


async def test_async_views_scope_by_the_user_django_loads_off_the_loop() -> None:
    runs = 0

    @idempotent(store=MemoryStore())
    async def view(request: HttpRequest) -> HttpResponse:
        nonlocal runs
        runs += 1
        return HttpResponse(f"order {runs}", status=201)

    first, again, other = await view(post(1)), await view(post(1)), await view(post(2))
    anonymous = await view(post(None))
    assert (first.content, again.content, other.content) == (b"order 1", b"order 1", b"order 2")
    assert again.headers["Idempotent-Replayed"] == "true"
    assert anonymous.status_code == 400  # no user, no Authorization: nobody to scope it to
    assert runs == 2


def test_bodies_over_the_limit_are_refused_before_they_are_read() -> None:
    runs = 0

    @idempotent(store=MemoryStore(), max_request_bytes=10)
    def view(request: HttpRequest) -> HttpResponse:
        nonlocal runs
        runs += 1
        return HttpResponse()

    class Unreadable:
        def read(self, *args: Any) -> bytes:
            raise AssertionError("the body of a refused request was read")

    declared = post(1)
    declared.META["CONTENT_LENGTH"] = "9" * 40
    declared._stream = Unreadable()  # type: ignore[assignment]
    sent = post(1, b"x" * 11, key="k-2")
    for response in (view(declared), view(sent)):
        assert response.status_code == 413
        assert response.headers["Content-Type"] == "application/problem+json"
    assert runs == 0


PIECES = [bytes([65 + i]) * 50_000 for i in range(4)]  # more than one 64 KiB chunk


def test_streamed_responses_are_replayed_whole() -> None:
    runs = 0

    @idempotent(store=MemoryStore(), inline_limit=1000)
    def view(request: HttpRequest) -> StreamingHttpResponse:
        nonlocal runs
        runs += 1
        return StreamingHttpResponse(iter(PIECES), content_type="text/csv")

    first = body_of(view(post(1)))
    again = view(post(1))
    assert first == body_of(again) == b"".join(PIECES)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.headers["Content-Type"] == "text/csv"
    assert runs == 1


async def test_async_streamed_responses_are_replayed_whole() -> None:
    runs = 0

    async def content() -> AsyncIterator[bytes]:
        for piece in PIECES:
            yield piece

    @idempotent(store=MemoryStore(), inline_limit=1000)
    async def view(request: HttpRequest) -> StreamingHttpResponse:
        nonlocal runs
        runs += 1
        return StreamingHttpResponse(content(), content_type="text/csv")

    bodies = []
    for _ in range(2):
        response = await view(post(1))
        assert isinstance(response, StreamingHttpResponse)
        assert response.is_async
        bodies.append(b"".join([piece async for piece in response]))
    assert bodies == [b"".join(PIECES)] * 2
    assert response.headers["Idempotent-Replayed"] == "true"
    assert runs == 1


async def test_an_async_view_cancelled_mid_way_keeps_a_500() -> None:
    """Django's ASGI handler cancels the view of a client that went away: the
    retry must not run again what may have been half done."""
    started = asyncio.Event()
    runs = 0

    @idempotent(store=MemoryStore())
    async def view(request: HttpRequest) -> HttpResponse:
        nonlocal runs
        runs += 1
        started.set()
        await asyncio.sleep(3600)
        return HttpResponse()

    task = asyncio.ensure_future(view(post(1)))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # the record is written after the cancellation, not awaited
        retry = await view(post(1))
        if retry.status_code != 409:
            break
        await asyncio.sleep(0.01)
    assert retry.status_code == 500
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Content-Type"] == "application/problem+json"
    assert runs == 1


def test_the_projects_store_is_followed_when_the_application_is_rebuilt() -> None:
    """Without store=, the records go where get_app() keeps them, also after
    it was reset (settings changed; a test switched databases)."""
    from onceonly.contrib.django import get_app, reset

    middleware = IdempotencyMiddleware(lambda request: HttpResponse())
    first = middleware.front.policy
    assert first.store is get_app().store
    assert middleware.front.policy is first  # built once, not per request
    reset()
    assert middleware.front.policy.store is get_app().store is not first.store


def test_the_public_names_are_documented() -> None:
    import onceonly.contrib.django.idempotency as module

    assert set(module.__all__) == {
        "IdempotencyMiddleware",
        "RequestScope",
        "idempotent",
        "user_scope",
    }
    for name in ("IdempotencyMiddleware", "idempotent", "user_scope"):
        assert getattr(module, name).__doc__, name


class SlowStore(MemoryStore):
    """A store whose operations take 0.3 s while `slow` is set (the claim
    lands after that, as a commit that was already sent does)."""

    slow = False

    def _check(self) -> None:
        super()._check()
        if self.slow:
            time.sleep(0.3)


async def test_an_async_request_cancelled_during_its_claim_frees_the_key() -> None:
    """Cancelled while its claim is being made: the claim still lands, and is
    released, since the view never ran; the retry runs it, no 409 until the
    lock runs out."""
    store = SlowStore()
    runs = 0

    @idempotent(store=store)
    async def view(request: HttpRequest) -> HttpResponse:
        nonlocal runs
        runs += 1
        return HttpResponse(status=201)

    store.slow = True
    task = asyncio.ensure_future(view(post(1)))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    store.slow = False
    for _ in range(100):
        retry = await view(post(1))
        if retry.status_code != 409:
            break
        await asyncio.sleep(0.01)
    assert retry.status_code == 201
    assert "Idempotent-Replayed" not in retry.headers
    assert runs == 1


def test_a_decorated_views_template_response_is_rendered_and_kept() -> None:
    from django.template import engines
    from django.template.response import TemplateResponse

    template = engines["django"].from_string("order {{ number }}")
    runs = 0

    @idempotent(store=MemoryStore())
    def view(request: HttpRequest) -> TemplateResponse:
        nonlocal runs
        runs += 1
        return TemplateResponse(request, template, {"number": runs}, status=201)

    first, again = view(post(1)), view(post(1))
    assert first.content == again.content == b"order 1"
    assert again.headers["Idempotent-Replayed"] == "true"
    assert runs == 1


def test_an_async_view_decorated_as_a_sync_one_is_refused_and_frees_its_key() -> None:
    store = MemoryStore()

    async def handler(request: HttpRequest) -> HttpResponse:
        return HttpResponse()

    @idempotent(store=store)
    def dispatch(request: HttpRequest) -> Any:
        return handler(request)  # what an async class-based view's dispatch returns

    @idempotent(store=store)
    def fixed(request: HttpRequest) -> HttpResponse:
        return HttpResponse(status=201)

    with pytest.raises(ConfigurationError, match='name="post"'):
        dispatch(post(1))
    assert fixed(post(1)).status_code == 201  # the key was released, not left in flight


def test_a_stream_closed_before_it_was_read_is_still_recorded_whole() -> None:
    """The server gave up before sending the body (the client went away): the
    view's answer is recorded to its end, and the retry gets it replayed."""
    runs = 0

    @idempotent(store=MemoryStore(), inline_limit=1000)
    def view(request: HttpRequest) -> StreamingHttpResponse:
        nonlocal runs
        runs += 1
        return StreamingHttpResponse(iter(PIECES), content_type="text/csv")

    view(post(1)).close()
    again = view(post(1))
    assert again.headers["Idempotent-Replayed"] == "true"
    assert body_of(again) == b"".join(PIECES)
    assert runs == 1


async def test_under_asgi_async_views_keep_their_records_on_the_servers_loop() -> None:
    """An ASGI request's store work runs on its own loop, on a store of that
    loop's own for the project's database (no thread switch); a WSGI one's
    (asgiref's loop for one request) and an explicit store's on the
    background loop."""
    import io

    from django.core.handlers.asgi import ASGIRequest

    from onceonly.contrib.django import get_app, reset
    from onceonly.contrib.django.idempotency.streams import BACKGROUND, LOCAL

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/orders",
        "headers": [],
        "query_string": b"",
    }
    asgi = ASGIRequest(scope, io.BytesIO(b"{}"))
    front = IdempotencyMiddleware(lambda request: HttpResponse()).front
    policy, bridge = front._async_policy(asgi)
    assert bridge is LOCAL
    assert policy.store is not get_app().store
    assert policy.store.url == get_app().store.url  # the project's database
    assert front._async_policy(asgi) == (policy, LOCAL)  # one per loop, not per request
    assert front._async_policy(post(1)) == (front.policy, BACKGROUND)
    with override_settings(ONCEONLY_IDEMPOTENCY={"store": MemoryStore()}):
        explicit = IdempotencyMiddleware(lambda request: HttpResponse()).front
    assert explicit._async_policy(asgi)[1] is BACKGROUND
    reset()
    assert front._async_policy(asgi)[0] is not policy  # follows get_app() when it is rebuilt
