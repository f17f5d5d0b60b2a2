"""``onceonly worker`` started while PostgreSQL is unreachable waits for it, like
``onceonly serve``, instead of exiting; then it processes events as usual."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import payments_app
import pytest
import sqlalchemy as sa
from test_worker_crash import receive

from onceonly.db import create_engine
from processes import Proc, app_env, start_worker, statuses, wait_for
from support import TcpProxy


@pytest.mark.parametrize("engine", ["postgresql"], indirect=True)
def test_worker_waits_for_the_database_at_start(
    database_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    payments_app.create_payments_table(database_url)
    parts = urlsplit(database_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    db: sa.Engine = create_engine(database_url, pool_size=1)
    try:
        worker = start_worker(procs, "worker", "chaos_app", app_env(via_proxy), tmp_path, 1)
        wait_for(
            "the worker's first failed start",
            lambda: "database not reachable at start" in worker.output(),
            30,
            [worker],
        )
        time.sleep(1.5)  # a few more attempts: it must still be waiting, not gone
        assert worker.alive(), worker.output()[-3000:]
        proxy.start()
        receive(database_url, "evt_1", "evt_2")
        wait_for("both events processed", lambda: statuses(db) == {"processed": 2}, 30, [worker])
        assert worker.stop() == 0, worker.output()[-3000:]
    finally:
        proxy.close()
        db.dispose()
