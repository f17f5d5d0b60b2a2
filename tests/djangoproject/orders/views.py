"""The conformance shop (tests/integration/idempotency/test_idempotency.py's
``Shop``) as Django views: sync ones for WSGI, async ones for ASGI.

Runs are counted in files under ``ONCEONLY_TEST_DJANGO_RUNS`` (one byte a
run, appended under a lock): the server's processes and threads share them,
and the test reads them.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from django.contrib.auth import get_user_model, login
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.csrf import csrf_exempt

from onceonly.contrib.django.idempotency import idempotent

REPORT_LINES = 3 * 1024  # 3 MiB in 1 KiB pieces
TRICKLE = 10  # pieces, 50 ms apart


def count(name: str) -> int:
    """Count one run of `name`; how many there have been, this one included."""
    path = Path(os.environ["ONCEONLY_TEST_DJANGO_RUNS"]) / name
    with path.open("ab") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        out.write(b".")
        out.flush()
        return out.tell()


def _line(i: int) -> bytes:
    return (f"{i:08d}" + "x" * 1015 + "\n").encode()


def _order(request: HttpRequest) -> JsonResponse:
    number = count("orders")
    response = JsonResponse({"id": number, **json.loads(request.body)}, status=201)
    response["Location"] = f"/orders/{number}"
    response.set_cookie("session", "abc")
    return response


def _failed() -> HttpResponse:
    # The payment provider failed and the view says so; Django's own page for
    # a view that raises is tested through the decorated view.
    return HttpResponse(b"Internal Server Error: payment provider exploded", status=500)


def _invalid() -> JsonResponse:
    return JsonResponse({"error": "amount must be positive"}, status=422)


# Sync views (WSGI).


@csrf_exempt
def create_order(request: HttpRequest) -> HttpResponse:
    return _order(request)


@csrf_exempt
def slow(request: HttpRequest) -> HttpResponse:
    runs = count("slow")
    time.sleep(0.5)
    return JsonResponse({"run": runs}, status=201)


@csrf_exempt
def boom(request: HttpRequest) -> HttpResponse:
    count("boom")
    return _failed()


@csrf_exempt
def invalid(request: HttpRequest) -> HttpResponse:
    count("invalid")
    return _invalid()


@csrf_exempt
def report(request: HttpRequest) -> StreamingHttpResponse:
    count("report")
    return StreamingHttpResponse(map(_line, range(REPORT_LINES)), content_type="text/plain")


@csrf_exempt
def trickle(request: HttpRequest) -> StreamingHttpResponse:
    count("trickle")

    def pieces() -> Iterator[bytes]:
        for i in range(TRICKLE):
            time.sleep(0.05)
            yield _line(i)

    return StreamingHttpResponse(pieces(), content_type="text/plain")


@csrf_exempt
def whoami(request: HttpRequest) -> HttpResponse:
    """An order placed by the logged-in user (or an anonymous client)."""
    number = count("whoami")
    return JsonResponse({"id": number, "user": request.user.get_username()}, status=201)


# Async views (ASGI).


@csrf_exempt
async def acreate_order(request: HttpRequest) -> HttpResponse:
    return _order(request)


@csrf_exempt
async def aslow(request: HttpRequest) -> HttpResponse:
    runs = count("slow")
    await asyncio.sleep(0.5)
    return JsonResponse({"run": runs}, status=201)


@csrf_exempt
async def aboom(request: HttpRequest) -> HttpResponse:
    count("boom")
    return _failed()


@csrf_exempt
async def ainvalid(request: HttpRequest) -> HttpResponse:
    count("invalid")
    return _invalid()


@csrf_exempt
async def areport(request: HttpRequest) -> StreamingHttpResponse:
    count("report")

    async def lines() -> AsyncIterator[bytes]:
        for i in range(REPORT_LINES):
            yield _line(i)

    return StreamingHttpResponse(lines(), content_type="text/plain")


@csrf_exempt
async def atrickle(request: HttpRequest) -> StreamingHttpResponse:
    count("trickle")

    async def pieces() -> AsyncIterator[bytes]:
        for i in range(TRICKLE):
            await asyncio.sleep(0.05)
            yield _line(i)

    return StreamingHttpResponse(pieces(), content_type="text/plain")


@csrf_exempt
async def awhoami(request: HttpRequest) -> HttpResponse:
    number = count("whoami")
    user = await request.auser()
    return JsonResponse({"id": number, "user": user.get_username()}, status=201)


# Logging in through Django's auth (sessions, AuthenticationMiddleware). By
# name alone: a test project, whose users the test makes without passwords.


@csrf_exempt
def log_in(request: HttpRequest) -> HttpResponse:
    user = get_user_model().objects.get(username=request.POST["username"])
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return HttpResponse(status=204)


# Decorated views: Idempotency-Key on these only (the project without the middleware).


@method_decorator(csrf_exempt, name="dispatch")
@method_decorator(idempotent(required=True), name="post")
class Refund(View):
    """A class-based view; its POST requires a key and raises on its first
    runs: Django's 500 page is what is kept and replayed."""

    def post(self, request: HttpRequest) -> HttpResponse:
        runs = count("refund")
        if json.loads(request.body).get("fail"):
            raise RuntimeError("the refund failed half-way")
        return JsonResponse({"refund": runs}, status=201)


@csrf_exempt
@idempotent(required=True)
async def acapture(request: HttpRequest) -> HttpResponse:
    runs = count("capture")
    if json.loads(request.body).get("fail"):
        raise RuntimeError("the capture failed half-way")
    return JsonResponse({"capture": runs}, status=201)
