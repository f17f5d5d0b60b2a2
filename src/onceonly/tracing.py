"""OpenTelemetry spans, when the ``otel`` extra is installed and configured.

One event, one trace: ``onceonly.receive`` (a delivery, until the commit
that holds its event) is the root the event's later spans hang from. Its
context is stored with the event, as the ``onceonly-traceparent`` header (W3C
format), so the worker's ``onceonly.handle`` span for each attempt is a child
of it, whatever machine and however much later; ``onceonly.effect`` spans
(one per ``ctx.effect``) are children of the attempt's. The group commit a
request shares with others is one ``onceonly.commit`` span linked to each
request's receive span, and a worker's claim is one ``onceonly.claim`` span
linked to the events it claimed.

A sender's own ``traceparent`` header is written by whoever sent the request:
it is never a parent (a hostile sender could graft our spans onto any trace,
or name one trace for every event), only a link on the receive span. A
sender's ``onceonly-traceparent`` header is never stored.

Without ``opentelemetry-api`` this module imports nothing and every span is
``None``: the hot paths ask :attr:`Tracing.enabled` once and skip the rest. A
:class:`Tracing` decides once, when it is built: on when a tracer provider is
given, or when the API is installed and a real (SDK) provider is set globally
by then; off otherwise, or when asked to be.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ._exceptions import ConfigurationError
from ._version import __version__

if TYPE_CHECKING:
    from opentelemetry.context import Context as OtelContext
    from opentelemetry.trace import Link, Span, SpanContext, Tracer

__all__ = ["TRACEPARENT_HEADER", "Attributes", "Tracing"]

#: The stored header that carries an event's receive span context.
TRACEPARENT_HEADER = "onceonly-traceparent"

Attributes = Mapping[str, str | bool | int | float]


class Tracing:
    """A deployment's tracer, or nothing (:attr:`enabled` False)."""

    __slots__ = ("_tracer", "enabled")

    def __init__(self, tracer: Tracer | None = None) -> None:
        self._tracer = tracer
        #: Whether spans are made; when False every method is a no-op.
        self.enabled = tracer is not None

    @classmethod
    def create(cls, *, enabled: bool | None = None, provider: Any = None) -> Tracing:
        """Tracing for a deployment: `enabled` None decides by what is installed
        and configured; True insists (an error without the API); False is off."""
        if enabled is False:
            return cls()
        try:
            from opentelemetry import trace
        except ImportError:
            if enabled or provider is not None:
                raise ConfigurationError(
                    "tracing needs opentelemetry-api: pip install 'onceonly[otel]'"
                ) from None
            return cls()
        # The API's default provider makes non-recording spans: paying for them
        # would buy nothing, so stay off until an SDK is set up.
        unconfigured = isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        if provider is None and not enabled and unconfigured:
            return cls()
        return cls(trace.get_tracer("onceonly", __version__, tracer_provider=provider))

    # Spans.

    @contextlib.contextmanager
    def span(
        self,
        name: str,
        attributes: Attributes | None = None,
        *,
        parent: str | None = None,
        root: bool = False,
        links: Iterable[str | None] = (),
    ) -> Iterator[Span | None]:
        """A span, current for the block; `parent` a traceparent (``None``:
        the current span), `root` a new trace, `links` traceparents."""
        if self._tracer is None:
            yield None
            return
        context = _context(parent) if parent else None
        if root and context is None:
            from opentelemetry.context import Context

            context = Context()
        with self._tracer.start_as_current_span(
            name, context=context, attributes=attributes, links=_links(links)
        ) as span:
            yield span

    def record(
        self,
        name: str,
        started_ns: int,
        attributes: Attributes | None = None,
        *,
        links: Iterable[str | None] = (),
    ) -> None:
        """A span that began at `started_ns` (``time.time_ns()``) and ends now,
        in a trace of its own: for work known to be worth a span only once done
        (a claim that found events)."""
        if self._tracer is None:
            return
        from opentelemetry.context import Context

        span = self._tracer.start_span(
            name,
            context=Context(),
            attributes=attributes,
            links=_links(links),
            start_time=started_ns,
        )
        span.end(time.time_ns())

    @staticmethod
    def failed(span: Span | None, exc: BaseException) -> None:
        """Mark `span` as failed with `exc` (an error caught, not raised through it)."""
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:200]))

    @staticmethod
    def traceparent(span: Span | None) -> str | None:
        """`span`'s context in W3C ``traceparent`` format; None for no span."""
        if span is None:
            return None
        found = span.get_span_context()
        if not found.is_valid:
            return None
        return f"00-{found.trace_id:032x}-{found.span_id:016x}-{int(found.trace_flags):02x}"


def _span_context(traceparent: str) -> SpanContext | None:
    """The span context a W3C ``traceparent`` names, or None if malformed
    (the propagator validates lengths, hex and the all-zero ids)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract({"traceparent": traceparent[:100]})
    found = trace.get_current_span(context).get_span_context()
    return found if found.is_valid else None


def _context(traceparent: str) -> OtelContext | None:
    found = _span_context(traceparent)
    if found is None:
        return None
    from opentelemetry import trace

    return trace.set_span_in_context(trace.NonRecordingSpan(found))


def _links(traceparents: Iterable[str | None]) -> list[Link]:
    from opentelemetry.trace import Link

    links = []
    for traceparent in traceparents:
        found = _span_context(traceparent) if traceparent else None
        if found is not None:
            links.append(Link(found))
    return links
