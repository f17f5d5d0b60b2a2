"""Log fields as JSON, the tracing shim, and the hooks' registration."""

from __future__ import annotations

import io
import json
import logging
import sys
from datetime import date

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from onceonly import ConfigurationError, Delivery, EventInfo, Failure, Inbox, Onceonly
from onceonly.cli import main
from onceonly.cli.options import configure_logging
from onceonly.logs import JsonFormatter
from onceonly.providers import Stripe
from onceonly.store.memory import MemoryStore
from onceonly.tracing import TRACEPARENT_HEADER, Tracing
from support import STRIPE_SECRET, stripe_delivery


def test_json_lines_carry_the_extra_fields_and_the_traceback() -> None:
    logger = logging.getLogger("onceonly.test")
    try:
        raise ValueError("boom")
    except ValueError:
        record = logger.makeRecord(
            logger.name,
            logging.WARNING,
            __file__,
            1,
            "event %s failed",
            (7,),
            sys.exc_info(),
            extra={"event_pk": 7, "provider": "stripe", "tenant": "acme", "day": date(2026, 1, 2)},
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["message"] == "event 7 failed"
    assert (data["level"], data["logger"]) == ("warning", "onceonly.test")
    # Fields nobody planned for (a tenant) come out too; what JSON cannot hold, as text.
    assert (data["event_pk"], data["provider"], data["tenant"]) == (7, "stripe", "acme")
    assert data["day"] == "2026-01-02"
    assert "ValueError: boom" in data["exception"]
    assert "args" not in data
    assert "levelno" not in data


def test_the_cli_writes_json_lines_when_asked() -> None:
    for command in ("worker", "serve"):
        options = {opt for p in main.commands[command].params for opt in p.opts}
        assert "--log-format" in options, command
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    # As in a fresh CLI process: no handler yet (pytest's own are put back).
    root.handlers = []
    try:
        configure_logging("info", "json")
        (handler,) = root.handlers
        out = io.StringIO()
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(out)
        logging.getLogger("onceonly.worker").warning("event 3 dead", extra={"event_pk": 3})
        logging.getLogger("onceonly.worker").debug("not at info")
    finally:
        root.handlers, level = saved
        root.setLevel(level)
    (line,) = out.getvalue().splitlines()
    data = json.loads(line)
    assert (data["message"], data["event_pk"], data["logger"]) == (
        "event 3 dead",
        3,
        "onceonly.worker",
    )


def test_tracing_is_off_without_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails
    assert not Tracing.create().enabled
    with pytest.raises(ConfigurationError, match=r"onceonly\[otel\]"):
        Tracing.create(enabled=True)
    off = Tracing.create()
    with off.span("onceonly.receive") as span:
        assert span is None
    off.record("onceonly.claim", 0)
    assert off.traceparent(span) is None


def test_tracing_stays_off_until_an_sdk_is_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", trace.ProxyTracerProvider)
    assert not Tracing.create().enabled
    assert Tracing.create(enabled=True).enabled
    assert not Tracing.create(enabled=False, provider=TracerProvider()).enabled
    assert Tracing.create(provider=TracerProvider()).enabled


def test_stored_traceparents_make_children_and_garbage_makes_roots() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing.create(provider=provider)
    with tracing.span("onceonly.receive") as receive:
        traceparent = tracing.traceparent(receive)
    assert traceparent is not None
    with tracing.span("onceonly.handle", parent=traceparent, root=True):
        pass
    for garbage in ("garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01", "x" * 10_000):
        with tracing.span("onceonly.handle", parent=garbage, root=True, links=(garbage, None)):
            pass
    first, child, *roots = exporter.get_finished_spans()
    assert child.parent is not None
    assert child.parent.span_id == first.context.span_id
    assert child.context.trace_id == first.context.trace_id
    assert [(s.parent, s.links) for s in roots] == [(None, ())] * 3
    assert len({s.context.trace_id for s in roots}) == 3


class Iterating(Stripe):
    """A provider that looks at every header (so every header would be kept)."""

    def identify(self, delivery: Delivery) -> EventInfo:
        dict(delivery.headers)
        return super().identify(delivery)


async def test_a_senders_onceonly_traceparent_is_never_stored() -> None:
    store = MemoryStore()
    inbox = Inbox(store, {"stripe": Iterating(STRIPE_SECRET)})
    body, headers = stripe_delivery("evt_forged")
    headers[TRACEPARENT_HEADER] = f"00-{'1' * 32}-{'2' * 16}-01"
    headers["x-kept"] = "yes"
    await inbox.receive(Delivery("stripe", body, headers))
    (stored,) = store.events.values()
    assert stored.headers["x-kept"] == "yes"  # what was looked at is kept...
    assert TRACEPARENT_HEADER not in stored.headers  # ...but never that one


def test_hooks_are_registered_and_survive_replace() -> None:
    app = Onceonly(database_url="sqlite:///unused.db", environ={})

    @app.on_dead
    def page(failure: Failure) -> None: ...

    @app.on_attempt_failed
    async def count(failure: Failure) -> None: ...

    twin = app.replace(database_url="sqlite:///other.db")
    assert list(twin.hooks.dead.values()) == [page]
    assert twin.hooks.failed == [count]
    with pytest.raises(ConfigurationError, match="already registered"):
        app.on_dead(page)
