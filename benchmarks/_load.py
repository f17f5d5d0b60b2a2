"""Receive load from Python (asyncio streams), for machines without wrk and for the fixed-rate
load that purge_stall.py needs (wrk has no fixed-rate mode).

Requests are receive.py's: distinct, correctly signed Stripe events (its
body template), signed as they are sent (an HMAC: microseconds). Each response
is recorded with the moment it was due, sent and completed, so latency can be
measured from the moment a request was due (a fixed-rate sender that falls
behind does not hide the stall that made it fall behind) and the gaps between
completions show a stall directly.

A Python client tops out at a few thousand requests/s on one core, and shares
the cores with the server: with it, receive throughput figures say how the
server behaves relative to the empty-table run of the same script, not what
wrk would measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import secrets
import time
from dataclasses import dataclass, field

from receive import BODY_TEMPLATE, PATH, SECRET, event_id


@dataclass(frozen=True)
class Delivery:
    event_id: str
    headers: dict[str, str]
    body: bytes


class Deliveries:
    """Distinct Stripe deliveries, signed when they are made: a run longer than
    Stripe's 5-minute tolerance (a purge of millions of rows) stays valid."""

    def __init__(self, secret: str = SECRET, *, scattered: bool = False) -> None:
        self.tag = "".join(secrets.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(8))
        self.key = secret.encode()
        self.made = 0
        #: Ids as receive.event_id makes them: numbered, or md5 digests.
        self.scattered = scattered

    def event_id(self, i: int) -> str:
        return event_id(self.tag, i, scattered=self.scattered)

    def next(self) -> Delivery:
        i = self.made
        self.made += 1
        now = int(time.time())
        body = BODY_TEMPLATE % {
            "evt": self.event_id(i),
            "created": now,
            "key": f"{self.tag}{i:010d}Bn",
            "n": f"{i:08d}",
            "idem": f"{self.tag}-{i >> 16:04x}-4{i & 0xFFF:03x}-8000-{i:012x}",
        }
        raw = body.encode()
        signature = hmac.new(self.key, f"{now}.".encode() + raw, hashlib.sha256).hexdigest()
        headers = {
            "content-type": "application/json; charset=utf-8",
            "stripe-signature": f"t={now},v1={signature}",
        }
        return Delivery(self.event_id(i), headers, raw)


@dataclass(frozen=True)
class Sample:
    due: float  # perf_counter: when the request was due (open loop) or sent (closed loop)
    done: float
    status: int  # 0: transport error

    @property
    def latency(self) -> float:
        return self.done - self.due


@dataclass
class LoadRun:
    samples: list[Sample] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    sent: int = 0

    @property
    def ok(self) -> int:
        return sum(1 for s in self.samples if 200 <= s.status < 300)

    @property
    def errors(self) -> int:
        return len(self.samples) - self.ok


def percentile(values: list[float], p: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def longest_gap(samples: list[Sample], start: float, end: float) -> float:
    """The longest time in [start, end] with no response completing."""
    moments = sorted(s.done for s in samples if start <= s.done <= end)
    if not moments:
        return end - start
    edges = [start, *moments, end]
    return max(b - a for a, b in itertools.pairwise(edges))


class Connection:
    """One keep-alive HTTP/1.1 connection to the server on loopback.

    A plain asyncio stream rather than httpx: httpx's pool costs several
    milliseconds of CPU per request once a few dozen requests share it, which
    would measure the client, not the server."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, d: Delivery) -> int:
        """The response's status; 0 for a transport error (the connection is
        then closed, and opened again by the next request)."""
        head = (
            f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: {d.headers['content-type']}\r\n"
            f"Stripe-Signature: {d.headers['stripe-signature']}\r\n"
            f"Content-Length: {len(d.body)}\r\n\r\n"
        ).encode()
        try:
            if self.writer is None or self.reader is None:
                self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
            self.writer.write(head + d.body)
            await self.writer.drain()
            header = await self.reader.readuntil(b"\r\n\r\n")
            lines = header.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            fields = {
                k.strip().lower(): v.strip()
                for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
            }
            await self.reader.readexactly(int(fields.get("content-length", "0")))
            if fields.get("connection", "").lower() == "close":
                await self.close()
            return status
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            await self.close()
            return 0

    async def close(self) -> None:
        writer, self.reader, self.writer = self.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def closed_loop(
    port: int, deliveries: Deliveries, *, connections: int, duration: float
) -> LoadRun:
    """`connections` senders, each sending its next delivery when the last is
    answered, for `duration` seconds (like wrk -c)."""
    run = LoadRun()
    run.started = time.perf_counter()
    stop_at = run.started + duration

    async def sender() -> None:
        conn = Connection(port)
        try:
            while time.perf_counter() < stop_at:
                d = deliveries.next()
                run.sent += 1
                sent = time.perf_counter()
                status = await conn.post(d)
                run.samples.append(Sample(sent, time.perf_counter(), status))
        finally:
            await conn.close()

    await asyncio.gather(*(sender() for _ in range(connections)))
    run.ended = time.perf_counter()
    return run


async def open_loop(
    port: int,
    deliveries: Deliveries,
    *,
    rate: float,
    connections: int,
    until: asyncio.Event,
) -> LoadRun:
    """Deliveries due at a fixed `rate` per second until `until` is set, over at
    most `connections` connections; each sample's latency is from the moment it
    was due."""
    run = LoadRun()
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    pool = [Connection(port) for _ in range(connections)]
    for conn in pool:
        idle.put_nowait(conn)
    tasks: list[asyncio.Task[None]] = []

    async def one(d: Delivery, due: float) -> None:
        conn = await idle.get()  # past `connections` in flight, requests queue here
        try:
            status = await conn.post(d)
        finally:
            idle.put_nowait(conn)
        run.samples.append(Sample(due, time.perf_counter(), status))

    run.started = time.perf_counter()
    try:
        while not until.is_set():
            due = run.started + run.sent / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            run.sent += 1
            tasks.append(asyncio.create_task(one(deliveries.next(), due)))
        await asyncio.gather(*tasks)
    finally:
        run.ended = time.perf_counter()
        for conn in pool:
            await conn.close()
    return run
