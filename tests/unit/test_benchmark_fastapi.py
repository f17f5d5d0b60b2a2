"""benchmarks/idempotency.py --app fastapi: the FastAPI endpoint does the work
of the Starlette one, and the middleware around it replays its answers.

A file of its own: FastAPI needs a newer Starlette than onceonly's lower bound,
so .ci/run's pass at the lower bounds leaves it out (pass 1 runs it)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_the_fastapi_endpoint_does_the_starlette_endpoints_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--app fastapi measures the same work written for FastAPI: the same request
    gets a 201 with the same fields from both apps; wrapped in the middleware,
    the FastAPI app stores its answer and replays it to a repeat."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency
    import idempotency_app
    import idempotency_cpu

    headers, body = idempotency.cycle_request("t", 0, 7)

    async def post_twice(app_kind: str, database_url: str | None) -> list[httpx.Response]:
        app = idempotency_app.build(database_url, 1 << 20, app_kind=app_kind)
        task, inbox = await idempotency_cpu._lifespan(app)
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                return [
                    await client.post("/orders", headers=headers, content=body) for _ in range(2)
                ]
        finally:
            await inbox.put({"type": "lifespan.shutdown"})
            await task

    try:
        bare = {kind: asyncio.run(post_twice(kind, None)) for kind in idempotency_app.APPS}
        for kind, answers in bare.items():
            assert [a.status_code for a in answers] == [201, 201], kind
            assert answers[0].json()["id"] != answers[1].json()["id"], kind  # no middleware
        starlette, fastapi = (bare[kind][0].json() for kind in idempotency_app.APPS)
        assert {k: v for k, v in fastapi.items() if k not in ("id", "created")} == {
            k: v for k, v in starlette.items() if k not in ("id", "created")
        }
        assert fastapi["amount"] == 3 * 1250
        assert fastapi["customer"] == "cus_t7"
        first, again = asyncio.run(post_twice("fastapi", "memory://"))
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.content == first.content
        with pytest.raises(ValueError, match="unknown app 'flask'"):
            idempotency_app.build(None, 0, app_kind="flask")
        assert idempotency.parse_args([]).app == "starlette"
        assert idempotency.parse_args(["--app", "fastapi"]).app == "fastapi"
        assert idempotency.server_argv(1, "fresh", None, "fastapi")[-2:] == ["--app", "fastapi"]
        with pytest.raises(SystemExit):
            idempotency.parse_args(["--app", "django"])
    finally:
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "idempotency_fastapi"):
            sys.modules.pop(name, None)
        sys.modules.pop("_harness", None)


def test_the_fastapi_app_serves_the_group_commit_counters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With --stats, the FastAPI app answers GET /_group-commit as the Starlette
    one does (benchmarks/idempotency.py reads it around each measurement)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency
    import idempotency_app
    import idempotency_cpu

    headers, body = idempotency.cycle_request("gcf", 0, 1)

    async def counters() -> dict[str, float]:
        app = idempotency_app.build("memory://", 1 << 20, stats=True, app_kind="fastapi")
        task, inbox = await idempotency_cpu._lifespan(app)
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                assert (await client.post("/orders", headers=headers, content=body)).is_success
                answer = await client.get(idempotency_app.STATS_PATH)
                assert answer.status_code == 200
                data: dict[str, float] = answer.json()
                return data
        finally:
            await inbox.put({"type": "lifespan.shutdown"})
            await task

    try:
        data = asyncio.run(counters())
        assert (data["batches"], data["items"]) == (2, 2)  # its claim, its completion
    finally:
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "idempotency_fastapi"):
            sys.modules.pop(name, None)
        sys.modules.pop("_harness", None)
