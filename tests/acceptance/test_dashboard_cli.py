"""``onceonly serve`` decides whether the dashboard is served, and says so."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx

from support import ONCEONLY, STRIPE_SECRET, Server

TOKEN = "a-long-dashboard-token-for-tests"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")},
        "ONCEONLY_DATABASE_URL": f"sqlite:///{tmp_path / 'onceonly.db'}",
        "ONCEONLY_STRIPE_SECRET": STRIPE_SECRET,
        **extra,
    }


def test_on_loopback_without_a_token_it_serves_this_machine_at_the_configured_path(
    tmp_path: Path,
) -> None:
    server = Server(_env(tmp_path), tmp_path, "--dashboard-path", "/ops")
    try:
        page = httpx.get(f"{server.url}/ops/")
        assert page.status_code == 200
        assert "Overview" in page.text
        assert httpx.get(f"{server.url}/dashboard/").status_code == 404
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        output = server.stop()
    assert f"dashboard: http://127.0.0.1:{server.port}/ops/ (this machine only" in output


def test_on_a_public_interface_without_a_token_it_is_off_and_the_log_says_why(
    tmp_path: Path,
) -> None:
    server = Server(_env(tmp_path), tmp_path, "--host", "0.0.0.0")
    try:
        assert httpx.get(f"{server.url}/dashboard/").status_code == 404
    finally:
        output = server.stop()
    assert "dashboard: disabled, because serve binds 0.0.0.0" in output
    assert "ONCEONLY_DASHBOARD_TOKEN" in output


def test_on_a_public_interface_with_a_token_it_requires_the_token(tmp_path: Path) -> None:
    env = _env(tmp_path, ONCEONLY_DASHBOARD_TOKEN=TOKEN)
    server = Server(env, tmp_path, "--host", "0.0.0.0")
    try:
        assert httpx.get(f"{server.url}/dashboard/api/counts").status_code == 401
        authorized = httpx.get(
            f"{server.url}/dashboard/api/counts", headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert authorized.status_code == 200
        assert authorized.json()["total"] == 0
    finally:
        output = server.stop()
    assert "access token required" in output


def test_no_dashboard_turns_it_off(tmp_path: Path) -> None:
    env = _env(tmp_path, ONCEONLY_DASHBOARD_TOKEN=TOKEN)
    server = Server(env, tmp_path, "--no-dashboard")
    try:
        response = httpx.get(
            f"{server.url}/dashboard/", headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert response.status_code == 404
    finally:
        server.stop()


def test_a_short_token_is_refused_at_start(tmp_path: Path) -> None:
    result = subprocess.run(
        [*ONCEONLY, "serve", "--port", "0"],
        env=_env(tmp_path, ONCEONLY_DASHBOARD_TOKEN="short"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "at least 16 characters" in result.stderr
