"""The public names, pinned: adding or removing one is a decision, made here.

A name that disappears from ``__all__`` or a CLI command that is renamed
breaks users; a name that appears becomes a promise. Either way the change
shows up in this file's diff.
"""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

import onceonly
import onceonly.idempotency
from onceonly.cli import main

ONCEONLY = {
    "ApiError",
    "ApiUnavailable",
    "BodyTimeout",
    "BodyTooLarge",
    "ConfigurationError",
    "Context",
    "DashboardSettings",
    "Delivery",
    "DeliveryRejected",
    "EffectError",
    "Event",
    "EventInfo",
    "EventStatus",
    "Failure",
    "GroupCommit",
    "Guard",
    "HeadersTooLarge",
    "Inbox",
    "JobConflict",
    "JobInProgress",
    "NewEvent",
    "NonRetryable",
    "NotFetchable",
    "Onceonly",
    "OnceonlyError",
    "PayloadError",
    "PayloadPurged",
    "Receipt",
    "Receiver",
    "ReceiverSettings",
    "RetentionSettings",
    "RetryLater",
    "Settings",
    "SignatureError",
    "Store",
    "StoreError",
    "StoreRejected",
    "StoreUnavailable",
    "TenantCredentials",
    "TenantUnavailable",
    "Tenants",
    "UnknownProvider",
    "UnknownTenant",
    "Worker",
    "WorkerSettings",
    "__version__",
    "create_store",
    "load_app",
}

IDEMPOTENCY = {
    "DEFAULT_RELEASE_STATUSES",
    "ClientScope",
    "EnvironScope",
    "IdempotencyMiddleware",
    "InvalidKey",
    "StoredResponse",
    "WSGIIdempotencyMiddleware",
    "by_header",
    "fingerprint",
    "parse_key",
    "public_scope",
}

#: Every command and subcommand of ``onceonly``.
COMMANDS = {
    "demo",
    "dev",
    "dev gateway",
    "dev send",
    "events",
    "events list",
    "events replay",
    "events show",
    "idempotency",
    "idempotency purge",
    "import",
    "migrate",
    "purge",
    "reconcile",
    "serve",
    "worker",
}

#: The options every command that opens the database takes.
DATABASE_COMMANDS = {
    "events list",
    "events replay",
    "events show",
    "idempotency purge",
    "import",
    "migrate",
    "purge",
    "reconcile",
    "serve",
    "worker",
}


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        found[prefix + name] = command
        if isinstance(command, click.Group):
            found.update(_commands(command, prefix + name + " "))
    return found


def test_onceonly_exports() -> None:
    assert set(onceonly.__all__) == ONCEONLY
    for name in onceonly.__all__:
        assert getattr(onceonly, name) is not None


def test_idempotency_exports() -> None:
    assert set(onceonly.idempotency.__all__) == IDEMPOTENCY
    for name in onceonly.idempotency.__all__:
        assert getattr(onceonly.idempotency, name) is not None


def test_cli_commands() -> None:
    assert set(_commands(main)) == COMMANDS


def test_cli_database_options() -> None:
    commands = _commands(main)
    for name in DATABASE_COMMANDS:
        options = {opt for p in commands[name].params for opt in p.opts}
        assert {"--app", "--database-url"} <= options, name


def test_every_command_explains_itself() -> None:
    for name, command in _commands(main).items():
        assert command.help or command.short_help, f"onceonly {name} has no help"


@pytest.mark.parametrize("module", ["onceonly", "onceonly.cli"])
def test_python_dash_m_runs_the_command(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Usage: onceonly ")
    assert "serve" in done.stdout
    assert "import" in done.stdout
