"""Pagar.me and Efí Pix through the real receiver over HTTP on a real SQLite
file (one engine: what is new here is the providers, not the store), and their
API clients against the fake API on loopback, Efí's OAuth2 token flow included.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from onceonly import ApiError, Context, Event, Onceonly, create_store
from onceonly.clients import EfiClient, PagarmeClient, Target
from onceonly.dev.api import DEFAULT_TOKEN, FakeApi
from onceonly.dev.delivery import Sender
from onceonly.dev.gateway import prepare_events
from onceonly.providers import Efi, Pagarme
from support import live_server

CREDENTIALS = "hook-user:hook-password"
EFI_SECRET = "efi-url-secret"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def signer() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'onceonly.db'}"


@pytest.fixture
def providers(tmp_path: Path, signer: rsa.RSAPrivateKey) -> dict[str, Pagarme | Efi]:
    numbers = signer.public_key().public_numbers()
    jwk = {
        "kty": "RSA",
        "use": "sig",
        "kid": "pagarme-1",
        "n": b64url(numbers.n.to_bytes(256, "big")),
        "e": b64url(numbers.e.to_bytes(3, "big")),
    }
    jwks = tmp_path / "jwks.json"
    jwks.write_text(json.dumps({"keys": [jwk]}))
    return {"pagarme": Pagarme([CREDENTIALS, f"jwks:{jwks}"]), "efi": Efi(EFI_SECRET)}


async def stored(database_url: str) -> list[Event]:
    async with create_store(database_url) as store:
        return list(await store.list_events(limit=100))


def test_pagarme_and_efi_through_the_receiver(
    database_url: str, providers: dict[str, Pagarme | Efi], signer: rsa.RSAPrivateKey
) -> None:
    app = Onceonly(database_url=database_url, providers=providers, environ={})
    hook = {"id": "hook_1", "type": "charge.paid", "data": {"id": "ch_1", "status": "paid"}}
    body = json.dumps(hook).encode()
    raw = signer.sign(body, padding.PKCS1v15(), hashes.SHA256())
    pagarme = {
        "authorization": "Basic " + base64.b64encode(CREDENTIALS.encode()).decode(),
        "x-webhook-asymmetric-signature": f"alg=RS256; kid=pagarme-1; signature={b64url(raw)}",
    }
    pix = [
        {"endToEndId": f"E0908935620261202153{n}aaaaaaaaaa", "txid": f"tx{n}", "valor": "1.00"}
        for n in range(2)
    ]
    efi_body = json.dumps({"pix": pix}).encode()

    async def run(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url) as client:
            # Efí appends /pix to the registered URL: it lands in "ignorar".
            efi_query = f"hmac={EFI_SECRET}&ignorar=/pix"
            answers = [
                await client.post("/webhooks/pagarme", content=body, headers=pagarme),
                await client.post("/webhooks/pagarme", content=body, headers=pagarme),
                await client.post(
                    "/webhooks/pagarme",
                    content=body.replace(b"paid", b"fail"),
                    headers=pagarme,
                ),
                await client.post(
                    "/webhooks/pagarme",
                    content=body,
                    headers={"authorization": pagarme["authorization"]},
                ),
                await client.post(f"/webhooks/efi?{efi_query}", content=efi_body),
                await client.post(f"/webhooks/efi?{efi_query}", content=efi_body),
                await client.post("/webhooks/efi?hmac=guess&ignorar=/pix", content=efi_body),
                await client.post("/webhooks/efi", content=efi_body),
            ]
        assert answers[1].headers["onceonly-duplicate"] == "true"
        assert answers[5].headers["onceonly-duplicate"] == "true"
        return [a.status_code for a in answers]

    with live_server(app.asgi()) as url:
        statuses = asyncio.run(run(url))
    app.engine.dispose()
    assert statuses == [200, 200, 401, 401, 200, 200, 401, 401]
    events = {e.provider: e for e in asyncio.run(stored(database_url))}
    assert sorted(events) == ["efi", "pagarme"]  # one row each, nothing from the refusals
    assert (events["pagarme"].event_id, events["pagarme"].event_type) == ("hook_1", "charge.paid")
    assert events["efi"].event_id.startswith("pix:")  # two Pix, one delivery, one event
    assert json.loads(events["efi"].body)["pix"] == pix


@pytest.fixture
def served() -> Iterator[tuple[FakeApi, str]]:
    api = FakeApi()
    with live_server(api) as url:
        yield api, url


def test_the_dev_gateway_s_deliveries_and_ctx_fetch_against_the_fake_api(
    database_url: str, served: tuple[FakeApi, str]
) -> None:
    """What `onceonly dev gateway --provider pagarme|efi` does: deliveries the
    receiver accepts, pointing at objects the fake API serves; a handler that
    fetches sees the API's state (pending), not the body's claim."""
    fake, api_url = served
    environ = {
        "ONCEONLY_PAGARME_SECRET": CREDENTIALS,
        "ONCEONLY_PAGARME_API_TOKEN": DEFAULT_TOKEN,
        "ONCEONLY_PAGARME_API_BASE": api_url,
        "ONCEONLY_EFI_SECRET": EFI_SECRET,
        "ONCEONLY_EFI_API_CLIENT_ID": "Client_Id_dev",
        "ONCEONLY_EFI_API_CLIENT_SECRET": DEFAULT_TOKEN,
        "ONCEONLY_EFI_API_BASE": api_url,
    }
    app = Onceonly(database_url, environ=environ, retry_base=0.05)
    seen: list[tuple[str, str]] = []

    @app.handler()
    def check(event: Event, ctx: Context) -> None:
        seen.append((event.provider, str(ctx.fetch()["status"])))

    events = {
        name: prepare_events(name, 2, seed=7, api=fake, api_status="pending")
        for name in ("pagarme", "efi")
    }
    with live_server(app.asgi()) as url:
        for name, secret in (("pagarme", CREDENTIALS), ("efi", EFI_SECRET)):
            provider = Pagarme(secret) if name == "pagarme" else Efi(secret)
            report = asyncio.run(Sender(provider, f"{url}/webhooks/{name}").deliver(events[name]))
            assert report.undelivered == [], name
        app.worker(concurrency=1).run_until_idle(timeout=30)
    app.engine.dispose()
    assert Counter(seen) == Counter({("pagarme", "pending"): 2, ("efi", "pending"): 2})
    # One token for both fetches of the worker's client: it is kept until it expires.
    assert fake.hits("efi", "token") == 1
    assert fake.hits("efi", "pix") == 2


def test_efi_client_refuses_wrong_credentials_and_renews_a_revoked_token(
    served: tuple[FakeApi, str],
) -> None:
    fake, url = served
    e2e = "E09089356202612021530bbbbbbbbbbb"
    fake.put("efi", "pix", e2e, {"endToEndId": e2e, "valor": "5.00"})

    async def run() -> None:
        async with EfiClient("id", "wrong-secret", base_url=url) as wrong:
            with pytest.raises(ApiError) as caught:
                await wrong.retrieve_pix(e2e)
            assert caught.value.status == 401
            assert "wrong-secret" not in str(caught.value)
        async with EfiClient("id", DEFAULT_TOKEN, base_url=url) as client:
            assert (await client.get(Target("pix", e2e)))["valor"] == "5.00"
            client._access_token = "revoked"  # as if Efí had revoked it early
            assert (await client.retrieve_pix(e2e))["endToEndId"] == e2e
        async with PagarmeClient(DEFAULT_TOKEN, base_url=url) as pagarme:
            fake.put("pagarme", "order", "or_1", {"id": "or_1", "status": "pending"})
            assert (await pagarme.retrieve_order("or_1"))["status"] == "pending"

    asyncio.run(run())
    assert fake.hits("efi", "token") == 3  # the wrong one, the first, the renewal
