"""The RQ recipe of docs/celery.md: ``KeyedTasks.task`` jobs run by RQ's own
worker (``SimpleWorker``, in this process) from Redis, on both engines."""

from __future__ import annotations

import importlib
import sys
import uuid
from types import ModuleType

import pytest
import redis
from rq import Queue, SimpleWorker
from rq.job import JobStatus

import celery_shop
from celery_support import CardApi, broker_url
from onceonly.db import create_engine
from onceonly.tasks import task_effect_key
from processes import rows


class _Worker(SimpleWorker):
    """RQ's worker without its command channel (Redis pub/sub, for "stop this
    job" commands), which these tests do not use. Its thread waits up to 60 s
    for a message, and when the worker unsubscribes before the subscription
    was confirmed, stopping the thread waited out those 60 s: seen in CI, once
    in a run, for a test that otherwise takes a second or two (rq 3.0.0,
    redis-py 8.2.0)."""

    def subscribe(self) -> None:
        pass


def fresh_shop(database_url: str, card: CardApi, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("ONCEONLY_DATABASE_URL", database_url)
    monkeypatch.setenv("SHOP_CARD_URL", card.url)
    sys.modules.pop("rq_shop", None)
    return importlib.import_module("rq_shop")


def test_rq_jobs_of_one_key_charge_and_write_once(
    redis_url: str, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = create_engine(database_url)
    with db.begin() as conn:
        conn.exec_driver_sql(celery_shop.PAYMENTS)
    card = CardApi()
    connection = redis.Redis.from_url(broker_url())
    queue = Queue(f"onceonly-test-{uuid.uuid4().hex[:12]}", connection=connection)
    try:
        shop = fresh_shop(database_url, card, monkeypatch)
        jobs = [queue.enqueue(shop.charge, 5, 100) for _ in range(3)]
        jobs.append(queue.enqueue(shop.charge, 6, 200))
        _Worker([queue], connection=connection).work(burst=True)

        assert [job.get_status() for job in jobs] == [JobStatus.FINISHED] * 4
        results = [job.return_value() for job in jobs]
        assert results[0] == results[1] == results[2] != results[3]
        assert card.calls() == {
            task_effect_key("charge:5", "charge"): 1,
            task_effect_key("charge:6", "charge"): 1,
        }
        paid = rows(db, "SELECT order_id, charge FROM shop_payments ORDER BY order_id")
        assert paid == [(5, results[0]), (6, results[3])]
        shop.tasks.dispose()
    finally:
        queue.delete(delete_jobs=True)
        connection.close()
        card.close()
        db.dispose()
