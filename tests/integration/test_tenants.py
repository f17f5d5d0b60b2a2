"""Many merchants, one deployment, on SQLite and PostgreSQL: two tenants with
different secrets on one real server (receiver and dashboard on loopback),
the real worker reading each tenant's objects from the fake provider API with
that tenant's own credential, and the CLI listing by tenant; the Flask view's
tenant route on a real WSGI server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import flask
import httpx
import pytest
from click.testing import CliRunner

from onceonly import Context, Event, Onceonly, TenantCredentials, Tenants, create_store
from onceonly._threads import background_loop
from onceonly.cli import main
from onceonly.clients import ApiRetryPolicy, AsaasClient, StripeClient
from onceonly.contrib.flask import webhook_view
from onceonly.dashboard import DashboardMount
from onceonly.dev.api import FakeApi
from onceonly.providers import Asaas, Stripe
from onceonly.worker import running
from support import live_server, live_wsgi_server, stripe_delivery

TOKEN = "dashboard-token-0123456789"
BEARER = {"authorization": f"Bearer {TOKEN}"}
NO_WAIT = ApiRetryPolicy(retries=1, base=0.0)

#: What the platform's own merchants table would hold.
MERCHANTS = {
    ("asaas", "a"): TenantCredentials(["asaas-webhook-a"], api_token="asaas-key-a"),
    ("asaas", "b"): TenantCredentials(["asaas-webhook-b"], api_token="asaas-key-b"),
    ("stripe", "a"): TenantCredentials(["whsec_tenant_a"], api_account="acct_A"),
    ("stripe", "b"): TenantCredentials(["whsec_tenant_b"], api_account="acct_B"),
}


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeApi, str]]:
    api = FakeApi(token="sk_test_platform", tokens={"asaas": "asaas-platform-key"})
    with live_server(api) as url:
        yield api, url


def asaas_body(event_id: str, payment_id: str = "pay_1") -> bytes:
    return json.dumps(
        {"id": event_id, "event": "PAYMENT_RECEIVED", "payment": {"id": payment_id}}
    ).encode()


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def deployment(database_url: str, api_url: str, lookups: list[tuple[str, str]]) -> Onceonly:
    def resolve(provider: str, tenant: str) -> TenantCredentials | None:
        lookups.append((provider, tenant))
        return MERCHANTS.get((provider, tenant))

    return Onceonly(
        database_url,
        {"asaas": Asaas.for_tenants(), "stripe": Stripe.for_tenants()},
        tenants=Tenants(resolve, metrics_tenants={"a"}),
        api_clients={
            "asaas": AsaasClient("asaas-platform-key", base_url=api_url, retry=NO_WAIT),
            "stripe": StripeClient("sk_test_platform", base_url=api_url, retry=NO_WAIT),
        },
        dashboard_token=TOKEN,
        environ={},
    )


def merchants_accounts(fake: FakeApi) -> None:
    fake.clear()
    fake.add_merchant("asaas", "merchant-a", "asaas-key-a")
    fake.add_merchant("asaas", "merchant-b", "asaas-key-b")
    fake.connect("stripe", "acct_A")
    fake.connect("stripe", "acct_B")
    # The same payment id in both merchants' accounts, in different states.
    for account, status in (("merchant-a", "RECEIVED"), ("merchant-b", "PENDING")):
        fake.put("asaas", "payment", "pay_1", {"id": "pay_1", "status": status}, account=account)
    for account in ("acct_A", "acct_B"):
        fake.put("stripe", "event", "evt_s", {"id": "evt_s", "account": account}, account=account)


def test_two_tenants_on_one_server_never_mix(
    database_url: str, served: tuple[FakeApi, str]
) -> None:
    fake, api_url = served
    merchants_accounts(fake)
    lookups: list[tuple[str, str]] = []
    app = deployment(database_url, api_url, lookups)
    seen: list[tuple[str, str, str, str]] = []
    lock = threading.Lock()

    @app.handler("asaas")
    def on_asaas(event: Event, ctx: Context) -> None:
        payment = ctx.fetch()
        with lock:
            seen.append((event.provider, event.tenant, payment["status"], ctx.effect_key("x")))

    @app.handler("stripe")
    def on_stripe(event: Event, ctx: Context) -> None:
        fetched = ctx.fetch()
        with lock:
            seen.append((event.provider, event.tenant, fetched["account"], ctx.effect_key("x")))

    with live_server(DashboardMount(app.asgi(), app.dashboard(), "/dashboard")) as url:
        web = httpx.Client(base_url=url, timeout=10)
        deliver_to_both(web)
        # Every answer came from at most one resolver call per tenant.
        assert sorted(set(lookups)) == sorted(lookups)

        with running(app.worker(poll_interval=0.05)):
            wait_for(lambda: len(seen) == 4)
        # ctx.fetch() read each tenant's objects with that tenant's credential.
        assert sorted(s[:3] for s in seen) == [
            ("asaas", "a", "RECEIVED"),
            ("asaas", "b", "PENDING"),
            ("stripe", "a", "acct_A"),
            ("stripe", "b", "acct_B"),
        ]
        accounts = {r.account for r in fake.requests}
        assert accounts == {"merchant-a", "merchant-b", "acct_A", "acct_B"}
        # Effect keys differ per tenant for the same event id.
        assert len({s[3] for s in seen}) == 4

        check_dashboard(web)

    found_a = find_event(database_url, "asaas", "evt_1", "a")
    found_b = find_event(database_url, "asaas", "evt_1", "b")
    assert found_a is not None
    assert found_b is not None
    assert found_a.id != found_b.id
    assert (found_a.duplicates, found_b.duplicates) == (1, 0)
    check_metrics(app)
    check_cli(database_url)


def deliver_to_both(web: httpx.Client) -> None:
    def asaas(tenant: str, token: str) -> httpx.Response:
        headers = {"asaas-access-token": token, "content-type": "application/json"}
        return web.post(f"/webhooks/asaas/{tenant}", content=asaas_body("evt_1"), headers=headers)

    def stripe(tenant: str, secret: str) -> httpx.Response:
        body, headers = stripe_delivery("evt_s", secret=secret)
        return web.post(f"/webhooks/stripe/{tenant}", content=body, headers=headers)

    # Each tenant's signed deliveries are accepted; the other's secret is not.
    first_a = asaas("a", "asaas-webhook-a")
    assert first_a.status_code == 200
    assert first_a.headers["onceonly-duplicate"] == "false"
    assert asaas("a", "asaas-webhook-b").status_code == 401
    assert asaas("b", "asaas-webhook-a").status_code == 401
    # The same event id under the other tenant is another event.
    first_b = asaas("b", "asaas-webhook-b")
    assert first_b.status_code == 200
    assert first_b.headers["onceonly-duplicate"] == "false"
    assert asaas("a", "asaas-webhook-a").headers["onceonly-duplicate"] == "true"
    assert stripe("a", "whsec_tenant_a").status_code == 200
    assert stripe("a", "whsec_tenant_b").status_code == 401
    assert stripe("b", "whsec_tenant_b").status_code == 200
    # No tenant, an unknown one: 404 problems, and nothing stored.
    no_tenant = web.post("/webhooks/asaas", content=asaas_body("evt_x"))
    assert no_tenant.status_code == 404
    assert no_tenant.headers["content-type"] == "application/problem+json"
    unknown = web.post("/webhooks/asaas/zzz", content=asaas_body("evt_x"))
    assert unknown.status_code == 404
    assert unknown.json()["type"] == "urn:onceonly:problem:unknown-tenant"
    assert web.post("/webhooks/asaas/zzz", content=b"{}").status_code == 404


def check_dashboard(web: httpx.Client) -> None:
    """Filtered by tenant, the dashboard shows that tenant's events only."""

    def listed(**query: str) -> list[tuple[str, str, str]]:
        response = web.get("/dashboard/api/events", params=query, headers=BEARER)
        assert response.status_code == 200
        return sorted((r["provider"], r["tenant"], r["event_id"]) for r in response.json())

    assert listed(tenant="a") == [("asaas", "a", "evt_1"), ("stripe", "a", "evt_s")]
    assert listed(tenant="b", event_id="evt_1") == [("asaas", "b", "evt_1")]
    page = web.get("/dashboard/events", params={"tenant": "a"}, headers=BEARER)
    assert page.status_code == 200
    assert '<td class="tenant">a</td>' in page.text
    assert '<td class="tenant">b</td>' not in page.text


def check_metrics(app: Onceonly) -> None:
    """Tenant "a" is named in metrics_tenants; "b" is counted as other."""
    samples = {(n, tuple(sorted(labels.items()))): v for n, labels, v in app.metrics.samples()}

    def sample(name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted(labels.items()))), 0.0)

    assert sample("onceonly_events_stored_total", provider="asaas", tenant="a") == 1
    assert sample("onceonly_events_stored_total", provider="asaas", tenant="(other)") == 1
    assert not any(dict(k[1]).get("tenant") in ("b", "zzz") for k in samples)
    rejected = "onceonly_deliveries_rejected_total"
    assert sample(rejected, provider="asaas", tenant="a", reason="signature") == 1
    assert sample(rejected, provider="asaas", tenant="(other)", reason="unknown-tenant") == 2
    assert sample("onceonly_events_processed_total", provider="stripe", tenant="a") == 1


def check_cli(database_url: str) -> None:
    def cli(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(
            main, [*args, "--format", "json", "--database-url", database_url]
        )
        return result.exit_code, result.output

    code, output = cli("events", "list", "--tenant", "b")
    assert code == 0, output
    listed = sorted((e["provider"], e["tenant"]) for e in json.loads(output))
    assert listed == [("asaas", "b"), ("stripe", "b")]
    # Without --tenant only the tenant-less evt_1 would do: never another
    # merchant's; the error names the tenants that have one.
    result = CliRunner().invoke(
        main, ["events", "replay", "asaas:evt_1", "--database-url", database_url]
    )
    assert result.exit_code == 1
    assert "'a', 'b' (add --tenant)" in " ".join(result.output.split())
    code, output = cli("events", "show", "asaas:evt_1", "--tenant", "b")
    assert code == 0, output
    assert json.loads(output)["tenant"] == "b"


def find_event(database_url: str, provider: str, event_id: str, tenant: str) -> Event | None:
    async def find() -> Event | None:
        async with create_store(database_url) as store:
            return await store.find_event(provider, event_id, tenant)

    return asyncio.run(find())


def test_a_flask_view_routes_tenants_too(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'onceonly.db'}"
    app = Onceonly(
        database_url,
        {"asaas": Asaas.for_tenants()},
        tenants=lambda provider, tenant: MERCHANTS.get((provider, tenant)),
        environ={},
    )
    web = flask.Flask("shop")
    view = webhook_view(app)
    web.add_url_rule("/webhooks/<provider>", view_func=view, methods=["POST"])
    web.add_url_rule("/webhooks/<provider>/<tenant>", view_func=view, methods=["POST"])
    try:
        with live_wsgi_server(web) as url:

            def post(tenant: str, token: str) -> int:
                return httpx.post(
                    f"{url}/webhooks/asaas/{tenant}",
                    content=asaas_body("evt_f"),
                    headers={"asaas-access-token": token},
                    timeout=10,
                ).status_code

            assert post("a", "asaas-webhook-b") == 401
            assert post("a", "asaas-webhook-a") == 200
            assert post("b", "asaas-webhook-b") == 200
            assert post("nobody", "asaas-webhook-a") == 404
    finally:
        background_loop().run(app.store.close())
    found = find_event(database_url, "asaas", "evt_f", "a")
    assert found is not None
    assert found.tenant == "a"
