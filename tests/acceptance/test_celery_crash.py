"""A Celery worker SIGKILLed mid-task does not act twice: a real ``celery
worker`` (``acks_late``) on Redis, a loopback card API, both engines.

Three tasks are held by the test inside the killed worker: one after its
charge was recorded, before its database write; one after the card API charged
and before the ledger recorded it (the window only an idempotency key closes);
one after its write, before its commit. The broker gives the messages back
after its visibility timeout, a new worker runs them once their lease ran out,
and then: the first and third were charged once, the second at most twice with
the same key, and each has exactly one payment row.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import celery_shop
from celery_support import CardApi, Queue, shop_env, start_celery_worker, wait_file
from onceonly.db import create_engine
from onceonly.tasks import task_effect_key
from processes import Proc, rows

LEASE = 1.0
TIMEOUT = 60


def test_a_worker_killed_after_the_charge_neither_charges_nor_writes_twice(
    redis_url: str, database_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    db = create_engine(database_url)
    with db.begin() as conn:
        conn.exec_driver_sql(celery_shop.PAYMENTS)
    queue, card = Queue.new(), CardApi()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    env = shop_env(database_url, queue, card, hooks, lease=LEASE)
    try:
        first = start_celery_worker(procs, "celery-first", env, tmp_path, concurrency=3)
        (hooks / "hold-charged-10").touch()
        (hooks / "hold-call-11").touch()
        (hooks / "hold-written-12").touch()
        recorded = queue.send("charge", 10, 1990)
        unrecorded = queue.send("charge", 11, 2500)
        uncommitted = queue.send("charge", 12, 990)
        for reached in ("charged-10", "call-11", "written-12"):
            wait_file(hooks / f"reached-{reached}", TIMEOUT, [first])
        key10, key11, key12 = (task_effect_key(f"charge:{n}", "charge") for n in (10, 11, 12))
        assert card.calls() == {key10: 1, key11: 1, key12: 1}

        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
        killed_at = time.monotonic()
        # Order 12's write died with its transaction; no key is done.
        assert rows(db, "SELECT order_id FROM shop_payments") == []
        assert rows(db, "SELECT DISTINCT status FROM onceonly_jobs") == [("running",)]
        for hold in hooks.glob("hold-*"):
            hold.unlink()
        second = start_celery_worker(procs, "celery-second", env, tmp_path)

        charges = [r.get(timeout=TIMEOUT) for r in (recorded, unrecorded, uncommitted)]
        recovered = time.monotonic() - killed_at

        calls = card.calls()
        # Recorded before the kill: not called again.
        assert calls[key10] == calls[key12] == 1
        # Called, not recorded: called again, with the same key only.
        assert calls[key11] in (1, 2)
        assert set(calls) == {key10, key11, key12}
        paid = rows(db, "SELECT order_id, charge FROM shop_payments ORDER BY order_id")
        assert paid == list(zip((10, 11, 12), charges, strict=True))
        done = rows(db, "SELECT key, status FROM onceonly_jobs ORDER BY key")
        assert done == [(f"charge:{n}", "done") for n in (10, 11, 12)]
        assert second.alive(), second.output()[-3000:]
        print(f"\ncelery crash: recovered {recovered:.1f} s after the kill; calls {dict(calls)}")
    finally:
        queue.close()
        card.close()
        db.dispose()


def test_a_pool_child_killed_mid_task_is_given_back_and_acts_once(
    redis_url: str, database_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    """A prefork child SIGKILLed after the charge: its parent gives the message
    back (``reject_on_worker_lost``), another child waits out the dead one's
    lease and finishes the task without charging again."""
    db = create_engine(database_url)
    with db.begin() as conn:
        conn.exec_driver_sql(celery_shop.PAYMENTS)
    queue, card = Queue.new(), CardApi()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    env = shop_env(database_url, queue, card, hooks, lease=LEASE)
    try:
        worker = start_celery_worker(
            procs, "celery-prefork", env, tmp_path, concurrency=1, pool="prefork"
        )
        (hooks / "hold-charged-20").touch()
        sent = queue.send("charge", 20, 4990)
        reached = hooks / "reached-charged-20"
        wait_file(reached, TIMEOUT, [worker])
        while not reached.read_text():
            time.sleep(0.01)
        child = int(reached.read_text())
        assert child != worker.pid
        os.kill(child, signal.SIGKILL)
        (hooks / "hold-charged-20").unlink()

        charge = sent.get(timeout=TIMEOUT)
        assert card.calls() == {task_effect_key("charge:20", "charge"): 1}
        assert rows(db, "SELECT order_id, charge FROM shop_payments") == [(20, charge)]
        assert worker.alive()
        assert "WorkerLostError" in worker.output()
    finally:
        queue.close()
        card.close()
        db.dispose()
