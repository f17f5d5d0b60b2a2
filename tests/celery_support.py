"""What the Celery tests share: Redis, ``celery worker`` subprocesses, a card API.

Redis answers at 127.0.0.1:6379 (``ONCEONLY_TEST_REDIS_URL`` to change it).
Without it the Celery tests are reported as not run, unless
``ONCEONLY_TEST_REQUIRE_REDIS=1`` (CI), which makes them fail. Each test gets a
Redis database number and a queue of its own, so runs side by side never take
each other's messages.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.result import AsyncResult

from processes import Proc, app_env

REDIS = os.environ.get("ONCEONLY_TEST_REDIS_URL", "redis://127.0.0.1:6379")
REQUIRE_REDIS = os.environ.get("ONCEONLY_TEST_REQUIRE_REDIS", "") == "1"
HERE = Path(__file__).resolve().parent
_numbers = itertools.count()


def redis_missing() -> str | None:
    """Why Redis cannot be used, or None when it answers."""
    try:
        redis.Redis.from_url(REDIS, socket_timeout=2).ping()
    except redis.RedisError as exc:
        return f"Redis does not answer at {REDIS} ({exc}); start redis-server to run this test"
    return None


def broker_url() -> str:
    """A Redis database for one test: 1..15, by process and test."""
    number = 1 + (os.getpid() * 7 + next(_numbers)) % 15
    return f"{REDIS}/{number}"


@dataclass
class Queue:
    """A Redis database, a queue name and a client app that sends to it."""

    broker: str
    name: str
    client: Celery

    @classmethod
    def new(cls) -> Queue:
        broker = broker_url()
        client = Celery("celery-tests", broker=broker, backend=broker)
        return cls(broker, f"onceonly-test-{uuid.uuid4().hex[:12]}", client)

    def send(self, task: str, *args: Any, module: str = "celery_shop") -> AsyncResult[Any]:
        return self.client.send_task(f"{module}.{task}", args=args, queue=self.name)

    def close(self) -> None:
        self.client.close()


class CardApi:
    """``POST /charges`` on loopback: every call kept with its idempotency key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.keys: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                with api.lock:
                    api.keys.append(self.headers["Idempotency-Key"])
                    n = len(api.keys)
                body = json.dumps({"id": f"ch_{n}"}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def calls(self) -> collections.Counter[str]:
        """Calls per idempotency key."""
        with self.lock:
            return collections.Counter(self.keys)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def shop_env(
    database_url: str, queue: Queue, card: CardApi, hooks: Path, lease: float
) -> dict[str, str]:
    if database_url.startswith("sqlite:"):
        # A task holds SQLite's write lock until it commits: a second task
        # meanwhile waits this long, then retries (the default is 5 s).
        database_url += "?busy_timeout=1000"
    env = app_env(
        database_url,
        SHOP_BROKER=queue.broker,
        SHOP_QUEUE=queue.name,
        SHOP_CARD_URL=card.url,
        SHOP_HOOKS=str(hooks),
        SHOP_LEASE=str(lease),
    )
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
    return env


def start_celery_worker(
    procs: list[Proc],
    name: str,
    env: dict[str, str],
    cwd: Path,
    concurrency: int = 2,
    app: str = "celery_shop",
    queue: str | None = None,
    pool: str = "threads",
) -> Proc:
    """``celery worker`` of `app` (on `queue`, or the app's default), its
    `pool` `concurrency` wide; returns once it consumes."""
    log = cwd / f"{name}.log"
    args = [sys.executable, "-m", "celery", "-A", app, "worker", "--pool", pool]
    args += ["-Q", queue] if queue else []
    args += ["--concurrency", str(concurrency), "--loglevel", "info", "--without-heartbeat"]
    args += ["--without-gossip", "--without-mingle", "-n", f"{name}@%h"]
    with log.open("wb") as out:
        process = subprocess.Popen(args, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    proc = Proc(name, process, log)
    procs.append(proc)
    deadline = time.monotonic() + 30
    while " ready." not in proc.output():
        if not proc.alive() or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"celery worker did not come up:\n{proc.output()[-5000:]}")
        time.sleep(0.05)
    return proc


def wait_file(path: Path, timeout: float, watch: list[Proc]) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}:\n{p.output()[-3000:]}" for p in watch)
            raise AssertionError(f"{path.name} did not appear within {timeout} s\n{logs}")
        time.sleep(0.02)
