"""Hearing about failures from code: hooks, log fields and spans, on a real
SQLite file and a real PostgreSQL (docs/observability.md)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from onceonly import Event, Failure, NewEvent, Onceonly, create_store
from onceonly.context import Context
from onceonly.hooks import DEAD_HOOK_ACTION
from onceonly.providers import Stripe
from support import STRIPE_SECRET, live_server, stripe_delivery


def make_app(database_url: str, **options: Any) -> Onceonly:
    return Onceonly(
        database_url=database_url, environ={}, retry_base=0.01, max_attempts=2, **options
    )


def deliver(database_url: str, *event_ids: str) -> None:
    async def insert() -> None:
        async with create_store(database_url) as store:
            await store.insert_events(
                [NewEvent("stripe", e, "charge.succeeded", b"{}", {}) for e in event_ids]
            )

    asyncio.run(insert())


def rows(app: Onceonly, sql: str) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(sa.text(sql)).all())


#: What every log line about an event in the worker carries.
FIELDS = ("event_pk", "provider", "event_id", "event_type", "tenant", "attempt", "worker")


class Calls:
    """A hook that records what it was called with, thread-safely."""

    def __init__(self, fail_first: int = 0) -> None:
        self.failures: list[Failure] = []
        self.fail_first = fail_first
        self._lock = threading.Lock()

    def __call__(self, failure: Failure) -> None:
        with self._lock:
            self.failures.append(failure)
            if len(self.failures) <= self.fail_first:
                raise ConnectionError("the pager is down")

    def seen(self) -> list[tuple[str, int, bool]]:
        return [(f.event_id, f.attempt, f.dead) for f in self.failures]


def test_failed_hook_per_attempt_dead_hook_once_and_log_fields(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="onceonly")
    app = make_app(database_url)
    failed, dead = Calls(), []

    @app.handler("stripe")
    def handle(event: Event, ctx: Context) -> None:
        ctx.effect("grant", lambda key: key)
        if event.event_id == "evt_bad":
            raise ValueError(f"no such customer (attempt {ctx.attempt})")

    @app.on_attempt_failed
    def broken(failure: Failure) -> None:
        raise RuntimeError("the hook itself is broken")

    app.on_attempt_failed(failed)

    @app.on_dead
    async def page(failure: Failure) -> None:
        await asyncio.sleep(0)
        dead.append(failure)

    deliver(database_url, "evt_bad", "evt_ok")
    worker = app.worker(name="w-hooks")
    worker.run_until_idle()
    # The broken hook before it did not stop the next one, nor the worker.
    assert failed.seen() == [("evt_bad", 1, False), ("evt_bad", 2, True)]
    assert isinstance(failed.failures[0].exception, ValueError)
    assert failed.failures[0].error == "no such customer (attempt 1)"
    assert failed.failures[0].worker == "w-hooks"
    assert [(f.event_id, f.attempt, f.dead, f.error_type) for f in dead] == [
        ("evt_bad", 2, True, "ValueError")
    ]
    assert dead[0].key.startswith("oo-outbox-")
    assert "no such customer (attempt 2)" in dead[0].traceback
    status = {
        r.event_id: r.status for r in rows(app, "SELECT event_id, status FROM onceonly_events")
    }
    assert status == {"evt_bad": "dead", "evt_ok": "processed"}
    # Another worker later: the hook's call is remembered as sent.
    app.worker().run_until_idle()
    assert len(dead) == 1
    assert [r.status for r in rows(app, "SELECT status FROM onceonly_outbox")] == ["sent"]

    # Every line about an event carries its fields.
    bad = rows(app, "SELECT id FROM onceonly_events WHERE event_id = 'evt_bad'")[0].id
    about: dict[str, list[logging.LogRecord]] = {}
    for record in caplog.records:
        if record.name.startswith("onceonly.") and record.getMessage().startswith("event "):
            missing = [name for name in FIELDS if not hasattr(record, name)]
            assert not missing, (record.getMessage(), missing)
            about.setdefault(record.getMessage(), []).append(record)
    messages = list(about)
    for wanted in ("claimed (attempt 1)", "attempt 1/2 failed", "now dead", "processed by"):
        assert any(wanted in m for m in messages), (wanted, messages)
    assert any("effect 'grant' called and recorded" in m for m in messages), messages
    assert any("failed-attempt hook" in m and "raised" in m for m in messages), messages
    failure = next(r for m, rs in about.items() if "attempt 2/2 failed" in m for r in rs)
    fields = {name: getattr(failure, name) for name in FIELDS}
    assert fields == {
        "event_pk": bad,
        "provider": "stripe",
        "event_id": "evt_bad",
        "event_type": "charge.succeeded",
        "tenant": "",
        "attempt": 2,
        "worker": "w-hooks",
    }


def test_dead_hook_called_once_after_a_crash_before_its_call(database_url: str) -> None:
    app = make_app(database_url)
    dead = Calls(fail_first=1)

    @app.handler("stripe")
    def handle(event: Event, ctx: Context) -> None:
        raise ValueError("always")

    app.on_dead(dead)
    deliver(database_url, "evt_dies")
    crashed = app.worker(name="crashed")
    # The worker dies right after the commit that marked the event dead:
    # nothing after it runs (its runner never sends, nor sweeps).
    crashed.outbox.run_for = lambda event_pks: None  # type: ignore[method-assign]
    crashed.outbox.sweep = lambda n=50: None  # type: ignore[method-assign]
    crashed.run_until_idle()
    assert dead.failures == []
    assert [r.status for r in rows(app, "SELECT status FROM onceonly_events")] == ["dead"]
    assert [
        (r.action, r.status) for r in rows(app, "SELECT action, status FROM onceonly_outbox")
    ] == [(DEAD_HOOK_ACTION, "pending")]

    restarted = app.worker(name="restarted")
    restarted.run_until_idle()
    # The pager was down for the first call: retried after its backoff, same key.
    time.sleep(0.05)
    restarted.outbox.sweep()
    assert dead.seen() == [("evt_dies", 2, True), ("evt_dies", 2, True)]
    assert len({f.key for f in dead.failures}) == 1
    assert {f.worker for f in dead.failures} == {"crashed"}  # who ran the attempt
    app.worker().run_until_idle()
    assert len(dead.failures) == 2
    assert [r.status for r in rows(app, "SELECT status FROM onceonly_outbox")] == ["sent"]


def attribute(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes[name]


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


async def test_one_event_one_trace_from_receive_to_effect(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="onceonly.receiver")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = make_app(
        database_url, providers={"stripe": Stripe(STRIPE_SECRET)}, tracer_provider=provider
    )

    @app.handler("stripe")
    def handle(event: Event, ctx: Context) -> None:
        ctx.effect("grant", lambda key: key)
        if ctx.attempt == 1:
            raise ConnectionError("the API blinked")

    body, headers = stripe_delivery("evt_traced")
    sender_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    # The sender's trace context is its claim: a link at most, never a parent;
    # its onceonly-traceparent is dropped.
    headers["traceparent"] = f"00-{sender_trace}-00f067aa0ba902b7-01"
    headers["onceonly-traceparent"] = f"00-{'1' * 32}-{'2' * 16}-01"
    with live_server(app.asgi()) as url:
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"{url}/webhooks/stripe", content=body, headers=headers)
    assert answer.status_code == 200
    (received,) = [r for r in caplog.records if r.getMessage().endswith("received")]
    assert (received.provider, received.event_id, received.duplicate) == (  # type: ignore[attr-defined]
        "stripe",
        "evt_traced",
        False,
    )
    await asyncio.to_thread(app.worker().run_until_idle)

    spans = _by_name(exporter.get_finished_spans())
    (receive,) = spans["onceonly.receive"]
    (commit,) = spans["onceonly.commit"]
    handles = sorted(spans["onceonly.handle"], key=lambda s: int(attribute(s, "onceonly.attempt")))
    effects = spans["onceonly.effect"]
    trace_id = receive.context.trace_id
    assert f"{trace_id:032x}" != sender_trace
    assert receive.parent is None
    assert [link.context.trace_id for link in receive.links] == [int(sender_trace, 16)]
    # Both attempts and their effects are in the event's trace, under its receive.
    assert len(handles) == 2
    assert len(effects) == 2
    for handle_span in handles:
        assert handle_span.context.trace_id == trace_id
        assert handle_span.parent is not None
        assert handle_span.parent.span_id == receive.context.span_id
    for effect in effects:
        assert effect.context.trace_id == trace_id
        assert effect.parent is not None
        assert effect.parent.span_id in {h.context.span_id for h in handles}
    assert sorted(bool(attribute(e, "onceonly.effect.reused")) for e in effects) == [False, True]
    assert handles[0].status.status_code is StatusCode.ERROR
    assert handles[1].status.status_code is not StatusCode.ERROR
    assert attribute(handles[0], "onceonly.event_id") == "evt_traced"
    # The group commit is a trace of its own, linked to each request it held,
    # and so are the claims, linked to the events they took.
    assert commit.context.trace_id != trace_id
    assert [link.context.span_id for link in commit.links] == [receive.context.span_id]
    claimed = [s for s in spans["onceonly.claim"] if s.links]
    assert claimed
    assert all(link.context.trace_id == trace_id for s in claimed for link in s.links)
    stored = rows(app, "SELECT headers FROM onceonly_events")[0].headers
    stored = json.loads(stored) if isinstance(stored, str) else stored
    # (The flags after the ids are the SDK's: sampled, maybe a random trace id.)
    ours = f"00-{trace_id:032x}-{receive.context.span_id:016x}-"
    assert stored["onceonly-traceparent"].startswith(ours)
