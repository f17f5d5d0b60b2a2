"""The fake gateway's two halves together: the deliveries it sends point to the
objects its API serves, and a handler that fetches believes the API."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

from onceonly import Event, Onceonly
from onceonly.context import Context
from onceonly.dev.api import DEFAULT_TOKEN, FakeApi
from onceonly.dev.delivery import Sender
from onceonly.dev.gateway import prepare_events, provider_for
from onceonly.providers.base import env_name
from support import live_server

#: provider -> (secret, kind to fetch, where its status is)
PROVIDERS: dict[str, tuple[str, str | None, str]] = {
    "stripe": ("whsec_fetch", "payment_intent", "status"),
    "mercadopago": ("mp-secret", None, "status"),
    "asaas": ("asaas-token", None, "status"),
    "pagbank": ("pagbank-token", None, "charges.0.status"),
}


def status_of(obj: Any, path: str) -> str:
    for step in path.split("."):
        obj = obj[int(step)] if step.isdigit() else obj[step]
    return str(obj)


def test_the_event_claims_paid_the_api_says_pending_and_the_handler_sees_pending(
    database_url: str,
) -> None:
    fake = FakeApi()
    seen: list[tuple[str, str]] = []
    with live_server(fake) as api_url:
        environ = {}
        for name, (secret, _, _) in PROVIDERS.items():
            environ[env_name(name, "SECRET")] = secret
            environ[env_name(name, "API_TOKEN")] = DEFAULT_TOKEN
            environ[env_name(name, "API_BASE")] = api_url
        app = Onceonly(database_url, environ=environ, retry_base=0.05)

        @app.handler()
        def check(event: Event, ctx: Context) -> None:
            _, kind, path = PROVIDERS[event.provider]
            seen.append((event.provider, status_of(ctx.fetch(kind), path)))

        events = {
            name: prepare_events(name, 3, seed=5, api=fake, api_status="pending")
            for name in PROVIDERS
        }
        # What the deliveries claim: paid.
        stripe_claim = json.loads(events["stripe"][0].body)["data"]["object"]["status"]
        assert stripe_claim == "succeeded"
        with live_server(app.asgi()) as url:
            for name, (secret, _, _) in PROVIDERS.items():
                sender = Sender(provider_for(name, secret, environ={}), f"{url}/webhooks/{name}")
                report = asyncio.run(sender.deliver(events[name]))
                assert report.undelivered == [], name
        app.worker(concurrency=1).run_until_idle(timeout=30)
        app.engine.dispose()
    assert Counter(seen) == Counter({(name, "pending"): 3 for name in PROVIDERS})
    assert fake.hits("mercadopago", "payment") == 3
