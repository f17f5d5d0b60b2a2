"""The issue-19 benchmark scripts parse their options as their --help says, and
their stall arithmetic is right (the scripts themselves are run by hand, not in CI)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, cast

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def scripts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, ModuleType]]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _load
    import cost_curve
    import instructions
    import purge_stall
    import receive
    import receive_ab
    import worker_peers

    yield {
        "cost_curve": cost_curve,
        "instructions": instructions,
        "purge_stall": purge_stall,
        "receive": receive,
        "receive_ab": receive_ab,
        "worker_peers": worker_peers,
        "_load": _load,
    }
    for name in (
        "_load",
        "_pgio",
        "_prefill",
        "_harness",
        "cost_curve",
        "instructions",
        "purge_stall",
        "worker_peers",
        "receive",
        "receive_ab",
    ):
        sys.modules.pop(name, None)


def test_each_script_prints_its_help(
    scripts: dict[str, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    # argparse formats help strings with %: a bare "10%" in one breaks --help.
    for name, module in scripts.items():
        if not hasattr(module, "parse_args"):
            continue
        with pytest.raises(SystemExit) as exc:
            module.parse_args(["--help"])
        assert exc.value.code == 0, name
        assert f"benchmarks/{name}.py" in capsys.readouterr().out, name


def test_worker_peers_options(scripts: dict[str, ModuleType]) -> None:
    parse = scripts["worker_peers"].parse_args
    args = parse([])
    assert (args.jobs, args.only) == (20_000, ["onceonly", "pgqueuer", "procrastinate"])
    # --only keeps the canonical order, whatever order it was given in.
    assert parse(["--only", "procrastinate,onceonly", "--jobs", "500"]).only == [
        "onceonly",
        "procrastinate",
    ]
    with pytest.raises(SystemExit) as exc:
        parse(["--only", "celery"])
    assert exc.value.code == 2


def test_worker_peers_runs_pgqueuer_on_both_sides_of_onceonly(
    scripts: dict[str, ModuleType],
) -> None:
    peers = scripts["worker_peers"]
    plan = peers.run_plan(["onceonly", "pgqueuer", "procrastinate"], pgqueuer_once=False)
    assert plan == [
        ("pgqueuer", False),
        ("onceonly", False),
        ("pgqueuer", True),
        ("procrastinate", False),
    ]
    assert peers.run_plan(["onceonly", "pgqueuer"], pgqueuer_once=True) == [
        ("onceonly", False),
        ("pgqueuer", False),
    ]
    assert peers.run_plan(["onceonly", "procrastinate"], pgqueuer_once=False) == [
        ("onceonly", False),
        ("procrastinate", False),
    ]
    assert peers.parse_args(["--pgqueuer-once"]).pgqueuer_once

    def runs(onceonly: float, *pgqueuer: float) -> list[Any]:
        def result(peer: str, rate: float, again: bool = False) -> Any:
            return peers.PeerResult(
                peer, "1", 20_000, 20_000 / rate, rate, 20_000, 20_000, {}, 0.0, again=again
            )

        first, *rest = pgqueuer
        return [
            result("pgqueuer", first),
            result("onceonly", onceonly),
            *(result("pgqueuer", r, again=True) for r in rest),
        ]

    # Two pgqueuer runs 5% apart: the ratio to their mean decides.
    steady = runs(10_250, 10_000, 10_500)
    assert (peers.ratio_of(steady), peers.pgqueuer_drift(steady)) == (1.0, 0.048)
    assert peers.verdict(steady) == "met"
    assert peers.verdict(runs(10_000, 10_000, 10_500)) == "MISSED"  # 0.976x
    # 25% apart: above the faster is met, below the slower missed, between UNSTEADY.
    assert peers.verdict(runs(12_500, 9_000, 12_000)) == "met"
    assert peers.verdict(runs(8_900, 9_000, 12_000)) == "MISSED"
    assert peers.verdict(runs(11_000, 9_000, 12_000)) == "UNSTEADY"
    # One pgqueuer run, or none: as before, or no verdict at all.
    assert peers.verdict(runs(11_000, 10_000)) == "met"
    assert peers.verdict(runs(11_000, 10_000)[1:]) == "-"


def test_cost_curve_rows_default_per_engine(scripts: dict[str, ModuleType]) -> None:
    parse = scripts["cost_curve"].parse_args
    assert parse([]).rows == [0, 1_000_000, 10_000_000]
    assert parse(["--engine", "sqlite"]).rows == [0, 1_000_000]
    assert parse(["--rows", "0,20000"]).rows == [0, 20_000]
    for bad in (["--rows", "0,lots"], ["--rows", "-5"], ["--pending", "10"]):
        with pytest.raises(SystemExit):
            parse(bad)


def test_cost_curve_ids_option(scripts: dict[str, ModuleType]) -> None:
    parse = scripts["cost_curve"].parse_args
    assert parse([]).ids == "random"
    assert parse(["--ids", "sequential"]).ids == "sequential"
    with pytest.raises(SystemExit):
        parse(["--ids", "uuid"])


def test_a_fill_names_its_ids_and_refuses_others(scripts: dict[str, ModuleType]) -> None:
    import _prefill

    with pytest.raises(ValueError, match="ids must be one of"):
        _prefill.Fill(rows=1, ids="uuid")
    # Numbered fills keep the template names they had; random ones differ.
    assert _prefill.Fill(rows=5).tag == "r5_p0_s60_n0"
    assert _prefill.Fill(rows=5, ids="random").tag == "r5_p0_s60_n0_random"
    assert _prefill.Fill(rows=5).event_id("pending", 2) == "evt_pending_2"
    # The head of a digest, as long as the numbered id.
    assert _prefill.Fill(rows=5, ids="random").event_id("pending", 12) == (
        "evt_" + hashlib.md5(b"pending12").hexdigest()[:10]
    )
    assert _prefill.Fill(rows=5, pending=3).pending_ids == (6, 8)


def test_scattered_requests_have_digest_ids_and_no_range(
    scripts: dict[str, ModuleType], tmp_path: Path
) -> None:
    receive = scripts["receive"]
    numbered = receive.write_requests(tmp_path / "n.txt", 3, receive.SECRET)
    scattered = receive.write_requests(tmp_path / "s.txt", 3, receive.SECRET, scattered=True)
    assert numbered.id_range(0, 2) == (numbered.event_id(0), numbered.event_id(2))
    assert numbered.event_id(1) < numbered.event_id(2)
    with pytest.raises(ValueError, match="no range"):
        scattered.id_range(0, 2)
    ids = [scattered.event_id(i) for i in range(3)]
    assert ids[0] == "evt_" + hashlib.md5(f"{scattered.tag}0".encode()).hexdigest()[:19]
    assert len(ids[0]) == len(numbered.event_id(0))
    # Each line's body carries its id, and the Python client makes the same ones.
    lines = (tmp_path / "s.txt").read_text().splitlines()
    assert [json.loads(line.split("\t", 1)[1])["id"] for line in lines] == ids
    deliveries = scripts["_load"].Deliveries(scattered=True)
    first = deliveries.next()
    assert first.event_id == receive.event_id(deliveries.tag, 0, scattered=True)
    assert json.loads(first.body)["id"] == first.event_id


def test_purge_stall_options(scripts: dict[str, ModuleType]) -> None:
    parse = scripts["purge_stall"].parse_args
    args = parse([])
    assert (args.rows, args.rate, args.older_than) == (1_000_000, 200.0, "30d")
    assert (args.pause, parse(["--pause", "0.014"]).pause) == (0.0, 0.014)
    for bad in (["--rate", "0"], ["--pause", "-1"], ["--pause", "61"], ["--pause", "nan"]):
        with pytest.raises(SystemExit):
            parse(bad)


def test_longest_gap_is_the_longest_time_without_a_response(
    scripts: dict[str, ModuleType],
) -> None:
    load = scripts["_load"]
    samples = [load.Sample(due=t, done=t + 0.001, status=200) for t in (0.0, 0.01, 0.25, 0.26)]
    # Completions at 0.001, 0.011, 0.251, 0.261 within [0, 0.3]: the gap 0.011 -> 0.251.
    assert load.longest_gap(samples, 0.0, 0.3) == pytest.approx(0.24)
    # A window with no completion at all is one stall as long as the window.
    assert load.longest_gap(samples, 0.1, 0.2) == pytest.approx(0.1)
    assert load.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0


def test_receive_options(scripts: dict[str, ModuleType]) -> None:
    parse = scripts["receive"].parse_args
    args = parse([])
    assert args.connections == [8, 32, 128]
    assert args.targets == ["lean", "bare", "sqlite", "postgres"]
    assert (args.workers, args.json, args.notes) == (1, None, [])
    assert (args.lean_once, parse(["--lean-once"]).lean_once) == (False, True)
    # PostgreSQL's WAL is readied before measuring unless asked not to.
    assert (args.wal_prime, parse(["--no-wal-prime"]).wal_prime) == (True, False)
    # The server connects to PostgreSQL directly unless a delay is asked for.
    assert (args.pg_delay_ms, parse(["--pg-delay-ms", "0.25"]).pg_delay_ms) == (None, 0.25)
    # Numbered event ids unless scattered ones are asked for.
    assert (args.ids, parse(["--ids", "random"]).ids) == ("sequential", "random")
    assert parse(["--connections", "32,8,32", "--targets", "postgres,lean"]).connections == [
        32,
        8,
    ]
    # --json alone: JSON on stdout instead of the table; with a path: a file besides.
    assert parse(["--json"]).json == "-"
    assert parse(["--json", "out.json"]).json == "out.json"
    # nodb is measured only when named, in the same order as the others.
    assert parse(["--targets", "postgres,nodb,lean"]).targets == ["lean", "nodb", "postgres"]
    # SQLite takes one serve process: with workers, onceonly runs on PostgreSQL only.
    args = parse(["--workers", "2"])
    assert args.targets == ["lean", "bare", "postgres"]
    assert "sqlite left out" in args.notes[0]
    for bad in (
        ["--connections", "8,many"],
        ["--connections", "0"],
        ["--connections", "8", "--threads", "16"],
        ["--workers", "0"],
        ["--workers", "2", "--targets", "sqlite"],
        ["--pg-delay-ms", "-1"],
        ["--pg-delay-ms", "2000"],
        ["--ids", "uuid"],
    ):
        with pytest.raises(SystemExit):
            parse(bad)


def test_the_nodb_target_serves_with_no_database_and_still_tells_duplicates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """receive.py's nodb target: `onceonly serve --app nodb_app:app` runs the
    whole receive path on a store that keeps only keys, so a resent event is
    still answered as a duplicate and nothing else is kept."""
    import asyncio

    from onceonly import NewEvent

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delenv("ONCEONLY_DATABASE_URL", raising=False)
    import nodb_app

    store = nodb_app.app.store
    assert store is nodb_app.app.store
    assert isinstance(store, nodb_app.KeysOnly)

    def event(event_id: str, tenant: str = "") -> NewEvent:
        return NewEvent("stripe", event_id, "t", b"{}", {}, tenant=tenant)

    first = asyncio.run(store.insert_events([event("a"), event("b"), event("a")]))
    again = asyncio.run(store.insert_events([event("b"), event("b", tenant="acme")]))
    assert [(r.duplicate, r.id) for r in first] == [(False, 1), (False, 2), (True, 1)]
    assert [(r.duplicate, r.id) for r in again] == [(True, 2), (False, 3)]
    assert store.events == {}


def _result(
    receive: ModuleType,
    target: str,
    rps: float,
    *,
    server: float = 50.0,
    db: float | None = None,
    again: bool = False,
) -> Any:
    """A receive.py result at 32 connections: `rps` requests/s for 8 s, the
    server's CPU per request `server` µs, PostgreSQL's `db`, wrk's 20, p99 5 ms."""
    return receive.TargetResult(
        target=target,
        database=None,
        connections=32,
        workers=1,
        requests=int(rps * 8),
        duration_s=8.0,
        requests_per_s=rps,
        **dict.fromkeys(("p50_ms", "p90_ms", "max_ms"), 1.0),
        p99_ms=5.0,
        **dict.fromkeys(("non_2xx", "socket_errors", "warmup_non_2xx"), 0),
        warmup_requests_per_s=rps,
        server_cpu_pct=90.0,
        other_cpu_pct=0.0,
        server_cpu_s=server * rps * 8 / 1e6,
        server_processes=1,
        cpu_us_per_request=server,
        db_us_per_request=db,
        load_us_per_request=20.0,
        again=again,
    )


def test_receive_budget_says_whether_the_machine_can_carry_the_goal_rate(
    scripts: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    receive = scripts["receive"]
    monkeypatch.setattr(receive.os, "sched_getaffinity", lambda pid: {0, 1})

    # 50% of 20,000 req/s on 2 CPUs leaves 200 µs per request for everything.
    lean = _result(receive, "lean", 20_000)
    tight = _result(receive, "postgres", 6_000, server=120, db=70)  # 120 + 70 + 20 = 210
    roomy = _result(receive, "sqlite", 6_000, server=90)  # 90 + 20 = 110; 90 µs x 10,000/s < a core
    lines = receive.budget_lines([lean, tight, roomy])
    assert len(lines) == 3, lines
    assert lines[0].startswith("budget postgres c32: at 50% of lean (10,000 req/s) 2 CPUs")
    assert "give 200 µs per request; this run used 210" in lines[0]
    assert "does not fit" in lines[0]
    assert "would need 120% of a core" in lines[1]
    assert lines[2].startswith("budget sqlite c32")
    assert "used 110" in lines[2]
    assert lines[2].endswith("so the rate fits in the machine")
    # Without lean at that connection count there is no goal rate.
    assert receive.budget_lines([tight]) == []


def test_receive_judges_the_goal_against_both_lean_runs(scripts: dict[str, ModuleType]) -> None:
    """lean runs again after the other targets: the ratio is to the mean of
    its two runs, and the goal is neither met nor missed when they differ by
    more than _harness.MAX_BASELINE_DRIFT (the machine's speed moved meanwhile)."""
    receive = scripts["receive"]
    settings = receive.parse_args(["--connections", "32"])
    # Steady: 20,000 and 19,000 (5% apart); sqlite at 10,000 is 51% of 19,500.
    steady = [
        _result(receive, "lean", 20_000),
        _result(receive, "sqlite", 10_000),
        _result(receive, "postgres", 9_000),
        _result(receive, "lean", 19_000, again=True),
    ]
    receive.compare(steady)
    lean, sqlite, postgres, again = steady
    assert sqlite.ratio_vs_lean == pytest.approx(10_000 / 19_500, abs=1e-3)
    assert (sqlite.lean_drift, sqlite.goal_verdict(), postgres.goal_verdict()) == (
        0.05,
        "met",
        "MISSED",
    )
    assert (lean.goal_verdict(), again.name, again.warnings) == ("-", "lean again", [])
    [line] = receive.goal_lines(steady, settings)
    assert line.endswith("sqlite met (51%, p99 5.0 ms); postgres MISSED (46%, p99 5.0 ms)")

    # lean served 12,000 before the others and 25,000 after (52% apart): 8,000
    # is 67% of the one and 32% of the other, so the goal is UNSTEADY.
    moved = [
        _result(receive, "lean", 12_000),
        _result(receive, "sqlite", 8_000),
        _result(receive, "postgres", 5_000),  # under half of either: MISSED
        _result(receive, "nodb", 13_000),
        _result(receive, "lean", 25_000, again=True),
    ]
    receive.compare(moved)
    _, sqlite, postgres, _, again = moved
    assert (sqlite.lean_drift, sqlite.goal_met(), sqlite.goal_verdict()) == (
        0.52,
        None,
        "UNSTEADY",
    )
    assert (postgres.goal_met(), postgres.goal_verdict()) == (False, "MISSED")
    assert sqlite.to_dict()["goal"] == "UNSTEADY"
    [warning] = again.warnings
    assert "12,000 requests/s before the other targets and 25,000 after" in warning
    [line] = receive.goal_lines(moved, settings)
    assert "sqlite UNSTEADY (43%, p99 5.0 ms; lean's runs 52% apart: 32% to 67% of them)" in line
    assert line.endswith(
        "postgres MISSED (27%, p99 5.0 ms; lean's runs 52% apart: 20% to 42% of them)"
    )
    # Over half of even the faster run: met, however much lean moved; a p99
    # over the goal's misses it whatever the ratio.
    fast = _result(receive, "sqlite", 13_000)
    slow_tail = _result(receive, "postgres", 13_000)
    slow_tail.p99_ms = 30.0
    moved = [_result(receive, "lean", 12_000), fast, slow_tail, _result(receive, "lean", 25_000)]
    receive.compare(moved)
    assert (fast.goal_verdict(), slow_tail.goal_verdict()) == ("met", "MISSED")

    # lean measured once (--lean-once, or lean alone): no drift to judge.
    once = [_result(receive, "lean", 20_000), _result(receive, "sqlite", 10_000)]
    receive.compare(once)
    assert (once[1].lean_drift, once[1].goal_verdict()) == (None, "met")


def test_receive_ab_options(scripts: dict[str, ModuleType]) -> None:
    parse = scripts["receive_ab"].parse_args
    args = parse(["--a", "HEAD~1"])
    assert (args.a, args.b, args.engine, args.rounds, args.connections) == (
        "HEAD~1",
        ".",
        "sqlite",
        5,
        16,
    )
    assert parse(["--a", ".", "--b", "main", "--engine", "postgresql"]).engine == "postgresql"
    for bad in ([], ["--a", "x", "--rounds", "0"], ["--a", "x", "--engine", "mysql"]):
        with pytest.raises(SystemExit):
            parse(bad)


def test_receive_ab_runs_each_revision_from_its_own_source(
    scripts: dict[str, ModuleType], tmp_path: Path
) -> None:
    ab = scripts["receive_ab"]
    root = BENCHMARKS.parent
    # This checkout, uncommitted changes included: its own src/.
    assert ab.export_src(".", tmp_path) == root / "src"
    # A revision: its src/ as committed, nothing of the working tree.
    src = ab.export_src("HEAD", tmp_path)
    exported = (src / "onceonly" / "__init__.py").read_bytes()
    committed = subprocess.run(
        ["git", "-C", str(root), "show", "HEAD:src/onceonly/__init__.py"],
        capture_output=True,
        check=True,
    ).stdout
    assert exported == committed
    assert not (tmp_path / "src.tar").exists()
    (tmp_path / "other").mkdir()
    with pytest.raises(ab.BenchmarkError, match="cannot export src/ of 'no-such-revision'"):
        ab.export_src("no-such-revision", tmp_path / "other")


@pytest.mark.parametrize("key_order", ["random", "sequential"])
def test_idempotency_cpu_batches_are_stored_and_timed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, key_order: str
) -> None:
    """--batches hands the key store real batches on a real SQLite file: every
    completion lands, every new key is claimed (it raises otherwise), and the
    figures are CPU time that was spent. Random keys are UUID4s, as clients
    send; sequential ones are numbered."""
    import asyncio

    import sqlalchemy as sa

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency_cpu

    try:
        database = tmp_path / "keys.db"
        loop_s, process_s = asyncio.run(
            idempotency_cpu.measure_batches(f"sqlite:///{database}", 3, key_order)
        )
        assert 0 < loop_s <= process_s
        engine = sa.create_engine(f"sqlite:///{database}")
        with engine.connect() as conn:
            statuses = conn.execute(
                sa.text("SELECT status, count(*) FROM onceonly_idempotency_keys GROUP BY status")
            ).all()
            keys = conn.execute(sa.text("SELECT key FROM onceonly_idempotency_keys")).scalars()
            shapes = {str(uuid.UUID(k)) == k if key_order == "random" else "-" in k for k in keys}
        engine.dispose()
        # Four batches of 16 claims; the first three are completed by the next.
        assert dict(statuses) == {"done": 48, "running": 16}
        assert shapes == {True}
        with pytest.raises(ValueError, match="random or sequential"):
            asyncio.run(idempotency_cpu.measure_batches(f"sqlite:///{database}", 1, "sorted"))
    finally:
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


def test_idempotency_cpu_memory_engine_runs_the_middleware(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--engines memory measures the middleware over the in-memory store: every
    fresh key is claimed, runs the endpoint (the driver wants its 201) and is
    stored as done, so the figure is the whole middleware's, minus a database."""
    import asyncio

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency_app
    import idempotency_cpu
    from onceonly.store.memory import MemoryStore

    stores: list[MemoryStore] = []

    def keep() -> MemoryStore:
        store = MemoryStore()
        stores.append(store)
        return store

    monkeypatch.setattr(idempotency_app, "MemoryStore", keep)
    try:
        loop_us, _ = asyncio.run(idempotency_cpu.measure("fresh", "memory://", 40, 8))
        assert loop_us > 0
        (store,) = stores
        records = store.idempotency_keys()
        # 40 measured keys plus the warm-up's, every one completed.
        assert len(records.records) == 80
        assert {r.status for r in records.records.values()} == {"done"}
    finally:
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engines", "postgresql"], "unknown engine postgresql: use sqlite, postgres, memory"),
        (["--targets", "fresh,replays"], "unknown target replays: use fresh, replay"),
        (["--engines", "memory", "--batches", "5"], "--batches measures a database"),
        (["--batches", "5", "--app", "fastapi"], "--batches measures the key store alone"),
    ],
)
def test_idempotency_cpu_refuses_what_it_cannot_measure(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """A misspelt engine or target is an error before anything runs, not a row
    silently left out of the table (or measured as something else)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency_cpu

    try:
        with pytest.raises(SystemExit) as exit_info:
            idempotency_cpu.main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    finally:
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


def test_idempotency_key_order_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency

    try:
        assert idempotency.parse_args([]).key_order == "clustered"
        assert idempotency.parse_args(["--key-order", "random"]).key_order == "random"
        with pytest.raises(SystemExit):
            idempotency.parse_args(["--key-order", "sorted"])
        # PostgreSQL's WAL is readied before measuring unless asked not to;
        # the watch is a no-op on the other engines.
        assert idempotency.parse_args([]).wal_prime is True
        assert idempotency.parse_args(["--no-wal-prime"]).wal_prime is False
        settings = cast(Any, SimpleNamespace(wal_prime=True))
        assert idempotency.wal_watch(None, settings).url is None
        assert idempotency.wal_watch("sqlite:///x.db", settings).url is None
        watch = idempotency.wal_watch("postgresql+asyncpg://u@h/db", settings)
        assert (watch.url, watch.priming) == ("postgresql://u@h/db", True)
        assert idempotency.wal_watch(None, settings).measurement_ends() is None
    finally:
        for name in ("idempotency", "idempotency_app", "_harness", "_wal"):
            sys.modules.pop(name, None)


def test_idempotency_memory_engine_is_a_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """--engines memory is asked for, never a default; it measures fresh keys
    only and is judged against no goal (a database-free figure that said "met"
    would read as the goal reached)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency

    try:
        assert idempotency.parse_args([]).engines == ["sqlite", "postgres"]
        chosen = idempotency.parse_args(["--engines", "memory,sqlite"]).engines
        assert chosen == ["sqlite", "memory"]
        with pytest.raises(SystemExit):
            idempotency.parse_args(["--engines", "sqlite,mysql"])
        assert idempotency.kinds_for("memory") == ("fresh",)
        assert idempotency.kinds_for("postgres") == ("fresh", "replay", "replay-nocache")
        assert idempotency.goal_met("fresh", 0.95, "memory") is None
        assert idempotency.goal_met("fresh", 0.95, "sqlite") is True
        assert idempotency.goal_met("fresh", 0.64, "sqlite") is False
        assert idempotency.goal_text("fresh", 0.95, "memory") == "- (no database: a reference)"
        assert idempotency.goal_text("fresh", 0.64, "postgres") == "MISSED (>=0.8)"
    finally:
        for name in ("idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


def test_idempotency_budget_splits_a_miss_into_cpu_and_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each fresh-key target gets its server CPU per request against what the
    goal leaves it: at 0.8x of a bare endpoint serving 12,500 req/s the core
    has 100 µs per request; bare used 80, so the middleware may add 20. One
    that adds 33 is 13 over; one that adds 15 fits, and if it still misses the
    goal, the time went to waiting."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _harness
    import idempotency

    def result(target: str, engine: str, rps: float, us: float, busy: float) -> Any:
        requests = int(rps * 8)
        run = idempotency.WrkResult(
            requests=requests,
            duration_s=8.0,
            latency_ms=dict.fromkeys(("p50", "p90", "p99", "max"), 1.0),
            non_2xx=0,
            socket_errors={},
            sent=requests,
            non_201=0,
            replayed=0,
            responses=requests,
        )
        cpu = _harness.CpuUse(
            server_pct=busy,
            other_pct=0.0,
            server_cpu_s=us * requests / 1e6,
            postgres_cpu_s=50 * requests / 1e6 if engine == "postgres" else 0.0,
        )
        return idempotency.result_from(target, engine, run, None, cpu)

    try:
        bare = result("bare", "-", 12_500, 80, 99)
        over = result("fresh", "sqlite", 8_000, 113, 90)
        waiting = result("fresh", "postgres", 8_500, 95, 80)
        replay = result("replay", "sqlite", 20_000, 50, 99)
        assert (bare.cpu_us_per_request, over.db_us_per_request) == (80.0, None)
        assert waiting.db_us_per_request == 50.0

        assert idempotency.cpu_budget(bare, bare) is None
        assert idempotency.cpu_budget(replay, bare) is None
        tight = idempotency.cpu_budget(over, bare)
        assert tight is not None
        assert tight.goal_us == pytest.approx(100.0)
        assert tight.allowance_us == pytest.approx(20.0)
        assert tight.added_us == pytest.approx(33.0)
        assert not tight.fits
        roomy = idempotency.cpu_budget(waiting, bare)
        assert roomy is not None
        assert roomy.fits
        assert roomy.db_us == 50.0
        memory = idempotency.cpu_budget(result("fresh", "memory", 11_500, 86, 100), bare)
        assert memory is not None
        assert memory.goal == idempotency.GOAL_FRESH_RATIO

        for r in (bare, over, waiting, replay):
            r.cpu_budget = idempotency.cpu_budget(r, bare)
        lines = idempotency.budget_lines([bare, over, waiting, replay])
        rows = [line.split() for line in lines if line[:1].isdigit()]
        assert rows == [
            ["1", "sqlite", "80", "100", "20", "113", "33", "13", "over", "90%", "-"],
            ["1", "postgres", "80", "100", "20", "95", "15", "within", "80%", "50"],
        ]
        assert idempotency.budget_lines([bare, replay]) == []
        data = over.to_dict()["cpu_budget"]
        assert (data["allowance_us"], data["added_us"], data["fits"]) == (20.0, 33.0, False)
    finally:
        for name in ("idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


def test_idempotency_reads_the_group_commit_around_the_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Wrapped servers run with --stats, and GET /_group-commit gives the counters
    the table's batch and busy columns come from: a claim and a completion per
    fresh request; a replay from the cache adds nothing. Without --stats the
    route does not exist, so the endpoint measured is the same as before."""
    import asyncio

    import httpx

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency
    import idempotency_app
    import idempotency_cpu

    async def counters_after(stats: bool, keys: list[int]) -> list[httpx.Response]:
        app = idempotency_app.build("memory://", 1 << 20, stats=stats)
        task, inbox = await idempotency_cpu._lifespan(app)
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                seen = [await client.get(idempotency_app.STATS_PATH)]
                for i in keys:
                    headers, body = idempotency.cycle_request("gc", 0, i)
                    answer = await client.post("/orders", headers=headers, content=body)
                    assert answer.status_code == 201
                seen.append(await client.get(idempotency_app.STATS_PATH))
                return seen
        finally:
            await inbox.put({"type": "lifespan.shutdown"})
            await task

    try:
        before, after = asyncio.run(counters_after(True, [1, 2, 3, 1, 1]))
        assert before.json() == {"batches": 0, "items": 0, "flush_seconds": 0.0}
        counts = after.json()
        # Three fresh keys, one after the other: a claim and a completion each,
        # each alone in its batch. The first repeat of key 1 reads its record
        # (one claim that finds it done), and caches it; the next is served
        # from the cache.
        assert (counts["batches"], counts["items"]) == (7, 7)
        assert counts["flush_seconds"] > 0
        missing, _ = asyncio.run(counters_after(False, []))
        assert missing.status_code == 404

        used = idempotency.group_commit_use(
            {"batches": 10, "items": 100, "flush_seconds": 1.0},
            {"batches": 110, "items": 3_300, "flush_seconds": 1.5},
            measured_s=2.0,
        )
        assert (used.batches, used.records) == (100, 3_200)
        assert used.records_per_batch == 32.0
        assert used.ms_per_batch == pytest.approx(5.0)
        assert used.busy_pct == pytest.approx(25.0)
        assert "100 batches of 32.0 records, 5.00 ms in flight each" in used.describe()
        idle = idempotency.GroupCommitUse(0, 0, 0.0, 2.0)
        assert "no batch" in idle.describe()
        assert "--stats" in idempotency.server_argv(1, "fresh", "sqlite:///x.db")
        assert "--stats" not in idempotency.server_argv(1, "bare", None)
    finally:
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


def test_idempotency_memory_wait_engine_waits_on_each_batch_and_answers_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--engines memory-wait is the in-memory store with each group-commit
    batch first waiting --memory-wait-ms on the event loop: each batch is in
    flight at least that long, the answers are the same as without the wait (a
    repeat replays), and it is a reference with no goal, measured on fresh
    keys only. A URL with anything but ?wait=SECONDS is refused."""
    import asyncio

    import httpx

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency
    import idempotency_app
    import idempotency_cpu

    async def post(database_url: str) -> tuple[list[httpx.Response], dict[str, float]]:
        app = idempotency_app.build(database_url, 1 << 20, stats=True)
        task, inbox = await idempotency_cpu._lifespan(app)
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                answers = []
                for i in (1, 2, 1):
                    headers, body = idempotency.cycle_request("mw", 0, i)
                    answers.append(await client.post("/orders", headers=headers, content=body))
                counters = (await client.get(idempotency_app.STATS_PATH)).json()
                return answers, counters
        finally:
            await inbox.put({"type": "lifespan.shutdown"})
            await task

    try:
        assert idempotency_app.memory_wait("memory://") == 0
        assert idempotency_app.memory_wait("memory://?wait=0.05") == 0.05
        assert idempotency_app.is_memory("memory://?wait=0.05")
        assert not idempotency_app.is_memory("sqlite:///memory://")
        for bad, message in (
            ("memory://?delay=1", r"takes \?wait=SECONDS only"),
            ("memory://?wait=-1", "0 to 10 seconds"),
            ("memory://?wait=soon", "could not convert"),
        ):
            with pytest.raises(ValueError, match=message):
                idempotency_app.memory_wait(bad)

        answers, counters = asyncio.run(post("memory://?wait=0.05"))
        assert [a.status_code for a in answers] == [201, 201, 201]
        assert answers[2].headers["idempotent-replayed"] == "true"
        assert answers[2].content == answers[0].content
        assert answers[1].content != answers[0].content
        # Two fresh keys (a claim and a completion each) and one replay that
        # reads its record: five batches, each in flight for the 50 ms wait.
        assert counters["batches"] == 5
        assert counters["flush_seconds"] >= 5 * 0.05
        _, unwaited = asyncio.run(post("memory://"))
        assert unwaited["batches"] == 5
        assert unwaited["flush_seconds"] < 0.05

        args = idempotency.parse_args(["--engines", "memory-wait,sqlite", "--memory-wait-ms", "3"])
        assert (args.engines, args.memory_wait_ms) == (["sqlite", "memory-wait"], 3.0)
        assert idempotency.parse_args([]).memory_wait_ms == 2.0
        with pytest.raises(SystemExit):
            idempotency.parse_args(["--engines", "memory-wait", "--memory-wait-ms", "0"])
        assert idempotency.kinds_for("memory-wait") == ("fresh",)
        assert idempotency.goal_met("fresh", 0.95, "memory-wait") is None
    finally:
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


def test_benchmark_ports_come_from_a_range_the_kernel_never_hands_out(
    scripts: dict[str, ModuleType],
) -> None:
    """A benchmark's server port is below the ephemeral range and the tests'
    blocks, never one something holds, and not the same one twice running."""
    import socket

    import _harness

    first = _harness.free_port()
    with socket.socket() as held:
        # Hold the port the next call would hand out: it must be passed over.
        held.bind(("127.0.0.1", _harness._next_port))
        skipped = held.getsockname()[1]
        second = _harness.free_port()
    assert all(19000 <= p < 20000 for p in (first, second))
    assert second not in (first, skipped)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--engine", "memory"], "--engine 'memory': receive takes sqlite or nodb"),
        (["--target", "fresh", "--engine", "nodb"], "fresh takes sqlite or memory"),
        (["--target", "replay", "--engine", "postgresql"], "replay takes sqlite or memory"),
        (["--low", "100", "--high", "100"], "needs 1 <= --low < --high"),
        (["--warmup", "-1"], "--warmup >= 0"),
    ],
)
def test_instructions_refuses_what_it_cannot_count(
    scripts: dict[str, ModuleType],
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    """PostgreSQL's work would be left out of the count, and a count at the
    same two sizes divides by zero: both are refused before anything runs."""
    with pytest.raises(SystemExit) as exit_info:
        scripts["instructions"].parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_instructions_reads_cachegrinds_total(scripts: dict[str, ModuleType]) -> None:
    instructions = scripts["instructions"]
    stderr = "==4107== \n==4107== I   refs:      2,285,608,228\n"
    assert instructions.instructions(stderr) == 2_285_608_228
    import _harness

    with pytest.raises(_harness.BenchmarkError, match="no instruction count"):
        instructions.instructions("==4107== error while loading shared libraries\n")


@pytest.mark.parametrize(
    ("what", "engine"),
    [
        ("receive", "sqlite"),
        ("fresh", "sqlite"),
        ("replay", "sqlite"),
        ("baseline:fresh", "sqlite"),
    ],
)
def test_instructions_children_answer_every_request(what: str, engine: str) -> None:
    """What valgrind counts is a run of real requests, each answered as the
    path should (a child exits with an error on any other answer)."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "instructions.py"), "--child", what, engine, "40", "8"],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_instructions_counts_more_for_onceonly_than_for_an_empty_answer(
    scripts: dict[str, ModuleType], capsys: pytest.CaptureFixture[str]
) -> None:
    """End to end under valgrind, at the smallest counts: the receiver without
    a database still runs more instructions per delivery than a route that
    answers an empty 200, and the report says so as a ratio above 1."""
    if shutil.which("valgrind") is None:
        install = "install it: apt-get install -y valgrind"
        if os.environ.get("ONCEONLY_TEST_REQUIRE_VALGRIND") == "1":
            pytest.fail(f"valgrind is not installed (ONCEONLY_TEST_REQUIRE_VALGRIND=1); {install}")
        pytest.skip(f"valgrind is not installed: not run ({install})")
    status = scripts["instructions"].main(
        ["--engine", "nodb", "--low", "32", "--high", "96", "--warmup", "32"]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    per_request = {
        line.split()[0]: (int(line.split()[-2].replace(",", "")), float(line.split()[-1][:-1]))
        for line in out.splitlines()
        if line.startswith(("baseline ", "B (.)"))
    }
    base, ours = per_request["baseline"], per_request["B"]
    assert base[0] > 0
    assert ours[0] > base[0]
    assert ours[1] == pytest.approx(ours[0] / base[0], abs=0.001)


# A server that answers GET /healthz and, on POST, runs two full collections.
_COLLECTING_SERVER = """
import gc, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def answer(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_GET(self):
        self.answer()

    def do_POST(self):
        gc.collect()
        gc.collect()
        self.answer()

    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_servers_full_collections_are_logged_and_read_by_their_window(
    scripts: dict[str, ModuleType], tmp_path: Path
) -> None:
    """Every server the wrk benchmarks start carries the collections probe
    (benchmarks/collections_probe): the full collections it ran while
    measured are what the scripts report as stalls."""
    import time

    import _harness

    port = _harness.free_port()
    procs = _harness.Processes()
    argv = [sys.executable, "-c", _COLLECTING_SERVER, str(port)]
    env = {k: v for k, v in os.environ.items() if k != _harness.COLLECTIONS_ENV}
    try:
        with _harness.server(
            procs, "probe", argv, port=port, env=env, cwd=tmp_path, ready=("GET", "/", None)
        ) as srv:
            since = time.time()
            assert _harness.http_status(port, "POST", "/", b"") == 200
            until = time.time()
            pauses = srv.full_collections(since, until)
            later = srv.full_collections(until, until + 3600)
    finally:
        procs.stop_all()
    assert len(pauses) == 2
    assert all(0 <= held < 5000 for held in pauses)
    assert later == []
    assert _harness.describe_collections(pauses).startswith("2 full collections, longest ")
    assert _harness.describe_collections([]) == "no full collection"


def test_the_collections_probe_does_nothing_unless_asked(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ONCEONLY_BENCH_COLLECTIONS"}
    env["PYTHONPATH"] = str(BENCHMARKS / "collections_probe")
    code = "import gc, sys; gc.collect(); print(sys.modules['sitecustomize'].__file__)"
    ran = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert "collections_probe" in ran.stdout  # it was imported, and wrote nothing
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("database_url", [None, "memory://"], ids=["bare", "wrapped"])
def test_idempotency_gc_freeze_freezes_every_server_once_started(
    monkeypatch: pytest.MonkeyPatch, database_url: str | None
) -> None:
    """--gc-freeze: each server, bare and wrapped alike, freezes its heap once
    its start-up has run (what docs/idempotency.md advises); without it, the
    collector is left as a server has it."""
    import asyncio
    import gc

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency
    import idempotency_app
    import idempotency_cpu

    async def frozen_after_start(gc_freeze: bool) -> int:
        app = idempotency_app.build(database_url, 1024, gc_freeze=gc_freeze)
        task, inbox = await idempotency_cpu._lifespan(app)
        count = gc.get_freeze_count()
        await inbox.put({"type": "lifespan.shutdown"})
        await task
        return count

    gc.unfreeze()
    try:
        assert asyncio.run(frozen_after_start(False)) == 0
        assert asyncio.run(frozen_after_start(True)) > 1000
        for target, url in (("fresh", "sqlite:///x.db"), ("bare", None)):
            assert "--gc-freeze" in idempotency.server_argv(1, target, url, gc_freeze=True)
        assert "--gc-freeze" not in idempotency.server_argv(1, "bare", None)
    finally:
        gc.unfreeze()
        for name in ("idempotency_cpu", "idempotency", "idempotency_app", "_harness"):
            sys.modules.pop(name, None)


def test_purge_stall_puts_each_full_collection_in_its_window(
    scripts: dict[str, ModuleType], tmp_path: Path
) -> None:
    """purge_stall.py's windows are on perf_counter and the probe logs wall
    time: a full collection logged in the middle of the purge is counted in
    "during purge", not before or after it."""
    import time

    import _harness

    purge_stall, load = scripts["purge_stall"], scripts["_load"]
    start = time.perf_counter()
    run = load.LoadRun(
        samples=[load.Sample(start + t, start + t + 0.001, 200) for t in (0.0, 1.0, 2.0, 2.9)],
        started=start,
        ended=start + 3.0,
    )
    to_wall = time.time() - time.perf_counter()
    log = tmp_path / "probe.collections"
    log.write_text(
        f"{start + to_wall + 0.5:.6f} 1 7.5\n"  # before the purge
        f"{start + to_wall + 1.5:.6f} 1 42.0\n"  # during it
        f"{start + to_wall + 1.6:.6f} 2 3.0\n"  # during it, another process
    )
    no_process = cast("subprocess.Popen[bytes]", None)  # only its log is read here
    srv = _harness.Server("probe", no_process, 0, tmp_path / "probe.log", log)
    windows = [
        purge_stall.window(name, run, a, b, srv)
        for name, a, b in (
            ("before purge", start, start + 1.0),
            ("during purge", start + 1.0, start + 2.0),
            ("after purge", start + 2.0, start + 3.0),
        )
    ]
    assert [w.full_collections_ms for w in windows] == [[7.5], [42.0, 3.0], []]
    assert purge_stall.window("no server", run, start, start + 3.0).full_collections_ms == []
    # On PostgreSQL, the WAL read at both ends: what the window wrote, and
    # the segment files the server made meanwhile; not read, nothing said.
    import _wal

    before = _wal.WalState(lsn=10_000_000, segments=5, ready=2, segment_bytes=16 << 20,
                           max_wal_bytes=1 << 30)  # fmt: skip
    after = _wal.WalState(lsn=90_000_000, segments=8, ready=0, segment_bytes=16 << 20,
                          max_wal_bytes=1 << 30)  # fmt: skip
    during = purge_stall.window("during purge", run, start, start + 3.0, srv, (before, after))
    assert (during.wal_bytes, during.wal_segments_made) == (80_000_000, 3)
    unread = purge_stall.window("during purge", run, start, start + 3.0, srv, (before, None))
    assert (unread.wal_bytes, unread.wal_segments_made) == (None, None)
    # The readings taken in between count each rise: 5 -> 9 files, then a
    # checkpoint's removals down to 8 would read as 3 from the ends alone.
    peak = _wal.WalState(lsn=60_000_000, segments=9, ready=1, segment_bytes=16 << 20,
                         max_wal_bytes=1 << 30)  # fmt: skip
    sampled = purge_stall.window(
        "during purge", run, start, start + 3.0, srv, (before, after), [peak]
    )
    assert (sampled.wal_segments_made, sampled.wal_readings) == (4, 3)


def test_segments_made_adds_up_each_rise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _wal

    def files(n: int) -> _wal.WalState:
        return _wal.WalState(lsn=0, segments=n, ready=0, segment_bytes=16 << 20,
                             max_wal_bytes=1 << 30)  # fmt: skip

    # Two made, a checkpoint removes three, one more made: three in all.
    assert _wal.made_through([files(n) for n in (10, 11, 12, 9, 10)]) == 3
    assert _wal.segments_made(files(10), files(10)) == 0
    assert _wal.segments_made(files(12), files(9)) == 0
    assert _wal.made_through([files(10)]) == 0
    assert _wal.made_through([]) == 0


def test_wal_report_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import _wal

    made = _wal.WalReport(
        written_bytes=240_000_000,
        segments_made=3,
        ready_bytes=16_777_216,
        priming="not primed (--no-wal-prime)",
    )
    assert made.describe() == (
        "240 MB written while measured, 17 MB of segments ready before; 3 new segment(s) "
        "made meanwhile, each written and fsynced while commits waited; "
        "not primed (--no-wal-prime)"
    )
    assert made.warning() == (
        "PostgreSQL made 3 new WAL segment(s) while measured: commits waited for each, "
        "and the tail latency shows it"
    )
    warm = _wal.WalReport(written_bytes=150_000_000, segments_made=0, ready_bytes=10**9)
    assert warm.describe() == (
        "150 MB written while measured, 1,000 MB of segments ready before; no new segment made"
    )
    assert warm.warning() is None
    refused = _wal.WalReport(unknown="InsufficientPrivilegeError: permission denied")
    assert refused.describe() == "not known (InsufficientPrivilegeError: permission denied)"
    # The WAL a measurement will write: the warm-up's rate over its length, and a quarter.
    assert _wal.needed_for(20_000_000, 2.0, 8.0) == 100_000_000
    assert _wal.needed_for(20_000_000, 0.0, 8.0) == 0


def test_a_runs_figures_are_fields_of_each_scripts_result_row(
    scripts: dict[str, ModuleType], monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import _harness

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import idempotency

    run = _harness.WrkResult(
        duration_s=2.0,
        requests=1000,
        non_2xx=1,
        socket_errors={"connect": 0, "read": 2},
        latency_ms={"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 9.0},
        sent=1001,
    )
    figures = run.figures()
    assert (figures["requests_per_s"], figures["socket_errors"], figures["max_ms"]) == (
        500.0,
        2,
        9.0,
    )
    for row in (scripts["receive"].TargetResult, idempotency.TargetResult):
        assert set(figures) <= {f.name for f in dataclasses.fields(row)}, row
    sys.modules.pop("idempotency", None)
