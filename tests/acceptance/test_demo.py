"""``onceonly demo``, the README's first command, as a newcomer runs it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

from support import ONCEONLY

#: It takes about 12 s alone; three test workers on two cores slow it several times.
DEMO_LIMIT_S = 240


def run_demo(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """Run the demo in a fresh, empty working directory, with its own TMPDIR."""
    cwd, tmp = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    tmp.mkdir()
    # No ONCEONLY_* settings: the demo needs no set-up, and must not use the caller's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEONLY_")}
    env.update(TMPDIR=str(tmp), COLUMNS="120")
    # faulthandler: a demo stuck past the limit is sent SIGABRT, which prints
    # every thread's stack, so a hang shows where it hung instead of a bare timeout.
    python, *rest = ONCEONLY
    command = [python, "-X", "faulthandler", *rest, "demo", *args]
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=DEMO_LIMIT_S)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            stdout, stderr = proc.communicate()
            raise AssertionError(
                f"the demo ran past {DEMO_LIMIT_S} s; its threads then:\n{stderr[-20000:]}"
            ) from None
    result = subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)
    assert result.returncode == 0, result.stdout + result.stderr
    return result, cwd, tmp


def test_the_table_shows_the_naive_endpoint_doubling_and_onceonly_not(tmp_path: Path) -> None:
    result, cwd, tmp = run_demo(tmp_path)
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if len(cells) == 3 and cells[1].isdigit():
            rows[cells[0]] = (int(cells[1]), int(cells[2]))
    made = rows["payments made at the gateway"][0]
    assert made == 300
    naive = {label: values[0] for label, values in rows.items()}
    ours = {label: values[1] for label, values in rows.items()}
    assert naive["payments recorded"] > made
    assert naive["e-mails sent"] > made
    assert naive["customers charged twice"] > 0
    assert ours["payments recorded"] == ours["access released"] == ours["e-mails sent"] == made
    assert ours["customers charged twice"] == 0
    # Nothing left behind: not in the working directory, not in the temp directory.
    assert list(cwd.iterdir()) == []
    assert list(tmp.iterdir()) == []


def test_json_for_scripts_and_keep_leaves_the_evidence(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    result, _, tmp = run_demo(
        tmp_path, "--events", "120", "--seed", "7", "--format", "json", "--keep", str(keep)
    )
    data = json.loads(result.stdout)
    naive, ours = data["naive"], data["onceonly"]
    assert data["payments"] == 120
    assert naive["customers_charged_twice"] > 0
    assert naive["emails_sent"] > naive["orders_paid"] == 120
    assert naive["payments_recorded"] > 120
    for key in ("payments_recorded", "access_released", "emails_sent", "events_stored"):
        assert ours[key] == 120, key
    assert ours["customers_charged_twice"] == 0
    # The bad day really happened on the onceonly side too.
    assert ours["answered_502_after_commit"] > 0
    assert ours["deliveries"]["duplicates_answered"] > 0
    # The counts come from the files kept: re-count them here.
    assert sum(1 for _ in (keep / "outbox-naive.jsonl").open()) == naive["emails_sent"]
    assert sum(1 for _ in (keep / "outbox-onceonly.jsonl").open()) == 120
    assert {p.name for p in keep.iterdir()} >= {"naive.db", "onceonly.db"}
    assert data["kept"] == str(keep.resolve())
    assert list(tmp.iterdir()) == []
    # A second run into the same directory would count on top of the first: refused.
    again = subprocess.run(
        [*ONCEONLY, "demo", "--keep", str(keep)], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 2
    assert "already holds a demo run" in again.stderr
