"""docs/celery.md's example, run exactly as printed: its ``tasks.py`` in a real
``celery worker`` on Redis, sent twice, charges and writes once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from celery_support import CardApi, Queue, start_celery_worker
from onceonly.db import create_engine
from onceonly.tasks import task_effect_key
from processes import Proc, app_env, rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "celery.md"


def example_source() -> str:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"<!-- example: tasks\.py -->\s*```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/celery.md lost its example block"
    return match.group(1)


def test_the_documented_celery_example_charges_and_writes_once(
    redis_url: str, database_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    (tmp_path / "tasks.py").write_text(example_source(), encoding="utf-8")
    queue, card = Queue.new(), CardApi()
    env = app_env(database_url, REDIS_URL=queue.broker, CARD_API_URL=card.url)
    env["PYTHONPATH"] = str(tmp_path)
    try:
        start_celery_worker(procs, "celery-docs", env, tmp_path, app="tasks", queue=queue.name)
        first = queue.send("charge", 42, 1990, module="tasks").get(timeout=30)
        again = queue.send("charge", 42, 1990, module="tasks").get(timeout=30)
        assert first == again
        assert card.calls() == {task_effect_key("charge:42", "charge"): 1}
        db = create_engine(database_url)
        assert rows(db, "SELECT order_id, charge_id FROM payments") == [(42, first)]
        db.dispose()
        with pytest.raises(Exception, match="other arguments"):
            queue.send("charge", 42, 500, module="tasks").get(timeout=30)
    finally:
        queue.close()
        card.close()
