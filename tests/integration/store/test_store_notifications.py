"""LISTEN on PostgreSQL (store/notifications.py): a replay or a new event
wakes the listener, and a lost connection is a StoreUnavailable, not psycopg's."""

from __future__ import annotations

import time

import pytest

from onceonly import NewEvent, create_store
from onceonly._exceptions import StoreUnavailable
from onceonly.store.engine import create_engine, transaction
from onceonly.store.notifications import EventNotifications
from onceonly.store.work_queue import WorkQueue
from support import ENGINES

pytestmark = pytest.mark.skipif("postgresql" not in ENGINES, reason="PostgreSQL only")


@pytest.fixture
def engine() -> str:
    return "postgresql"


async def test_a_new_event_and_a_replay_are_announced(database_url: str) -> None:
    store = create_store(database_url)
    async with store:
        with EventNotifications(database_url) as notifications:
            assert notifications.wait(0.05) is False  # listening now, nothing said
            await store.insert_events([NewEvent("stripe", "evt_1", "t", b"{}", {})])
            assert notifications.wait(5.0) is True
            assert notifications.wait(0.05) is False

            db = create_engine(database_url)
            try:
                queue = WorkQueue("postgresql")
                assert queue.replay(db) == []  # nothing finished: nothing said
                assert notifications.wait(0.05) is False
                (claimed,) = queue.claim(db, 1, owner="w", lease=60)
                with transaction(db, "test") as conn:
                    queue.mark_processed(conn, [(claimed, "h")])
                assert queue.replay(db) == [claimed.event.id]
                assert notifications.wait(5.0) is True
            finally:
                db.dispose()


def test_an_unreachable_server_is_store_unavailable_and_tried_again() -> None:
    notifications = EventNotifications("postgresql://postgres@127.0.0.1:9/test", connect_timeout=2)
    started = time.monotonic()
    for _ in range(2):  # each wait tries to connect anew
        with pytest.raises(StoreUnavailable, match="listening for new events"):
            notifications.wait(0.1)
    assert time.monotonic() - started < 10
    notifications.close()
