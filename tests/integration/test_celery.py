"""Celery tasks declared with ``OnceTasks``, run by a real ``celery worker``
subprocess on Redis, on both engines: what a task's caller would notice.

Eager mode would not do: the guarantees are about redelivered messages, a
worker's own process and its database connections.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

import celery_shop
from celery_support import CardApi, Queue, shop_env, start_celery_worker, wait_file
from onceonly.db import create_engine
from onceonly.tasks import task_effect_key
from processes import Proc, rows

RESULT_TIMEOUT = 30


@dataclass
class Shop:
    queue: Queue
    card: CardApi
    db: sa.Engine
    hooks: Path
    worker: Proc

    def payments(self, order_id: int) -> list[str]:
        found = rows(self.db, "SELECT charge FROM shop_payments WHERE order_id = :o", o=order_id)
        return [str(charge) for (charge,) in found]

    def job(self, key: str) -> tuple[str, str | None]:
        (status, result), *_ = rows(
            self.db, "SELECT status, result FROM onceonly_jobs WHERE key = :k", k=key
        )
        return str(status), result


@pytest.fixture
def shop(redis_url: str, database_url: str, tmp_path: Path, procs: list[Proc]) -> Iterator[Shop]:
    db = create_engine(database_url)
    with db.begin() as conn:
        conn.exec_driver_sql(celery_shop.PAYMENTS)
    queue, card = Queue.new(), CardApi()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    env = shop_env(database_url, queue, card, hooks, lease=2.0)
    worker = start_celery_worker(procs, "celery-worker", env, tmp_path)
    try:
        yield Shop(queue, card, db, hooks, worker)
    finally:
        worker.kill()
        queue.close()
        card.close()
        db.dispose()


def test_a_completed_task_is_remembered_its_charge_and_write_made_once(shop: Shop) -> None:
    first = shop.queue.send("charge", 1, 1990).get(timeout=RESULT_TIMEOUT)
    # A second .delay() of the same key, after the first one ended: not run again.
    again = shop.queue.send("charge", 1, 1990).get(timeout=RESULT_TIMEOUT)
    assert first == again == "ch_1"
    assert shop.card.calls() == {task_effect_key("charge:1", "charge"): 1}
    assert shop.payments(1) == ["ch_1"]
    assert shop.job("charge:1") == ("done", '"ch_1"')

    # The same key with other arguments is refused, never given this result.
    with pytest.raises(Exception, match="other arguments") as refused:
        shop.queue.send("charge", 1, 500).get(timeout=RESULT_TIMEOUT)
    assert type(refused.value).__name__ == "JobConflict"
    assert len(shop.card.calls()) == 1
    assert shop.payments(1) == ["ch_1"]


def test_a_task_write_commits_with_its_done_mark_and_a_failure_leaves_neither(
    shop: Shop,
) -> None:
    with pytest.raises(Exception, match="failed after its write"):
        shop.queue.send("book", 2, True).get(timeout=RESULT_TIMEOUT)
    assert shop.payments(2) == []
    assert shop.job("book:2")[0] == "failed"

    # A failed key is not remembered as done: the next call runs it.
    assert shop.queue.send("book", 2, False).get(timeout=RESULT_TIMEOUT) == 2
    assert shop.queue.send("book", 2, False).get(timeout=RESULT_TIMEOUT) == 2
    assert shop.payments(2) == ["booked"]
    assert shop.job("book:2") == ("done", "2")


def test_a_key_running_elsewhere_is_retried_until_the_holder_ends_not_skipped(
    shop: Shop,
) -> None:
    # Held after its charge, before its transaction: the key's lease, renewed
    # while the holder lives, is all that stops the second delivery.
    (shop.hooks / "hold-charged-3").touch()
    holder = shop.queue.send("charge", 3, 700)
    wait_file(shop.hooks / "reached-charged-3", RESULT_TIMEOUT, [shop.worker])
    waiter = shop.queue.send("charge", 3, 700)
    deadline = time.monotonic() + RESULT_TIMEOUT
    while waiter.state != "RETRY":
        assert time.monotonic() < deadline, shop.worker.output()[-3000:]
        time.sleep(0.05)
    # Retrying is not finishing: nothing was recorded for it meanwhile.
    assert shop.payments(3) == []
    assert not waiter.ready()
    assert "retry: Retry in 0.3s: JobInProgress" in shop.worker.output()

    (shop.hooks / "hold-charged-3").unlink()
    assert holder.get(timeout=RESULT_TIMEOUT) == "ch_1"
    assert waiter.get(timeout=RESULT_TIMEOUT) == "ch_1"
    assert shop.card.calls() == {task_effect_key("charge:3", "charge"): 1}
    assert shop.payments(3) == ["ch_1"]
