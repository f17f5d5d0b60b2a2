"""The store port's contract, on every implementation: the in-memory double
(which the unit tests of the inbox and the receiver trust), SQLite and
PostgreSQL. Each operation of ``onceonly.store.base.Store`` is held to the
same answers, so the double cannot drift from what the databases do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from onceonly import EventStatus, NewEvent, create_store
from onceonly._exceptions import PayloadPurged, StoreError, StoreUnavailable
from onceonly.store import Store, migrate_blocking
from onceonly.store.effects import EffectRecords
from onceonly.store.engine import create_engine, transaction
from onceonly.store.history import EventHistory
from onceonly.store.jobs import JobRecords, JobRow
from onceonly.store.memory import MemoryStore
from onceonly.store.outbox import OutboxRecords, OutboxRow
from onceonly.store.savepoints import HandlerSavepoints
from onceonly.store.work_queue import WorkQueue
from support import ENGINES


@pytest.fixture(params=["memory", *ENGINES])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(kind: str, request: pytest.FixtureRequest) -> str | None:
    """conftest's database_url for `engine` below (a fresh file or database);
    None for the memory double."""
    return None if kind == "memory" else str(request.getfixturevalue("database_url"))


@pytest.fixture
async def store(url: str | None) -> AsyncIterator[Store]:
    opened: Store = MemoryStore() if url is None else create_store(url)
    async with opened:
        yield opened


@pytest.fixture
def engine(kind: str) -> str:
    """Overrides conftest's: the engine ``database_url`` is made for."""
    return kind


def new(event_id: str, provider: str = "stripe", body: bytes = b"{}") -> NewEvent:
    return NewEvent(provider, event_id, "charge.succeeded", body, {"x-test": event_id})


async def test_a_new_event_and_its_duplicates(store: Store) -> None:
    first = await store.insert_events([new("evt_a"), new("evt_b")])
    assert [r.duplicate for r in first] == [False, False]
    again = await store.insert_events([new("evt_b"), new("evt_c"), new("evt_c")])
    assert [r.duplicate for r in again] == [True, False, True]
    # A duplicate's receipt names the row already there.
    assert again[0].id == first[1].id
    assert again[2].id == again[1].id
    # The same id from another provider is another event.
    other = await store.insert_events([new("evt_a", provider="github")])
    assert other[0].duplicate is False
    assert other[0].id != first[0].id
    stored = await store.find_event("stripe", "evt_b")
    assert stored is not None
    assert stored.duplicates == 1


async def test_what_is_stored_is_what_arrived(store: Store) -> None:
    raw = b'{"id": "evt_x",  "amount":1.10}\n\x00\xff'
    (receipt,) = await store.insert_events([new("evt_x", body=raw)])
    assert receipt.id is not None
    got = await store.get_event(receipt.id)
    assert got is not None
    assert (got.body, got.headers, got.event_type) == (raw, {"x-test": "evt_x"}, "charge.succeeded")
    assert got.status is EventStatus.PENDING
    assert got.attempts == 0
    assert got.received_at.tzinfo is not None


async def test_lookups_of_what_is_not_there(store: Store) -> None:
    assert await store.get_event(10**9) is None
    assert await store.find_event("stripe", "evt_never") is None
    assert await store.list_events() == []


async def test_listing_filters_and_pages_newest_first(store: Store) -> None:
    # One delivery at a time: within one batch, PostgreSQL numbers the rows in
    # no promised order (they arrived together), so newest-first is between
    # batches.
    providers = ("stripe", "asaas")
    for i in range(7):
        await store.insert_events([new(f"evt_{i}", provider=providers[i % 2])])
    everything = await store.list_events(limit=100)
    assert [e.event_id for e in everything] == [f"evt_{i}" for i in reversed(range(7))]
    stripe = await store.list_events(provider="stripe", limit=100)
    assert {e.provider for e in stripe} == {"stripe"}
    assert len(stripe) == 4
    page = await store.list_events(limit=3)
    rest = await store.list_events(limit=100, before_id=page[-1].id)
    assert [e.id for e in page + rest] == [e.id for e in everything]
    assert await store.list_events(status=EventStatus.PROCESSED) == []
    assert len(await store.list_events(status=EventStatus.PENDING, limit=100)) == 7
    # One payment, two providers' events about it (and the filters combine).
    for provider, event_id in (("stripe", "evt_pay_a"), ("asaas", "evt_pay_b")):
        await store.insert_events(
            [NewEvent(provider, event_id, None, b"{}", {}, object_id="pay_1")]
        )
    about = await store.list_events(object_id="pay_1")
    assert [(e.provider, e.event_id) for e in about] == [
        ("asaas", "evt_pay_b"),
        ("stripe", "evt_pay_a"),
    ]
    assert [e.event_id for e in await store.list_events(object_id="pay_1", provider="stripe")] == [
        "evt_pay_a"
    ]
    assert await store.list_events(object_id="pay_") == []


class TestWorkQueue:
    """The worker's queue (store/work_queue.py) on each database: there is no
    in-memory double of it, the worker runs on SQLAlchemy engines only."""

    @pytest.fixture(params=ENGINES)
    def kind(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    @pytest.fixture
    def db(self, url: str | None, store: Store) -> Iterator[sa.Engine]:
        """An engine on the store's (migrated) database."""
        assert url is not None
        engine = create_engine(url)
        yield engine
        engine.dispose()

    @pytest.fixture
    def queue(self, kind: str) -> WorkQueue:
        return WorkQueue(kind)

    @staticmethod
    async def due(store: Store, *event_ids: str) -> list[int]:
        receipts = await store.insert_events([new(e) for e in event_ids])
        return [r.id for r in receipts if r.id is not None]

    @staticmethod
    def status(db: sa.Engine, id: int) -> tuple[str, int]:
        with db.connect() as conn:
            row = conn.execute(
                sa.text("SELECT status, attempts FROM onceonly_events WHERE id = :id"), {"id": id}
            ).one()
        return str(row.status), int(row.attempts)

    async def test_a_claim_takes_what_is_due_once(
        self, store: Store, db: sa.Engine, queue: WorkQueue
    ) -> None:
        ids = await self.due(store, "evt_1", "evt_2", "evt_3")
        assert queue.due_count(db) == 3
        first = queue.claim(db, 2, owner="w1", lease=60)
        assert [c.event.id for c in first] == ids[:2]
        got = first[0].event
        assert (got.provider, got.event_id, got.body, got.headers) == (
            "stripe",
            "evt_1",
            b"{}",
            {"x-test": "evt_1"},
        )
        assert (got.status, got.attempts, first[0].fence) == (EventStatus.PROCESSING, 1, 1)
        assert got.received_at.tzinfo is not None
        assert queue.due_count(db) == 1
        assert [c.event.id for c in queue.claim(db, 10, owner="w2", lease=60)] == ids[2:]
        assert queue.claim(db, 10, owner="w2", lease=60) == []
        assert queue.due_count(db) == 0

    async def test_an_expired_lease_is_claimed_again_and_the_old_claim_is_lost(
        self, store: Store, db: sa.Engine, queue: WorkQueue
    ) -> None:
        (id,) = await self.due(store, "evt_1")
        (stale,) = queue.claim(db, 1, owner="dead", lease=0.1)
        await asyncio.sleep(0.3)
        assert queue.due_count(db) == 1
        (fresh,) = queue.claim(db, 1, owner="alive", lease=60)
        assert (fresh.event.id, fresh.fence, fresh.event.attempts) == (id, 2, 2)
        with transaction(db, "test") as conn:
            assert queue.lock_events(conn, [stale, fresh]) == {id}
            queue.mark_processed(conn, [(stale, "h")])  # the lost claim writes nothing
        assert self.status(db, id) == ("processing", 2)

    async def test_a_batch_of_marks_skips_a_lost_claim_and_marks_the_others_with_their_handler(
        self, store: Store, db: sa.Engine, queue: WorkQueue
    ) -> None:
        h_a, h_b = 'app.pay, app."refund"', "back\\slash {x} ünï"
        (lost,) = await self.due(store, "evt_lost")
        (stale,) = queue.claim(db, 1, owner="dead", lease=0.1)
        first, second = await self.due(store, "evt_a", "evt_b")
        claimed = {c.event.id: c for c in queue.claim(db, 2, owner="w", lease=60)}
        claimed[lost] = stale
        await asyncio.sleep(0.3)
        (retaken,) = queue.claim(db, 1, owner="alive", lease=60)
        assert retaken.event.id == lost
        with transaction(db, "test") as conn:
            # One statement for the batch (PostgreSQL): the stale claim on
            # evt_lost, among two that still hold, writes nothing.
            # Several handlers' names are joined with ", "; any character
            # survives the statement's array (quotes, braces, backslashes).
            queue.mark_processed(
                conn,
                [(claimed[lost], "h_lost"), (claimed[first], h_a), (claimed[second], h_b)],
            )
        assert self.status(db, lost) == ("processing", 2)
        with db.connect() as conn:
            processed = sa.text(
                "SELECT id, handler FROM onceonly_events WHERE status = 'processed'"
            )
            rows = {int(row.id): str(row.handler) for row in conn.execute(processed)}
        assert rows == {first: h_a, second: h_b}

    async def test_marks_processed_and_failed(
        self, store: Store, db: sa.Engine, queue: WorkQueue
    ) -> None:
        ok, retry, dead = await self.due(store, "evt_ok", "evt_retry", "evt_dead")
        claimed = {c.event.id: c for c in queue.claim(db, 3, owner="w", lease=60)}
        with transaction(db, "test") as conn:
            assert queue.lock_events(conn, list(claimed.values())) == {ok, retry, dead}
            queue.mark_processed(conn, [(claimed[ok], "handler")])
            queue.mark_failed(conn, claimed[retry], dead=False, delay=0.0, error="E: again")
            queue.mark_failed(conn, claimed[dead], dead=True, delay=0.0, error="E: never")
            queue.insert_attempt(
                conn,
                claimed[dead],
                worker="w",
                outcome="dead",
                error_type="E",
                error_message="never",
                traceback="Traceback ...",
            )
        assert [self.status(db, i)[0] for i in (ok, retry, dead)] == ["processed", "failed", "dead"]
        assert queue.due_count(db) == 1  # the failed one, due again at once
        # What insert_attempt wrote is what the history reads back.
        history = EventHistory(queue.kind)
        (attempt,) = history.attempts(db, dead)
        assert (attempt.attempt, attempt.worker, attempt.outcome) == (1, "w", "dead")
        assert (attempt.error_type, attempt.error_message) == ("E", "never")
        assert attempt.finished_at
        assert history.attempts(db, ok) == []

    async def test_a_release_gives_back_the_attempt(
        self, store: Store, db: sa.Engine, queue: WorkQueue
    ) -> None:
        (id,) = await self.due(store, "evt_1")
        claimed = queue.claim(db, 1, owner="w", lease=60)
        queue.release(db, claimed)
        assert self.status(db, id) == ("pending", 0)
        assert queue.due_count(db) == 1
        queue.release(db, claimed)  # a second time: the claim is no longer current
        assert self.status(db, id) == ("pending", 0)

    async def test_an_extended_lease_is_not_taken_over(
        self, store: Store, db: sa.Engine, queue: WorkQueue
    ) -> None:
        await self.due(store, "evt_1", "evt_2")
        mine, theirs = queue.claim(db, 2, owner="w", lease=0.2)
        queue.extend_leases(db, [mine.event.id, theirs.event.id], owner="w", lease=60)
        queue.extend_leases(db, [], owner="w", lease=60)
        await asyncio.sleep(0.4)
        assert queue.claim(db, 10, owner="other", lease=60) == []

    async def test_replay_puts_finished_events_back_but_not_purged_ones(
        self, store: Store, db: sa.Engine, queue: WorkQueue
    ) -> None:
        done, purged = await self.due(store, "evt_done", "evt_purged")
        claimed = queue.claim(db, 2, owner="w", lease=60)
        with transaction(db, "test") as conn:
            queue.mark_processed(conn, [(c, "h") for c in claimed])
            conn.execute(
                sa.text(
                    "UPDATE onceonly_events SET payload_purged_at = received_at WHERE id = :id"
                ),
                {"id": purged},
            )
        assert queue.replay(db, status="dead") == []
        with pytest.raises(PayloadPurged):
            queue.replay(db, id=purged)
        assert queue.replay(db, id=done) == [done]
        assert self.status(db, done) == ("pending", 0)
        assert queue.replay(db, id=done) == []  # pending: in line already
        assert queue.due_count(db) == 1

    @pytest.fixture
    def unreachable(self, kind: str, tmp_path: Path) -> Iterator[sa.Engine]:
        """An engine on a database that cannot be reached."""
        if kind == "sqlite":
            (tmp_path / "file").write_text("")  # no directory can be made there
            url = f"sqlite:///{tmp_path / 'file' / 'onceonly.db'}"
        else:  # nothing listens on the discard port
            url = "postgresql://postgres@127.0.0.1:9/test?connect_timeout=2"
        engine = create_engine(url)
        yield engine
        engine.dispose()

    def test_an_unreachable_database_raises_store_unavailable(
        self, unreachable: sa.Engine, queue: WorkQueue
    ) -> None:
        with pytest.raises(StoreUnavailable, match="claiming events"):
            queue.claim(unreachable, 1, owner="w", lease=60)
        with pytest.raises(StoreUnavailable):
            queue.due_count(unreachable)
        with pytest.raises(StoreUnavailable):
            queue.replay(unreachable)
        with pytest.raises(StoreUnavailable), transaction(unreachable, "processing events"):
            pass

    async def test_a_transaction_translates_database_errors_only(
        self, store: Store, db: sa.Engine
    ) -> None:
        with pytest.raises(StoreError, match=r"^test: ") as caught, transaction(db, "test") as conn:
            conn.execute(sa.text("SELECT * FROM onceonly_nowhere"))
        assert isinstance(caught.value.__cause__, sa.exc.DBAPIError)
        with pytest.raises(LookupError), transaction(db, "test"):
            raise LookupError("a handler's own error")


async def test_migrating_again_changes_nothing(store: Store) -> None:
    version = await store.schema_version()
    assert version > 0
    assert await store.migrate() == []
    assert await store.schema_version() == version


# The record repositories (effect ledger, outbox, job guard) and the handler
# savepoints, on SQLite and PostgreSQL: they run SQLAlchemy statements, which
# the memory double has no counterpart for.

records_engines = pytest.mark.parametrize("kind", ENGINES, indirect=True)


@pytest.fixture
def db(url: str | None) -> Iterator[sa.Engine]:
    """A migrated database's engine (SQLite file or PostgreSQL database)."""
    assert url is not None
    migrate_blocking(url)
    engine = create_engine(url)
    yield engine
    engine.dispose()


def an_event(url: str | None, event_id: str = "evt_rec") -> int:
    """A stored event's id (effect records reference one on PostgreSQL)."""
    assert url is not None

    async def insert() -> int:
        async with create_store(url) as store:
            (receipt,) = await store.insert_events([new(event_id)])
            assert receipt.id is not None
            return receipt.id

    return asyncio.run(insert())


def unreachable(kind: str, tmp_path: Path) -> sa.Engine:
    """An engine on a database that cannot be reached."""
    if kind == "sqlite":
        return create_engine(f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}")
    return create_engine("postgresql://postgres@127.0.0.1:1/nowhere")


@records_engines
def test_effect_records_keep_the_first_outcome_until_forgotten(
    kind: str, url: str | None, db: sa.Engine, tmp_path: Path
) -> None:
    records = EffectRecords(kind)
    pk = an_event(url)
    # Where the records live: a file of their own on SQLite, the main database
    # (made by the migrations) on PostgreSQL.
    assert records.separate_file is (kind == "sqlite")
    home = create_engine(f"sqlite:///{tmp_path / 'effects.db'}") if records.separate_file else db
    records.create_table(home)
    records.create_table(home)  # again: nothing changes
    with home.connect() as conn:
        assert records.any_record(conn) is False
    assert records.find(home, pk, "charge") is None
    records.record(home, pk, "charge", "oo-key-1", '{"id": "ch_1"}')
    # A second record of the same effect (a retry that raced) changes nothing.
    records.record(home, pk, "charge", "oo-key-1", '{"id": "ch_2"}')
    with home.connect() as conn:
        assert records.find(conn, pk, "charge") == '{"id": "ch_1"}'
        assert records.any_record(conn) is True
    assert records.find(home, pk, "email") is None
    assert records.forget(home, [pk], delete=False) == 1
    assert records.forget(home, [], delete=True) == 0
    assert records.forget(home, [pk, pk + 1], delete=True) == 1
    assert records.find(home, pk, "charge") is None
    if home is not db:
        home.dispose()


@records_engines
def test_outbox_rows_are_claimed_once_and_marked_by_their_claimant(
    kind: str, url: str | None, db: sa.Engine
) -> None:
    records = OutboxRecords(kind)
    pk = an_event(url)
    with db.begin() as conn:
        staged = records.stage(conn, pk, "email", '{"to": "a@example.com"}')
    with db.begin() as conn:  # a rolled-back stage leaves nothing
        records.stage(conn, pk, "email", "{}")
        conn.rollback()
    (row,) = records.claim_of_events(db, [pk], owner="runner-1", lease=30.0)
    assert row == OutboxRow(
        id=staged, action="email", payload='{"to": "a@example.com"}', attempts=0, fence=1
    )
    # Held: neither by event nor by sweep can another runner take it.
    assert records.claim_of_events(db, [pk], owner="runner-2", lease=30.0) == []
    assert records.claim(db, 10, owner="runner-2", lease=30.0) == []
    records.extend_leases(db, [row.id], owner="runner-1", lease=30.0)
    # A failure is recorded by the claim's fence only, and lets the row go.
    stale = OutboxRow(row.id, row.action, row.payload, row.attempts, fence=0)
    assert records.mark_failed(db, stale, error="X: no", delay=0.0, dead=False) is False
    assert records.mark_failed(db, row, error="X: no", delay=0.0, dead=False) is True
    (again,) = records.claim(db, 10, owner="runner-2", lease=30.0)
    assert (again.id, again.attempts, again.fence) == (row.id, 1, 2)
    # Sent, whoever holds it now; then it is no longer pending.
    assert records.mark_sent(db, row.id) is True
    assert records.mark_sent(db, row.id) is False
    assert records.claim(db, 10, owner="runner-3", lease=30.0) == []


@records_engines
def test_a_dead_outbox_row_is_never_claimed_again(kind: str, db: sa.Engine) -> None:
    records = OutboxRecords(kind)
    with db.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO onceonly_outbox (event_pk, action, payload) VALUES (NULL, 'a', '1')"
            )
        )
    (row,) = records.claim(db, 10, owner="r", lease=30.0)
    assert records.mark_failed(db, row, error="X: no", delay=0.0, dead=True) is True
    assert records.claim(db, 10, owner="r", lease=30.0) == []


@records_engines
def test_job_keys_are_claimed_fenced_finished_and_purged(kind: str, db: sa.Engine) -> None:
    records = JobRecords(kind)
    fence = records.claim(db, "report", owner="me", lease=30.0, fingerprint="fp")
    assert fence == 1
    assert records.claim(db, "report", owner="other", lease=30.0) is None
    with records.transaction(db) as conn:
        row = records.read(conn, "report")
        assert row == JobRow("running", 1, None, "fp", expired=False, forgotten=False)
        # Running with a live lease: nobody takes it over.
        assert records.take_over(conn, "report", fence=1, owner="other", lease=30.0) is None
        assert records.read(conn, "never") is None
    records.extend(db, "report", fence=1, lease=30.0)
    assert records.finish(db, "report", fence=0, result='"late"', ttl=None) is False
    assert records.finish(db, "report", fence=1, result='{"rows": 3}', ttl=None) is True
    with records.transaction(db) as conn:
        done = records.read(conn, "report")
    assert done is not None
    assert (done.status, done.result, done.forgotten) == ("done", '{"rows": 3}', False)
    # A failed key is taken over at its fence; the new run finishes briefly remembered.
    assert records.claim(db, "import", owner="me", lease=30.0) == 1
    assert records.fail(db, "import", fence=1, error="OSError: disk full", ttl=None) is True
    with records.transaction(db) as conn:
        assert records.take_over(conn, "import", fence=1, owner="other", lease=30.0) == 2
    assert records.finish(db, "import", fence=2, result=None, ttl=0.05) is True
    assert records.purge(db, dry_run=True) == 0
    time.sleep(0.1)
    with records.transaction(db) as conn:
        forgotten = records.read(conn, "import")
    assert forgotten is not None
    assert forgotten.forgotten is True
    assert records.purge(db, dry_run=True) == 1
    assert records.purge(db) == 1
    assert records.purge(db) == 0
    with records.transaction(db) as conn:
        assert records.read(conn, "import") is None


@records_engines
def test_the_record_repositories_translate_driver_errors(
    kind: str, db: sa.Engine, tmp_path: Path
) -> None:
    away = unreachable(kind, tmp_path)
    try:
        attempts: list[Callable[[], object]] = [
            lambda: EffectRecords(kind).record(away, 1, "charge", "k", "1"),
            lambda: OutboxRecords(kind).claim(away, 10, owner="r", lease=1.0),
            lambda: JobRecords(kind).claim(away, "k", owner="r", lease=1.0),
            lambda: JobRecords(kind).purge(away, dry_run=True),
        ]
        for attempt in attempts:
            with pytest.raises(StoreUnavailable) as unavailable:
                attempt()
            assert isinstance(unavailable.value.__cause__, sa.exc.SQLAlchemyError)
    finally:
        away.dispose()
    # Not an outage: a statement the database refuses (a row staged for an
    # event that does not exist) is a StoreError, and the transaction it was
    # in is rolled back by whoever owns it.
    with pytest.raises(StoreError) as refused, db.begin() as conn:
        OutboxRecords(kind).stage(conn, 10**9, "email", "{}")
    assert not isinstance(refused.value, StoreUnavailable)
    assert isinstance(refused.value.__cause__, sa.exc.IntegrityError)


@records_engines
def test_handler_savepoints_undo_one_handler_and_keep_the_others(kind: str, db: sa.Engine) -> None:
    with db.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE handler_rows (x INTEGER PRIMARY KEY)")
    with db.begin() as conn:
        savepoints = HandlerSavepoints(conn)
        savepoints.arm()  # a handler that writes nothing
        assert savepoints.finish(success=True) is True
        savepoints.arm()
        assert savepoints.finish(success=False) is False
        savepoints.arm()
        conn.exec_driver_sql("INSERT INTO handler_rows VALUES (1)")
        assert savepoints.finish(success=True) is True
        savepoints.arm()
        conn.exec_driver_sql("INSERT INTO handler_rows VALUES (2)")
        assert savepoints.finish(success=False) is False  # undone: 2 is gone
        savepoints.arm()
        conn.exec_driver_sql("INSERT INTO handler_rows VALUES (3)")
        with contextlib.suppress(sa.exc.IntegrityError):
            conn.exec_driver_sql("INSERT INTO handler_rows VALUES (1)")
        # A swallowed error aborts the savepoint on PostgreSQL: its writes are
        # undone and the handler is told so; SQLite undid the one statement.
        assert savepoints.finish(success=True) is (kind == "sqlite")
        savepoints.close()
        conn.exec_driver_sql("INSERT INTO handler_rows VALUES (4)")  # the batch goes on
    with db.connect() as conn:
        kept = conn.exec_driver_sql("SELECT x FROM handler_rows ORDER BY x").scalars().all()
    assert kept == ([1, 3, 4] if kind == "sqlite" else [1, 4])


@pytest.mark.parametrize("kind", [e for e in ENGINES if e == "sqlite"], indirect=True)
def test_sqlite_record_times_come_from_the_repositorys_clock(kind: str, db: sa.Engine) -> None:
    # PostgreSQL reads the server's clock (many machines, one clock); SQLite,
    # on one machine, the clock the repository was given.
    now = [1_000_000.0]
    outbox = OutboxRecords(kind, clock=lambda: now[0])
    jobs = JobRecords(kind, clock=lambda: now[0])
    with db.begin() as conn:
        conn.exec_driver_sql(
            "INSERT INTO onceonly_outbox (event_pk, action, payload) VALUES (NULL, 'a', '1')"
        )
    assert len(outbox.claim(db, 10, owner="dies", lease=30.0)) == 1
    assert jobs.claim(db, "k", owner="dies", lease=30.0) == 1
    now[0] += 29.0  # leases still running
    assert outbox.claim(db, 10, owner="other", lease=30.0) == []
    with jobs.transaction(db) as conn:
        assert jobs.take_over(conn, "k", fence=1, owner="other", lease=30.0) is None
    now[0] += 2.0  # both leases ran out
    (row,) = outbox.claim(db, 10, owner="other", lease=30.0)
    assert row.fence == 2
    with jobs.transaction(db) as conn:
        running = jobs.read(conn, "k")
        assert running is not None
        assert running.expired is True
        assert jobs.take_over(conn, "k", fence=1, owner="other", lease=30.0) == 2
