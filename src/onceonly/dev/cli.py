"""``onceonly dev``: a fake gateway for local development and tests."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click
import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._click import FORMAT as _FORMAT
from .._exceptions import ConfigurationError
from ..providers import PROVIDER_CLASSES
from ..providers.base import env_name
from .api import DEFAULT_TOKEN, KINDS, FakeApi
from .delivery import DeliveryReport, DeliveryStats, Faults, Outgoing, Sender
from .gateway import prepare_events, provider_for, receiver_url, record_deliveries
from .payloads import (
    DEFAULT_EVENT_TYPES,
    PaymentFacts,
    api_objects,
    build_event,
    default_object_id,
)
from .schedules import policy_for
from .servers import serve_in_thread

__all__ = ["dev"]

FC = TypeVar("FC", bound=Callable[..., Any])

console = Console()
errors = Console(stderr=True)

_PROVIDER = click.argument("provider", type=click.Choice(sorted(PROVIDER_CLASSES)))
_SECRET = click.option(
    "--secret",
    metavar="SECRET",
    help="Secret (token) to sign with. [default: the first of ONCEONLY_<PROVIDER>_SECRET, "
    "the receiver's own setting]",
)


def _chance(flag: str, what: str) -> Callable[[FC], FC]:
    """A fault option: the probability, 0 to 1 (off by default), that `what` happens."""
    return click.option(
        flag,
        default=0.0,
        show_default=True,
        type=click.FloatRange(0, 1),
        help=f"Chance that {what}",
    )


def _fail_cleanly(fn: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigurationError as exc:
            errors.print(f"[red]configuration error:[/red] {exc}")
            sys.exit(2)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


@click.group()
def dev() -> None:
    """A fake gateway that behaves like a provider, for local development and tests.

    It signs deliveries exactly as the provider does, retries them on the
    provider's schedule (sped up if you like), and serves the objects its
    events point to at the provider's API paths, so a handler that fetches the
    real state finds them. See docs/dev.md.
    """


@dev.command("gateway")
@_PROVIDER
@click.option(
    "--target",
    required=True,
    metavar="URL",
    help="Your receiver: a base URL (http://127.0.0.1:8000 means /webhooks/PROVIDER) "
    "or the full webhook URL.",
)
@click.option("--events", "count", default=20, show_default=True, type=click.IntRange(1))
@click.option("--event-type", help="Event type to send. [default: the provider's 'paid' event]")
@_SECRET
@click.option(
    "--speedup",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Divide the provider's retry delays and timeout by this (3600: an hour in a second).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds to wait for an answer. [default: the provider's, sped up, at least 1 s]",
)
@_chance("--duplicates", "an attempt goes out as two identical requests at once.")
@_chance(
    "--timeouts",
    "the gateway stops waiting after a few milliseconds (it retries; "
    "your receiver may or may not have committed).",
)
@_chance("--lost-acks", "your 2xx is lost on the way back (it retries an event you stored).")
@_chance(
    "--lose",
    "an event is lost for good: never delivered (onceonly reconcile, reading the fake "
    "API's listings, finds it).",
)
@click.option(
    "--spread",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Start the events at random moments within this many seconds: out of order.",
)
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(1, 1024))
@click.option("--seed", type=int, help="Same seed, same events and same faults.")
@click.option(
    "--port",
    default=8001,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port of the fake provider API (0: any free port).",
)
@click.option(
    "--api-status",
    metavar="STATUS",
    help="Status the API reports for the payments (e.g. pending), whatever the events claim.",
)
@click.option(
    "--serve/--exit",
    "keep_serving",
    default=True,
    show_default=True,
    help="After the deliveries, keep serving the API until Ctrl-C (your worker may "
    "fetch later), or exit.",
)
@_FORMAT
@_fail_cleanly
def gateway(
    provider: str,
    target: str,
    count: int,
    event_type: str | None,
    secret: str | None,
    speedup: float,
    timeout: float | None,
    duplicates: float,
    timeouts: float,
    lost_acks: float,
    lose: float,
    spread: float,
    concurrency: int,
    seed: int | None,
    port: int,
    api_status: str | None,
    keep_serving: bool,
    fmt: str,
) -> None:
    """Play PROVIDER's gateway against your receiver: its API and its deliveries.

    Starts the fake provider API on --port (the objects the events point to,
    at the provider's real paths), then delivers --events payment events to
    --target, signed as PROVIDER signs them and retried on PROVIDER's schedule
    (divided by --speedup): a timeout, a connection error or an answer the
    provider does not count as success (Asaas: anything but 200) means another
    attempt. Prints what happened: requests, resends, acknowledged events,
    resends your receiver answered as duplicates.

    \b
    Examples:
      # your receiver: ONCEONLY_STRIPE_SECRET=whsec_dev onceonly serve
      onceonly dev gateway stripe --target http://127.0.0.1:8000 --secret whsec_dev
      # a bad day, an hour of retries per second, 500 events
      onceonly dev gateway asaas --target localhost:8000 --events 500 --speedup 3600 \\
          --duplicates 0.1 --timeouts 0.05 --lost-acks 0.05 --spread 2
      # the event says paid, the API says pending: does your handler check?
      onceonly dev gateway mercadopago --target localhost:8000 --api-status pending
      # 10% never delivered; then: onceonly reconcile stripe
      onceonly dev gateway stripe --target localhost:8000 --lose 0.1 --seed 1
    """
    signer = provider_for(provider, secret)
    url = receiver_url(target, provider)
    faults = Faults(
        duplicates=duplicates, timeouts=timeouts, lost_acks=lost_acks, spread=spread, lost=lose
    )
    api = FakeApi()
    events = prepare_events(
        provider, count, event_type=event_type, seed=seed, api=api, api_status=api_status
    )
    policy = policy_for(provider)
    with serve_in_thread(api, port=port, lifespan="off") as api_url:
        if fmt == "table":
            _announce(provider, url, api_url, policy.source, speedup)
        sender = Sender(
            signer,
            url,
            policy=policy,
            speedup=speedup,
            timeout=timeout,
            faults=faults,
            concurrency=concurrency,
            seed=seed,
        )
        try:
            report = _deliver(sender, events, show_progress=fmt == "table")
        except KeyboardInterrupt:
            errors.print(
                f"interrupted: {sender.stats.acknowledged} of {count} events acknowledged, "
                f"{sender.stats.requests} requests sent"
            )
            sys.exit(130)
        record_deliveries(api, provider, report, url)
        if fmt == "json":
            click.echo(json.dumps(_report_dict(report, url, api_url), indent=2))
        else:
            _print_summary(report)
        if keep_serving:
            errors.print(f"The fake API is still serving at {api_url}; Ctrl-C to stop.")
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    # Events lost on purpose (--lose) are not a failure of the run.
    if any(not report.outcomes[e].lost for e in report.undelivered):
        sys.exit(1)


def _announce(provider: str, url: str, api_url: str, source: str, speedup: float) -> None:
    errors.print(f"[bold]{provider}[/bold] gateway delivering to {url}")
    if provider in KINDS:
        base, token = env_name(provider, "API_BASE"), env_name(provider, "API_TOKEN")
        errors.print(f"fake API at {api_url}: set {base}={api_url} {token}={DEFAULT_TOKEN}")
    errors.print(f"retries: {source}" + (f" Sped up {speedup:g}x." if speedup != 1 else ""))


def _deliver(sender: Sender, events: list[Outgoing], *, show_progress: bool) -> DeliveryReport:
    if not show_progress:
        return asyncio.run(sender.deliver(events))
    progress = Progress(
        TextColumn("delivering"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        console=errors,
    )
    task = progress.add_task("", total=len(events), detail="")
    last = [0.0]

    def update(stats: DeliveryStats) -> None:
        now = time.monotonic()
        if now - last[0] < 0.1 and stats.finished < stats.events:
            return
        last[0] = now
        progress.update(
            task,
            completed=stats.finished,
            detail=f"{stats.requests} requests, {stats.retries} resends, "
            f"{stats.duplicates_answered} answered duplicate",
        )

    sender.on_attempt = update
    with progress:
        return asyncio.run(sender.deliver(events))


def _report_dict(report: DeliveryReport, url: str, api_url: str) -> dict[str, Any]:
    return {
        "target": url,
        "api": api_url,
        "seconds": round(report.elapsed, 3),
        **report.stats.to_dict(),
        "undelivered": report.undelivered,
        "lost_events": [o.event_id for o in report.outcomes.values() if o.lost],
        "attempts_per_event": {
            o.event_id: o.answers for o in report.outcomes.values() if o.attempts > 1
        },
    }


def _print_summary(report: DeliveryReport) -> None:
    s = report.stats
    table = Table(title="deliveries", title_justify="left", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    rows = [
        ("events", s.events),
        ("requests sent", s.requests),
        ("resends (retries)", s.retries),
        ("sent twice at once (extra copies)", s.concurrent_copies),
        ("timeouts", s.timeouts),
        ("connection errors", s.connection_errors),
        ("2xx lost on the way back (injected)", s.lost_acks),
        ("acknowledged events", s.acknowledged),
        ("answered as duplicates", s.duplicates_answered),
        ("given up", s.given_up),
        ("lost for good (injected; reconcile finds them)", s.lost),
    ]
    for label, value in rows:
        table.add_row(label, str(value))
    table.add_row("answers", ", ".join(f"{k}: {v}" for k, v in sorted(s.statuses.items())) or "-")
    console.print(table)
    if s.paused:
        console.print("[yellow]The queue paused after too many failures in a row (Asaas).[/]")
    if s.disabled:
        console.print("[yellow]The receiver answered 410: the endpoint was disabled.[/]")
    failed = [e for e in report.undelivered if not report.outcomes[e].lost]
    if failed:
        console.print(f"[red]{len(failed)} event(s) not delivered[/red]")
    console.print(f"took {report.elapsed:.1f} s")


@dev.command("send")
@_PROVIDER
@click.option(
    "--event-type",
    help="The event type (Stripe's payment_intent.succeeded, Asaas's PAYMENT_RECEIVED, "
    "Shopify's topic...). [default: the provider's 'paid' event]",
)
@click.option(
    "--url",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="Your receiver: a base URL (means /webhooks/PROVIDER) or the full webhook URL.",
)
@_SECRET
@click.option("--event-id", help="The event id to send (a resend: use the same one twice).")
@click.option(
    "--data-id",
    help="Id of the object the event points to (payment, order). [default: a new one]",
)
@click.option(
    "--body",
    "body_file",
    type=click.File("rb"),
    help="Send this file's bytes as the body instead (signed as they are; - for stdin).",
)
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(min=0.001))
@click.option(
    "--api",
    metavar="URL",
    help="Also store the object at a running fake API (onceonly dev gateway's), "
    "via its /_fake admin routes.",
)
@_FORMAT
@_fail_cleanly
def send(
    provider: str,
    event_type: str | None,
    url: str,
    secret: str | None,
    event_id: str | None,
    data_id: str | None,
    body_file: Any,
    timeout: float,
    api: str | None,
    fmt: str,
) -> None:
    """Send one correctly signed PROVIDER delivery and print the answer.

    Exit status 0 when the answer is one PROVIDER counts as success, 1 otherwise.

    \b
    Examples:
      ONCEONLY_STRIPE_SECRET=whsec_dev onceonly serve &
      onceonly dev send stripe --secret whsec_dev --event-type charge.refunded
      onceonly dev send stripe --secret whsec_dev --event-id evt_1   # twice: a duplicate
      onceonly dev send mercadopago --secret s3cret --data-id 123456789
      onceonly dev send asaas --secret token --event-type PAYMENT_OVERDUE --format json
    """
    signer = provider_for(provider, secret)
    target = receiver_url(url, provider)
    facts = PaymentFacts(data_id or default_object_id(provider))
    event = build_event(provider, event_type=event_type, event_id=event_id, facts=facts)
    if api:
        _store_objects(api, provider, event, facts)
    if body_file is not None:
        event = Outgoing(
            event.event_id, body_file.read(), event.headers, event.query, event.delivery_id
        )
    sender = Sender(signer, target, timeout=timeout)

    async def one() -> Any:
        async with httpx.AsyncClient() as client:
            return await sender.send_once(event, client)

    headers = sender.signed_headers(event)
    answer = asyncio.run(one())
    ok = answer.status is not None and sender.policy.succeeded(answer.status)
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    "url": target,
                    "event_id": event.event_id,
                    "query": sender.signed_query(event),
                    "status": answer.status,
                    "error": answer.error,
                    "duplicate": answer.duplicate,
                    "acknowledged": ok,
                    "answer": answer.text,
                    "sent_headers": headers,
                    "body": event.body.decode("utf-8", "replace"),
                },
                indent=2,
            )
        )
    else:
        _print_send(target, event, headers, answer, ok, sender.signed_query(event))
    sys.exit(0 if ok else 1)


def _store_objects(api: str, provider: str, event: Outgoing, facts: PaymentFacts) -> None:
    for kind, object_id, obj in api_objects(provider, event, facts):
        response = httpx.put(f"{api.rstrip('/')}/_fake/{provider}/{kind}/{object_id}", json=obj)
        response.raise_for_status()


def _print_send(
    target: str,
    event: Outgoing,
    headers: dict[str, str],
    answer: Any,
    ok: bool,
    sent_query: dict[str, str],
) -> None:
    # The query as sent: the event's own plus what the provider authenticates
    # with in the URL (Efí's hmac), as the headers below include the signature.
    query = "?" + "&".join(f"{k}={v}" for k, v in sent_query.items()) if sent_query else ""
    console.print(f"[bold]POST[/bold] {target}{query}", highlight=False)
    for name, value in headers.items():
        console.print(f"  {name}: {value}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"  event id: {event.event_id}", markup=False, highlight=False, soft_wrap=True)
    colour = "green" if ok else "red"
    status = answer.status if answer.status is not None else answer.error
    duplicate = " (duplicate)" if answer.duplicate else ""
    console.print(f"[{colour}]answer: {status}{duplicate}[/{colour}]")
    if answer.text:
        console.print(answer.text, markup=False, highlight=False)


# Keep the default event types discoverable from --help of the group.
dev.help = (
    inspect.cleandoc(dev.help or "")
    + "\n\n\b\nDefault event types:\n"
    + "\n".join(f"  {name}: {kind}" for name, kind in sorted(DEFAULT_EVENT_TYPES.items()))
)
