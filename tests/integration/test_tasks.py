"""Keyed tasks (``onceonly.tasks``) without a queue, on both engines: the
ledger across runs of one key, and ORM writes that commit with the done mark."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from onceonly import Onceonly
from onceonly.tasks import KeyedTasks, TaskContext


class Base(DeclarativeBase):
    pass


class Shipment(Base):
    __tablename__ = "shipments"
    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    label: Mapped[str]


@pytest.fixture
def tasks(database_url: str) -> Iterator[KeyedTasks]:
    app = Onceonly(database_url=database_url, environ={})
    Base.metadata.create_all(app.engine)
    runner = KeyedTasks(app.guard())
    yield runner
    runner.dispose()


def shipments(tasks: KeyedTasks) -> list[tuple[int, str]]:
    with tasks.guard.engine.connect() as conn:
        found = conn.execute(sa.text("SELECT id, label FROM shipments ORDER BY id"))
        return [(int(i), str(label)) for i, label in found]


def test_an_effect_recorded_by_a_failed_run_is_returned_to_the_next_not_called(
    tasks: KeyedTasks,
) -> None:
    calls: list[str] = []

    def ship(ctx: TaskContext, fail: bool) -> str:
        def print_label(key: str) -> str:
            calls.append(key)
            return f"label-{len(calls)}"

        label = ctx.effect("label", print_label)
        ctx.session.add(Shipment(id=7, label=label))
        if fail:
            raise RuntimeError("the printer jammed")
        return label

    with pytest.raises(RuntimeError, match="jammed"):
        tasks.run("ship:7", lambda ctx: ship(ctx, fail=True))
    assert shipments(tasks) == []  # the ORM write went with the failed run

    assert tasks.run("ship:7", lambda ctx: ship(ctx, fail=False)) == "label-1"
    assert tasks.run("ship:7", lambda ctx: ship(ctx, fail=False)) == "label-1"
    assert len(calls) == 1
    assert shipments(tasks) == [(7, "label-1")]
    # Done: its records are gone (a repeat never reads them).
    assert tasks.records.find(tasks.effects_engine, "ship:7", "label") is None


def test_effect_keys_are_the_same_on_every_run_and_differ_per_task_and_name(
    tasks: KeyedTasks,
) -> None:
    seen: list[str] = []

    def probe(ctx: TaskContext) -> None:
        seen.extend([ctx.effect_key("charge"), ctx.effect_key("mail")])
        raise RuntimeError("again")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            tasks.run("order:1", probe)
    with pytest.raises(RuntimeError):
        tasks.run("order:2", probe)
    assert seen[0:2] == seen[2:4]
    assert len(set(seen)) == 4
