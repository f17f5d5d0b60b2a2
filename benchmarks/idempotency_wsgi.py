"""The WSGI Idempotency-Key middleware under a threaded WSGI server, with wrk.

gunicorn (gthread, one worker process, --threads threads) serves a Flask
``POST /orders`` (reads the JSON body, answers 201 with ~200 bytes of JSON),
for each target one after the other, with the request shapes of
benchmarks/idempotency.lua:

  bare    the Flask app alone;
  fresh   wrapped in WSGIIdempotencyMiddleware, every request a new key: a
          claim and a completion per request, run on the process's background
          event loop while the request threads block on them;
  replay  the same, cycling over --keys keys: replays from the response cache.

What it shows: whether blocking many server threads on one event loop thread
costs throughput, and how many claims and completions share a commit (the
worker prints its group-commit counters when it exits). The checks: no
non-2xx answer and no socket error; on fresh, no replay; on replay, every
measured answer a replay.

    python benchmarks/idempotency_wsgi.py [--engine sqlite|postgres] [--threads 32]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import flask

HERE = Path(__file__).resolve().parent
LUA = HERE / "idempotency.lua"


def create_app() -> Any:
    """The gunicorn app (``idempotency_wsgi:create_app()``), configured by environment."""
    app = flask.Flask("bench")

    @app.post("/orders")
    def create_order() -> tuple[dict[str, Any], int]:
        order: dict[str, Any] = flask.request.get_json()
        items = order.get("items", [])
        return {
            "id": f"ord_{uuid.uuid4().hex}",
            "object": "order",
            "status": "created",
            "customer": order.get("customer"),
            "items": len(items),
            "amount": sum(int(i.get("quantity", 1)) * 1250 for i in items),
            "currency": order.get("currency", "usd"),
            "created": int(time.time()),
        }, 201

    url = os.environ.get("BENCH_DATABASE_URL")
    if not url:
        return app
    import atexit

    from onceonly import create_store
    from onceonly.idempotency import WSGIIdempotencyMiddleware

    middleware = WSGIIdempotencyMiddleware(app.wsgi_app, store=create_store(url))

    def report() -> None:
        commits = middleware.policy.records
        per = commits.items / max(commits.batches, 1)
        line = f"GROUP_COMMIT batches={commits.batches} items={commits.items} per={per:.1f}"
        print(line, file=sys.stderr, flush=True)

    atexit.register(report)
    app.wsgi_app = middleware  # type: ignore[method-assign]
    return app


def _serve(port: int, threads: int, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "gunicorn", "--worker-class", "gthread", "--workers", "1"]
    args += ["--threads", str(threads), "--bind", f"127.0.0.1:{port}", "--backlog", "2048"]
    args += ["--chdir", str(HERE), "idempotency_wsgi:create_app()"]
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    import socket

    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"gunicorn did not start:\n{log.read_text()}")


def _wrk(port: int, seconds: int, connections: int, mode: str, tag: str, keys: int) -> Any:
    out = subprocess.run(
        [
            *("wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(LUA)),
            *(f"http://127.0.0.1:{port}/orders", "--", mode, tag, str(keys)),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    match = re.search(r"IDEMPOTENCY_RESULT (\{.*\})", out)
    assert match, out
    return json.loads(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=int, default=8)
    parser.add_argument("--keys", type=int, default=50)
    args = parser.parse_args()
    from _harness import free_port, pg_drop, pg_recreate

    work = Path(tempfile.mkdtemp(prefix="onceonly-wsgi-bench-"))
    if args.engine == "sqlite":
        url = f"sqlite:///{work / 'bench.db'}"
    else:
        url = pg_recreate(args.pg_url, "onceonly_bench_wsgi")
    try:
        rows = _measure(args, url, work, free_port)
    finally:
        if args.engine == "postgres":
            pg_drop(args.pg_url, "onceonly_bench_wsgi")
    bare = rows[0][1]
    print(
        f"engine {args.engine}, gunicorn gthread 1 worker x {args.threads} threads, "
        f"wrk -t1 -c{args.connections} -d{args.duration}s"
    )
    print("| target | requests/s | vs bare | p50 ms | p99 ms | group commit | checks |")
    print("|---|---|---|---|---|---|---|")
    for target, rps, p50, p99, stats, ok in rows:
        verdict = "ok" if ok else "FAILED"
        cells = [target, f"{rps:,.0f}", f"{rps / bare:.0%}", f"{p50:.2f}", f"{p99:.2f}"]
        print("| " + " | ".join([*cells, stats, verdict]) + " |")


def _measure(args: argparse.Namespace, url: str, work: Path, free_port: Any) -> list[Any]:
    rows = []
    for target in ("bare", "fresh", "replay"):
        env = dict(os.environ, PYTHONPATH=str(HERE))
        if target != "bare":
            env["BENCH_DATABASE_URL"] = url
        port = free_port()
        log = work / f"{target}.log"
        process = _serve(port, args.threads, env, log)
        tag = f"{target}{uuid.uuid4().hex[:8]}"
        mode = "cycle" if target == "replay" else "fresh"
        if target == "replay":  # create the keys first
            _wrk(port, 2, args.connections, mode, tag, args.keys)
        result = _wrk(port, args.duration, args.connections, mode, tag, args.keys)
        process.terminate()
        process.wait(30)
        stats = re.search(r"GROUP_COMMIT (.*)", log.read_text())
        threads = result["threads"]
        non201 = sum(t["non201"] for t in threads)
        replayed = sum(t["replayed"] for t in threads)
        errors = sum(result["errors"].values())
        rps = result["requests"] / (result["duration_us"] / 1e6)
        ok = non201 == 0 and errors == 0
        if target == "fresh":
            ok = ok and replayed == 0
        if target == "replay":
            ok = ok and replayed == sum(t["responses"] for t in threads)
        latency = result["latency_us"]
        commits = stats.group(1) if stats else "-"
        rows.append((target, rps, latency["p50"] / 1000, latency["p99"] / 1000, commits, ok))
    return rows


if __name__ == "__main__":
    main()
