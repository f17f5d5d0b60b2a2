"""Tenants without I/O: names, the resolver's caches, per-tenant verifiers,
the inbox and the receiver's answers on the in-memory store double."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from onceonly import (
    Delivery,
    Inbox,
    SignatureError,
    TenantCredentials,
    Tenants,
    TenantUnavailable,
    UnknownTenant,
)
from onceonly.asgi import Message
from onceonly.clients import AsaasClient, StripeClient
from onceonly.context import effect_key
from onceonly.metrics import Metrics
from onceonly.providers import (
    PROVIDER_CLASSES,
    Asaas,
    Pagarme,
    Provider,
    StandardWebhooks,
    Stripe,
)
from onceonly.receiver import Receiver
from onceonly.settings import ReceiverSettings
from onceonly.store.memory import MemoryStore
from onceonly.tenants import TtlCache, valid_tenant

SECRETS = {("asaas", "a"): ["token-a"], ("asaas", "b"): ["token-b"]}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def directory(**options: Any) -> Tenants:
    return Tenants(lambda provider, tenant: SECRETS.get((provider, tenant)), **options)


def asaas_delivery(tenant: str, token: str, event_id: str = "evt_1") -> Delivery:
    body = json.dumps({"id": event_id, "event": "PAYMENT_RECEIVED"}).encode()
    return Delivery("asaas", body, {"asaas-access-token": token}, tenant=tenant)


@pytest.mark.parametrize(
    "name", ["a", "shop-1", "Loja_2.br", "x" * 64, "0"], ids=["a", "dash", "dot", "64", "digit"]
)
def test_plain_names_are_tenants(name: str) -> None:
    assert valid_tenant(name)


@pytest.mark.parametrize(
    "name",
    ["", "..", "../x", ".hidden", "-a", "a/b", "a\x00", "x" * 65, "x" * 10_000, "lojá", "a b"],
    ids=["empty", "dotdot", "path", "dot", "dash", "slash", "nul", "65", "10k", "unicode", "space"],
)
def test_hostile_names_are_not(name: str) -> None:
    assert not valid_tenant(name)


def test_the_cache_forgets_after_its_ttl_and_keeps_its_bound() -> None:
    clock = Clock()
    cache: TtlCache[str, int] = TtlCache(2, ttl=10, clock=clock)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # now the most recently used
    cache.put("c", 3)  # pushes out the least recently used: b
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)
    clock.now = 10
    assert cache.get("a") is None
    assert len(cache) == 1


async def test_known_and_unknown_tenants_are_cached_apart() -> None:
    clock = Clock()
    tenants = directory(ttl=60, unknown_ttl=5, max_unknown=10, clock=clock)
    for _ in range(3):
        assert await tenants.credentials("asaas", "a") == TenantCredentials(["token-a"])
        assert await tenants.credentials("asaas", "nobody") is None
    assert tenants.lookups == 2
    clock.now = 6  # the unknown answer expired, the known one did not
    assert await tenants.credentials("asaas", "nobody") is None
    assert await tenants.credentials("asaas", "a") is not None
    assert tenants.lookups == 3


async def test_a_flood_of_made_up_names_neither_grows_memory_nor_evicts_merchants() -> None:
    tenants = directory(max_unknown=50)
    await tenants.credentials("asaas", "a")
    for n in range(500):
        assert await tenants.credentials("asaas", f"random{n}") is None
    assert len(tenants._unknown) == 50
    before = tenants.lookups
    assert await tenants.credentials("asaas", "a") is not None
    assert tenants.lookups == before  # the merchant's entry survived the flood
    # Names that cannot be tenants never reach the resolver.
    assert await tenants.credentials("asaas", "../etc") is None
    assert tenants.lookups == before


async def test_forget_makes_the_next_delivery_ask_again() -> None:
    tenants = directory()
    await tenants.credentials("asaas", "a")
    tenants.forget("asaas", "a")
    await tenants.credentials("asaas", "a")
    assert tenants.lookups == 2


async def test_an_async_resolver_and_full_credentials() -> None:
    async def resolve(provider: str, tenant: str) -> TenantCredentials | None:
        await asyncio.sleep(0)
        return TenantCredentials(secrets="s3cret", api_account="acct_1") if tenant == "t" else None

    tenants = Tenants(resolve)
    found = await tenants.credentials("stripe", "t")
    assert found is not None
    assert found.secrets == ("s3cret",)
    assert found.api_account == "acct_1"
    assert "s3cret" not in repr(found)


async def test_a_failing_or_confused_resolver_is_unavailable_not_a_crash() -> None:
    def broken(provider: str, tenant: str) -> list[str]:
        raise OSError("the merchants database is down")

    with pytest.raises(TenantUnavailable):
        await Tenants(broken).credentials("asaas", "a")
    with pytest.raises(TenantUnavailable):
        await Tenants(lambda p, t: 42).credentials("asaas", "a")  # type: ignore[arg-type,return-value]
    # A failure is not remembered as "unknown": the retry asks again.
    calls = []

    def flaky(provider: str, tenant: str) -> list[str]:
        calls.append(tenant)
        if len(calls) == 1:
            raise TimeoutError
        return ["token-a"]

    tenants = Tenants(flaky)
    with pytest.raises(TenantUnavailable):
        await tenants.credentials("asaas", "a")
    assert await tenants.credentials("asaas", "a") is not None


async def test_each_tenant_verifies_with_its_own_secrets_only() -> None:
    tenants = directory()
    template = Asaas.for_tenants()
    verifier_a = await tenants.verifier("asaas", "a", template)
    verifier_a.verify(asaas_delivery("a", "token-a"))
    with pytest.raises(SignatureError):
        verifier_a.verify(asaas_delivery("a", "token-b"))
    assert (await tenants.verifier("asaas", "a", template)) is verifier_a  # cached
    with pytest.raises(UnknownTenant):
        await tenants.verifier("asaas", "c", template)


def test_a_provider_for_tenants_only_has_no_usable_secret_of_its_own() -> None:
    template = StandardWebhooks.for_tenants(tolerance=60)
    assert template.tenants_only
    assert template.tolerance == 60
    twin = template.with_secrets("whsec_" + "c2VjcmV0LWtleS1vZi1hLXRlbmFudA==")
    assert not twin.tenants_only
    assert twin.tolerance == 60
    body = b'{"type": "x"}'
    headers = twin.sign(body, delivery_id="msg_1")
    twin.verify(Delivery("standardwebhooks", body, headers))
    with pytest.raises(SignatureError):
        template.verify(Delivery("standardwebhooks", body, headers))


async def test_the_inbox_keeps_tenants_apart_in_dedup() -> None:
    store = MemoryStore()
    inbox = Inbox(store, {"asaas": Asaas.for_tenants()}, tenants=directory())
    first = await inbox.receive(asaas_delivery("a", "token-a"))
    other = await inbox.receive(asaas_delivery("b", "token-b"))
    again = await inbox.receive(asaas_delivery("a", "token-a"))
    assert (first.duplicate, other.duplicate, again.duplicate) == (False, False, True)
    assert sorted(e.tenant for e in store.events.values()) == ["a", "b"]
    assert [e.tenant for e in await store.list_events(tenant="a")] == ["a"]
    assert await store.list_events(tenant="") == []
    with pytest.raises(SignatureError):
        await inbox.receive(asaas_delivery("b", "token-a"))
    with pytest.raises(UnknownTenant):  # the tenant-less route of a tenants-only provider
        await inbox.receive(asaas_delivery("", "token-a"))


def test_effect_keys_differ_per_tenant_and_stay_as_they_were_without_one() -> None:
    assert effect_key("asaas", "evt_1", "charge", "a") != effect_key(
        "asaas", "evt_1", "charge", "b"
    )
    # The key an event without a tenant always had (before tenants existed).
    assert effect_key("asaas", "evt_1", "charge") == "oo-9bd541ff075256b494c97c094d4af4b16cddd125"


def test_api_clients_per_tenant() -> None:
    platform = StripeClient("sk_test_platform")
    connected = platform.for_tenant(account="acct_A")
    assert connected.auth_headers() == {
        "authorization": "Bearer sk_test_platform",
        "stripe-account": "acct_A",
    }
    assert platform.auth_headers() == {"authorization": "Bearer sk_test_platform"}
    merchant = AsaasClient("platform-key").for_tenant(token="merchant-key")
    assert merchant.auth_headers() == {"access_token": "merchant-key"}
    with pytest.raises(Exception, match="no connected accounts"):
        AsaasClient("platform-key").for_tenant(account="acct_A")


class _Asgi:
    """Calls the receiver as a server would, in-process."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        sent: list[Message] = []
        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> Message:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": path,
            "root_path": "",
            "query_string": b"",
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        }
        await self.receiver(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        content_type = dict(start["headers"]).get(b"content-type", b"")
        if start["status"] >= 400:
            assert content_type == b"application/problem+json"
        return start["status"], body_out


def _receiver(tenants: Tenants) -> tuple[_Asgi, MemoryStore]:
    store = MemoryStore()
    providers = {"asaas": Asaas.for_tenants(), "stripe": Stripe("whsec_platform")}
    inbox = Inbox(store, providers, tenants=tenants)
    metrics = Metrics(providers, engine=lambda: None, engine_kind="sqlite")  # type: ignore[arg-type,return-value]
    return _Asgi(Receiver(inbox, metrics, ReceiverSettings(), prefix="/webhooks")), store


@pytest.mark.parametrize(
    "path",
    [
        "/webhooks/asaas/..",
        "/webhooks/asaas/../x",
        "/webhooks/asaas/a\x00",
        "/webhooks/asaas/" + "a" * 10_000,
        "/webhooks/asaas/lojá",
        "/webhooks/asaas/",
        "/webhooks/asaas/a/b",
        "/webhooks/asaas/nobody",
        "/webhooks/nothing/a",
    ],
    ids=["dotdot", "path", "nul", "10k", "unicode", "empty", "deeper", "unknown", "no-provider"],
)
async def test_hostile_tenant_paths_get_a_404_problem_and_leave_nothing(path: str) -> None:
    client, store = _receiver(directory())
    status, _ = await client.post(path, {"asaas-access-token": "token-a"}, b'{"id": "evt_1"}')
    assert status == 404
    assert not store.events


async def test_a_resolver_that_fails_gets_a_503_with_retry_after() -> None:
    def broken(provider: str, tenant: str) -> list[str]:
        raise ConnectionError("down")

    client, store = _receiver(Tenants(broken))
    status, body = await client.post("/webhooks/asaas/a", {"asaas-access-token": "x"}, b"{}")
    assert status == 503
    assert b"retry later" in body
    assert not store.events


def _secret(provider: type[Provider], n: int) -> str:
    if provider is StandardWebhooks:
        return "whsec_" + base64.b64encode(f"tenant-key-{n}".encode()).decode()
    if provider is Pagarme:
        return f"tenant-{n}:secret-{n}"  # Basic credentials
    return f"tenant-secret-{n}"


@pytest.mark.parametrize("cls", list(PROVIDER_CLASSES.values()), ids=list(PROVIDER_CLASSES))
def test_every_provider_keeps_one_tenants_secret_from_verifying_anothers(
    cls: type[Provider],
) -> None:
    template = cls.for_tenants()
    first, second = template.with_secrets(_secret(cls, 1)), template.with_secrets(_secret(cls, 2))
    body = json.dumps({"id": "evt_1", "type": "payment.updated", "data": {"id": "1"}}).encode()
    # As the sender posts it: Efí's secret travels in the query.
    query = first.sign_query({"data.id": "1", "type": "payment"})
    headers = first.sign(body, delivery_id="delivery-1", query=query)
    first.verify(Delivery(cls.name, body, headers, query))
    with pytest.raises(SignatureError):
        second.verify(Delivery(cls.name, body, headers, query))
    with pytest.raises(SignatureError):
        template.verify(Delivery(cls.name, body, headers, query))


async def test_the_platforms_own_secret_does_not_verify_at_a_tenants_route() -> None:
    tenants = Tenants(lambda provider, tenant: ["whsec_tenant"] if tenant == "t" else None)
    platform = Stripe("whsec_platform")
    inbox = Inbox(MemoryStore(), {"stripe": platform}, tenants=tenants)
    body = json.dumps({"id": "evt_1", "type": "charge.succeeded"}).encode()
    signed_by_platform = platform.sign(body)
    with pytest.raises(SignatureError):
        await inbox.receive(Delivery("stripe", body, signed_by_platform, tenant="t"))
    # ... while the tenant-less route still takes it, and the tenant's secret works at /t.
    assert not (await inbox.receive(Delivery("stripe", body, signed_by_platform))).duplicate
    tenant_signed = Stripe("whsec_tenant").sign(body)
    assert not (await inbox.receive(Delivery("stripe", body, tenant_signed, tenant="t"))).duplicate


async def test_deliveries_arriving_together_share_one_lookup() -> None:
    release = asyncio.Event()
    calls: list[str] = []

    async def slow(provider: str, tenant: str) -> list[str] | None:
        calls.append(tenant)
        await release.wait()
        if tenant == "broken":
            raise ConnectionError("down")
        return ["token-a"] if tenant == "a" else None

    tenants = Tenants(slow)
    waiting = [
        asyncio.create_task(tenants.credentials("asaas", name))
        for name in ["a"] * 20 + ["nobody"] * 20 + ["broken"] * 5
    ]
    await asyncio.sleep(0.01)
    release.set()
    answers = await asyncio.gather(*waiting, return_exceptions=True)
    assert sorted(calls) == ["a", "broken", "nobody"]
    assert all(isinstance(a, TenantCredentials) for a in answers[:20])
    assert all(a is None for a in answers[20:40])
    assert all(isinstance(a, TenantUnavailable) for a in answers[40:])


async def test_a_sender_hanging_up_does_not_cancel_the_lookup_for_the_others() -> None:
    release = asyncio.Event()

    async def slow(provider: str, tenant: str) -> list[str]:
        await release.wait()
        return ["token-a"]

    tenants = Tenants(slow)
    first = asyncio.create_task(tenants.credentials("asaas", "a"))
    second = asyncio.create_task(tenants.credentials("asaas", "a"))
    await asyncio.sleep(0.01)
    first.cancel()
    release.set()
    assert await second == TenantCredentials(["token-a"])
    assert first.cancelled()
    assert tenants.lookups == 1
