"""Which statuses replay accepts: defined once, in operations.py."""

from __future__ import annotations

import re

from onceonly.dashboard import app
from onceonly.events import EventStatus
from onceonly.operations import DASHBOARD_REPLAYABLE, REPLAYABLE
from onceonly.store.work_queue import WorkQueue


def test_the_replay_statement_accepts_exactly_the_replayable_statuses() -> None:
    for kind in ("sqlite", "postgresql"):
        listed = re.search(r"status IN \(([^)]*)\)", WorkQueue(kind).sql.replay)
        assert listed is not None, kind
        statuses = {s.strip(" '") for s in listed.group(1).split(",")}
        assert statuses == {s.value for s in REPLAYABLE}, kind


def test_the_dashboard_offers_the_finished_statuses_short_of_processed() -> None:
    assert set(DASHBOARD_REPLAYABLE) == {s.value for s in REPLAYABLE} - {"processed"}
    assert app.REPLAYABLE is DASHBOARD_REPLAYABLE
    assert EventStatus.PROCESSED in REPLAYABLE
