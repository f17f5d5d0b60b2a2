"""Settings are frozen, validated values; Onceonly is composed from them."""

from __future__ import annotations

import dataclasses
import sqlite3
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from onceonly import ConfigurationError, Onceonly
from onceonly.cli import main
from onceonly.providers import Stripe
from onceonly.settings import Settings, WorkerSettings
from onceonly.store import DEFAULT_DATABASE_URL


def test_the_default_url_is_the_stores() -> None:
    assert Settings().database_url == DEFAULT_DATABASE_URL


@pytest.mark.parametrize(
    ("keyword", "message"),
    [
        ("max_attempts", "max_attempts must be at least 1"),
        ("lease_seconds", "lease_seconds must be positive"),
        ("outbox_lease_seconds", "outbox_lease_seconds must be positive"),
        ("max_body_bytes", "max_body_bytes must be positive"),
        ("max_header_bytes", "max_header_bytes must be positive"),
        ("body_timeout", "body_timeout must be positive"),
    ],
)
def test_an_explicit_zero_is_validated_not_replaced(keyword: str, message: str) -> None:
    # On main, max_attempts=0 and lease_seconds=0 (and outbox_lease_seconds=0)
    # were taken for "not given" and silently became 10, 30 and 30.
    options: dict[str, Any] = {keyword: 0}
    with pytest.raises(ConfigurationError, match=message):
        Onceonly(environ={}, **options)


def test_zero_is_kept_where_it_means_something() -> None:
    app = Onceonly(
        environ={"ONCEONLY_RETRY_AFTER": "9", "ONCEONLY_RETENTION_PAYLOADS": "7d"},
        retry_after=0,
        retry_base=0,
        transaction_budget=0,
        retention_payloads=timedelta(0),
        metrics=False,
    )
    assert app.retry_after == 0
    assert app.retry_base == 0
    assert app.transaction_budget == 0
    # A zero timedelta is falsy: `or` used to swap it for the environment's 7d.
    assert app.retention_payloads == timedelta(0)
    assert app.metrics_enabled is False


def test_environment_zeros_are_validated_too() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        Onceonly(environ={"ONCEONLY_MAX_ATTEMPTS": "0"})
    with pytest.raises(ConfigurationError, match="lease_seconds"):
        Onceonly(environ={"ONCEONLY_LEASE_SECONDS": "0"})


def test_settings_are_frozen_and_sliced() -> None:
    app = Onceonly(environ={"ONCEONLY_MAX_ATTEMPTS": "3"}, lease_seconds=12, dashboard_path="ops")
    settings = app.settings
    assert settings.worker == WorkerSettings(max_attempts=3, lease_seconds=12)
    # The outbox lease outlasts a SQLite busy wait however short the lease.
    assert settings.worker.outbox_lease_seconds == 30.0
    assert settings.dashboard.path == "/ops"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.worker.max_attempts = 5  # type: ignore[misc]
    # replace() validates like the constructor.
    with pytest.raises(ConfigurationError, match="max_attempts"):
        settings.replace(max_attempts=0)
    assert settings.replace(max_attempts=4).worker.max_attempts == 4
    assert settings.worker.max_attempts == 3


def test_settings_can_be_given_whole() -> None:
    settings = Settings.from_environ({}, database_url="sqlite:///given.db", max_attempts=2)
    app = Onceonly(settings=settings, environ={})
    assert app.settings is settings
    assert app.database_url == "sqlite:///given.db"
    with pytest.raises(ConfigurationError, match="not both"):
        Onceonly(settings=settings, max_attempts=3, environ={})
    with pytest.raises(TypeError, match="unknown settings"):
        Settings.from_environ({}, max_attempt=3)


def test_settings_change_until_a_resource_exists(tmp_path: Path) -> None:
    app = Onceonly(database_url=f"sqlite:///{tmp_path}/a.db", environ={})
    app.max_attempts = 4
    assert app.max_attempts == 4
    with pytest.raises(ConfigurationError, match="max_attempts must be at least 1"):
        app.max_attempts = 0
    app.database_url = f"sqlite:///{tmp_path}/b.db"
    store = app.store
    with pytest.raises(ConfigurationError, match=r"cannot change database_url: store already"):
        app.database_url = f"sqlite:///{tmp_path}/c.db"
    assert app.store is store
    assert app.database_url.endswith("b.db")


def test_settings_are_fixed_once_a_component_is_built() -> None:
    app = Onceonly(environ={})
    app.asgi()
    with pytest.raises(ConfigurationError, match="cannot change max_body_bytes"):
        app.max_body_bytes = 10


def test_replace_is_a_new_deployment_with_the_same_handlers(tmp_path: Path) -> None:
    app = Onceonly(
        database_url=f"sqlite:///{tmp_path}/old.db",
        providers={"stripe": Stripe("whsec_x")},
        environ={},
    )

    @app.handler("stripe")
    def handle(event: object, ctx: object) -> None: ...

    old_store = app.store
    moved = app.replace(database_url=f"sqlite:///{tmp_path}/new.db", metrics_enabled=False)
    assert moved is not app
    assert moved.handlers is app.handlers
    assert set(moved.providers) == {"stripe"}
    assert moved.metrics_enabled is False
    assert moved.store is not old_store
    assert moved.store.url.endswith("new.db")
    assert str(moved.engine.url).endswith("new.db")
    assert app.database_url.endswith("old.db")


def test_cli_database_url_moves_a_store_the_app_already_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On main the CLI assigned app.database_url after loading: a store the
    # --app module had already built stayed on the old database (migrate
    # created the tables there) while the engine went to the new one.
    old, new = tmp_path / "old.db", tmp_path / "new.db"
    (tmp_path / "builtapp.py").write_text(
        "from onceonly import Onceonly\n"
        f"app = Onceonly(database_url='sqlite:///{old}', environ={{}})\n"
        "app.store  # built at import, as an application wiring its routes may do\n"
    )
    monkeypatch.chdir(tmp_path)
    try:
        result = CliRunner().invoke(
            main, ["migrate", "--app", "builtapp:app", "--database-url", f"sqlite:///{new}"]
        )
    finally:
        sys.modules.pop("builtapp", None)
    assert result.exit_code == 0, result.output
    with sqlite3.connect(new) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "onceonly_events" in tables
    assert not old.exists() or old.stat().st_size == 0
