"""Configuration from the environment and from Python."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onceonly import ConfigurationError, Onceonly, create_store, load_app
from onceonly.providers import HMAC, GitHub, StandardWebhooks, Stripe
from onceonly.store.postgres import PostgresStore
from onceonly.store.sqlite import SQLiteStore


def test_defaults_with_an_empty_environment() -> None:
    app = Onceonly(environ={})
    assert app.database_url == "sqlite:///onceonly.db"
    assert app.providers == {}
    assert app.max_body_bytes == 1024 * 1024
    assert app.retry_after == 5


def test_providers_come_from_their_secret_variables() -> None:
    app = Onceonly(
        environ={
            "ONCEONLY_STRIPE_SECRET": "whsec_a, whsec_b ,",
            "ONCEONLY_STRIPE_TOLERANCE": "60",
            "ONCEONLY_GITHUB_SECRET": "gh",
            "ONCEONLY_GITHUB_REJECTION_STATUS": "403",
            "ONCEONLY_STANDARDWEBHOOKS_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "ONCEONLY_HMAC_SECRET": "k",
            "ONCEONLY_HMAC_ENCODING": "base64",
            "ONCEONLY_HMAC_EVENT_ID": "header:X-Event-Id",
            "ONCEONLY_DATABASE_URL": "postgresql://u@db/x",
            "ONCEONLY_MAX_BODY_BYTES": "2048",
        }
    )
    stripe = app.providers["stripe"]
    assert isinstance(stripe, Stripe)
    assert stripe.secrets == ("whsec_a", "whsec_b")
    assert stripe.tolerance == 60
    github = app.providers["github"]
    assert isinstance(github, GitHub)
    assert github.rejection_status == 403
    assert isinstance(app.providers["standardwebhooks"], StandardWebhooks)
    hmac_provider = app.providers["hmac"]
    assert isinstance(hmac_provider, HMAC)
    assert hmac_provider.encoding == "base64"
    assert hmac_provider.event_id == ("header", "x-event-id")
    assert app.database_url == "postgresql://u@db/x"
    assert app.max_body_bytes == 2048


def test_code_wins_over_the_environment() -> None:
    app = Onceonly(
        database_url="sqlite:///mine.db",
        providers={"stripe": Stripe("whsec_code"), "stripe-connect": Stripe("whsec_c")},
        environ={"ONCEONLY_STRIPE_SECRET": "whsec_env", "ONCEONLY_DATABASE_URL": "sqlite:///e.db"},
    )
    assert app.database_url == "sqlite:///mine.db"
    assert app.providers["stripe"].secrets == ("whsec_code",)
    assert set(app.providers) == {"stripe", "stripe-connect"}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"ONCEONLY_STRIPE_SECRET": "x", "ONCEONLY_STRIPE_TOLERANCE": "soon"}, "integer"),
        ({"ONCEONLY_GITHUB_SECRET": "x", "ONCEONLY_GITHUB_REJECTION_STATUS": "200"}, "4xx"),
        ({"ONCEONLY_STANDARDWEBHOOKS_SECRET": "whsec_not base64!"}, "base64"),
        ({"ONCEONLY_HMAC_SECRET": "x", "ONCEONLY_HMAC_EVENT_ID": "query:id"}, "header:"),
        ({"ONCEONLY_MAX_BODY_BYTES": "0"}, "positive"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Onceonly(environ=environ)


def test_a_provider_needs_a_secret() -> None:
    with pytest.raises(ConfigurationError, match="at least one secret"):
        Stripe([" ", ""])


@pytest.mark.parametrize(
    ("url", "kind", "detail"),
    [
        ("sqlite:///onceonly.db", SQLiteStore, "onceonly.db"),
        ("sqlite:////var/lib/x.db", SQLiteStore, "/var/lib/x.db"),
        ("postgresql://u:pw@h:5432/db", PostgresStore, "postgresql://u:***@h:5432/db"),
        ("postgres://u@h/db", PostgresStore, "postgresql://u@h/db"),
        ("postgresql+asyncpg://u@h/db", PostgresStore, "postgresql://u@h/db"),
        ("postgresql://u@h/db?password=pw", PostgresStore, "postgresql://u@h/db?password=***"),
        (
            "postgresql://u:p%40w@h1:1,h2:2/db?PassWord=a&sslpassword=b&sslmode=require",
            PostgresStore,
            "postgresql://u:***@h1:1,h2:2/db?PassWord=***&sslpassword=***&sslmode=require",
        ),
    ],
)
def test_store_chosen_by_url(url: str, kind: type, detail: str) -> None:
    store = create_store(url)
    assert isinstance(store, kind)
    shown = store.path if isinstance(store, SQLiteStore) else store.url
    assert shown == detail


@pytest.mark.parametrize(
    "url", ["onceonly.db", "mysql://h/db", "sqlite://", "sqlite:///x.db?busy_timeout=soon"]
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigurationError):
        create_store(url)


def test_load_app_from_module_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mysettings.py").write_text(
        "from onceonly import Onceonly\n"
        "from onceonly.providers import GitHub\n"
        "app = Onceonly(database_url='sqlite:///from-app.db', providers={'github': GitHub('s')},"
        " environ={})\n"
        "def factory():\n    return app\n"
        "not_an_app = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    try:
        assert load_app("mysettings:app").database_url == "sqlite:///from-app.db"
        assert load_app("mysettings:factory") is load_app("mysettings:app")
        with pytest.raises(ConfigurationError, match=r"expected an onceonly\.Onceonly"):
            load_app("mysettings:not_an_app")
        with pytest.raises(ConfigurationError, match="no attribute"):
            load_app("mysettings:missing")
        with pytest.raises(ConfigurationError, match="module:attribute"):
            load_app("mysettings")
    finally:
        sys.modules.pop("mysettings", None)
