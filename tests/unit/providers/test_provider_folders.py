"""A provider is one folder: its verifier, API client and development profile side
by side, and ``onceonly dev`` reads every provider through the profile alone."""

from __future__ import annotations

import ast
import asyncio
import pathlib
import sys
import textwrap
from collections.abc import Iterator

import httpx
import pytest

import onceonly.clients
import onceonly.dev
from onceonly.dev import profiles as dev_profiles
from onceonly.dev.api import FakeApi
from onceonly.dev.gateway import prepare_events
from onceonly.dev.schedules import policy_for
from onceonly.providers import PROVIDER_CLASSES
from onceonly.providers.profile import DevProfile

DEV = pathlib.Path(onceonly.dev.__file__).parent


def _strings(path: pathlib.Path) -> set[str]:
    """The string constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    }


@pytest.mark.parametrize("module", sorted(p.name for p in DEV.glob("*.py")), ids=str)
def test_dev_names_no_provider(module: str) -> None:
    # The engine, the payloads, the schedules, the fake API and the commands
    # read providers through their profiles: none may branch on a name.
    assert not _strings(DEV / module) & set(PROVIDER_CLASSES)


@pytest.mark.parametrize("name", sorted(PROVIDER_CLASSES))
def test_every_provider_is_a_folder_with_a_profile(name: str) -> None:
    cls = PROVIDER_CLASSES[name]
    package = cls.__module__.rpartition(".")[0]
    assert package == f"onceonly.providers.{name}"
    profile = dev_profiles.profile_for(name)
    assert isinstance(profile, DevProfile)
    assert profile.name == name == profile.schedule.provider


@pytest.fixture
def acme(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A provider added the way the docs say: one folder, then one registration."""
    folder = tmp_path / "acme"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    (folder / "verifier.py").write_text(
        textwrap.dedent(
            """
            from onceonly.providers import HMAC

            class Acme(HMAC):
                name = "acme"
            """
        )
    )
    (folder / "client.py").write_text(
        textwrap.dedent(
            """
            from onceonly.providers.client import ApiClient, Target

            class AcmeClient(ApiClient):
                name = "acme"
                default_base_url = "https://api.acme.example"
                kinds = ("thing",)

                def target(self, event, kind=None):
                    return Target("thing", "1")

                async def get(self, target):
                    return {}
            """
        )
    )
    (folder / "profile.py").write_text(
        textwrap.dedent(
            """
            from onceonly.providers.profile import (
                ApiAnswer, DeliverySchedule, DevProfile, FakeRoute
            )

            class AcmeProfile(DevProfile):
                name = "acme"
                schedule = DeliverySchedule("acme", (1.0, 2.0), timeout=3.0)
                event_type = "thing.paid"
                paid_status = "paid"
                routes = (FakeRoute("/acme/things/{object_id}", "thing"),)

                def object_id(self, digits, token):
                    return f"thing_{digits}"

                def api_objects(self, event, body, facts, state):
                    return [("thing", facts.object_id, {"id": facts.object_id, "state": state})]

                def not_found(self, kind, object_id):
                    return ApiAnswer(404, {"acme": "gone"})

            PROFILE = AcmeProfile()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from acme.verifier import Acme  # type: ignore[import-not-found]

    monkeypatch.setitem(PROVIDER_CLASSES, "acme", Acme)
    dev_profiles.profiles.cache_clear()
    yield "acme"
    dev_profiles.profiles.cache_clear()
    for module in [m for m in sys.modules if m == "acme" or m.startswith("acme.")]:
        del sys.modules[module]


def test_a_new_provider_folder_s_client_is_found_beside_its_verifier(acme: str) -> None:
    found = onceonly.clients._client_classes()
    assert found.pop("acme").__name__ == "AcmeClient"
    assert found == onceonly.clients.CLIENT_CLASSES


def test_a_new_provider_folder_is_played_by_dev_without_touching_dev(acme: str) -> None:
    assert policy_for(acme).delays == (1.0, 2.0)
    api = FakeApi()
    (event,) = prepare_events(acme, 1, seed=3, api=api)
    assert b'"type":"thing.paid"' in event.body
    (thing_id,) = [key[2] for key in api._objects]
    assert thing_id.startswith("thing_")
    auth = {"authorization": "Bearer onceonly-dev-token"}

    async def ask() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
            return (
                await client.get(f"/acme/things/{thing_id}", headers=auth),
                await client.get("/acme/things/nope", headers=auth),
                await client.get(f"/acme/things/{thing_id}"),
            )

    found, missing, unauthorized = asyncio.run(ask())
    assert found.status_code == 200
    assert found.json() == {"id": thing_id, "state": "paid"}
    assert missing.status_code == 404
    assert missing.json() == {"acme": "gone"}
    assert unauthorized.status_code == 401
