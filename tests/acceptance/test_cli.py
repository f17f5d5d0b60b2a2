"""The real ``onceonly`` command, run as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ports import free_port
from support import ONCEONLY, STRIPE_SECRET, Server, stripe_delivery


def run(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ONCEONLY, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def env(database_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "ONCEONLY_DATABASE_URL": database_url,
        "ONCEONLY_STRIPE_SECRET": f"whsec_old,{STRIPE_SECRET}",
        "COLUMNS": "200",
    }


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    srv = Server(env, tmp_path)
    yield srv
    srv.stop()


def test_help_explains_every_command(tmp_path: Path) -> None:
    top = run("--help", env=dict(os.environ), cwd=tmp_path)
    assert top.returncode == 0
    for command in ("serve", "migrate", "events"):
        assert command in top.stdout
    serve = run("serve", "--help", env=dict(os.environ), cwd=tmp_path)
    assert "--port" in serve.stdout
    assert "ONCEONLY_DATABASE_URL" in serve.stdout


def test_default_database_is_a_sqlite_file_in_the_working_directory(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    result = run("migrate", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "onceonly.db").exists()


def test_migrate_is_idempotent(env: dict[str, str], tmp_path: Path) -> None:
    first = run("migrate", env=env, cwd=tmp_path)
    second = run("migrate", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "applied migrations 1" in first.stdout
    assert "nothing to do" in second.stdout


def test_bad_configuration_is_one_clear_line(tmp_path: Path) -> None:
    env = {**os.environ, "ONCEONLY_DATABASE_URL": "mysql://x/y"}
    result = run("events", "list", env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert "unsupported database URL scheme" in result.stderr
    assert "Traceback" not in result.stderr
    bad_app = run("events", "list", "--app", "nosuchmodule:app", env=env, cwd=tmp_path)
    assert bad_app.returncode == 2
    assert "cannot import 'nosuchmodule'" in bad_app.stderr


def test_unreachable_database_is_reported_not_a_traceback(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    env = {**os.environ, "ONCEONLY_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/x"}
    result = run("events", "list", env=env, cwd=tmp_path)
    assert result.returncode == 3
    assert "database not reachable" in result.stderr


def test_serve_then_list_and_show(server: Server, env: dict[str, str], tmp_path: Path) -> None:
    old_body, old_headers = stripe_delivery("evt_old_secret", secret="whsec_old")
    body, headers = stripe_delivery(
        "evt_cli", event_type="charge.refunded", extra={"object": {"id": "ch_cli"}}
    )
    with httpx.Client() as client:
        assert client.post(f"{server.url}/webhooks/stripe", content=body, headers=headers)
        rotated = client.post(
            f"{server.url}/webhooks/stripe", content=old_body, headers=old_headers
        )
        assert rotated.status_code == 200  # both secrets of a rotation are accepted
        dup = client.post(f"{server.url}/webhooks/stripe", content=body, headers=headers)
        assert dup.headers["onceonly-duplicate"] == "true"

    listed = run("events", "list", "--format", "json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["event_id"] for r in rows] == ["evt_old_secret", "evt_cli"]
    assert rows[1]["event_type"] == "charge.refunded"
    assert rows[1]["status"] == "pending"

    table = run("events", "list", "--provider", "stripe", env=env, cwd=tmp_path)
    assert "evt_cli" in table.stdout
    assert "charge.refunded" in table.stdout
    none = run("events", "list", "--status", "dead", env=env, cwd=tmp_path)
    assert "no events" in none.stdout
    about = run(
        "events", "list", "--object-id", "ch_cli", "--format", "json", env=env, cwd=tmp_path
    )
    assert [r["event_id"] for r in json.loads(about.stdout)] == ["evt_cli"]

    shown = run("events", "show", "stripe:evt_cli", "--format", "json", env=env, cwd=tmp_path)
    assert json.loads(shown.stdout)["body"] == body.decode()
    by_id = run("events", "show", str(rows[1]["id"]), env=env, cwd=tmp_path)
    assert "evt_cli" in by_id.stdout
    assert "stripe-signature" in by_id.stdout
    missing = run("events", "show", "stripe:nope", env=env, cwd=tmp_path)
    assert missing.returncode == 1
    assert "no event stripe:nope" in missing.stderr


def test_show_hides_credentials_and_never_reads_data_as_markup(
    server: Server, env: dict[str, str], tmp_path: Path
) -> None:
    """What the dashboard hides, the CLI hides, in both formats; an event type
    written by the sender is printed as it is, never as Rich markup."""
    body, headers = stripe_delivery(
        "evt_markup",
        event_type="[/bold][link=https://evil.example]click[/link]",
        extra={"Payer": {"Email": "ana@example.com"}, "amount": 1999},
    )
    headers = {
        **headers,
        "authorization": "Bearer caller-token",
        "cookie": "session=abc",
        "x-api_key": "k-123",
    }
    response = httpx.post(f"{server.url}/webhooks/stripe", content=body, headers=headers)
    assert response.status_code == 200
    env = {**env, "ONCEONLY_DASHBOARD_REDACT": "data.payer.email"}
    signature = headers["stripe-signature"]
    secrets = ("caller-token", "session=abc", "k-123", "ana@example.com", signature)

    table = run("events", "list", env=env, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "[/bold][link=https://evil.example]click[/link]" in table.stdout
    shown = run("events", "show", "stripe:evt_markup", env=env, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "[link=https://evil.example]" in shown.stdout
    assert "\x1b]8;" not in shown.stdout  # no terminal hyperlink
    as_json = run("events", "show", "stripe:evt_markup", "--format", "json", env=env, cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    for output in (shown.stdout, as_json.stdout):
        for secret in secrets:
            assert secret not in output
        assert "1999" in output  # what is not configured stays visible
    data = json.loads(as_json.stdout)
    assert "authorization" not in data["headers"]  # never stored
    assert data["headers"]["stripe-signature"] == "[redacted]"
    assert json.loads(data["body"])["data"]["Payer"]["Email"] == "[redacted]"
    missing = run("events", "show", "stripe:[red]nope", env=env, cwd=tmp_path)
    assert "[red]nope" in missing.stderr


def test_bad_status_filter_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    result = run("events", "list", "--status", "lost", env=env, cwd=tmp_path)
    assert result.returncode == 2
    assert "lost" in result.stderr
