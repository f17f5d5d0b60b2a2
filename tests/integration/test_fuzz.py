"""Property-based fuzzing of the receiver over real HTTP, on both engines.

Genuine signed deliveries of several providers are sent mixed, concurrently,
with what an attacker sends (see ``fuzzing.py``). Whatever hypothesis draws:

- no answer is a 5xx (the database is up throughout);
- every genuine delivery gets 200 and its event is stored once;
- no hostile delivery creates an event, or is answered as a duplicate of one;
- afterwards another process can still take SQLite's write lock at once.

A bounded run here (a few thousand requests); ``benchmarks/fuzz.py`` runs
100,000.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzing
from fuzzing import Shot
from onceonly import Onceonly, create_store
from support import live_server

EXAMPLES = 200


@pytest.fixture
def server(database_url: str) -> Iterator[str]:
    app = Onceonly(
        database_url=database_url,
        providers=fuzzing.PROVIDERS,
        environ={},
        max_body_bytes=fuzzing.MAX_BODY_BYTES,
        max_header_bytes=fuzzing.MAX_HEADER_BYTES,
    )
    with live_server(app.asgi()) as url:
        yield url


def shots() -> st.SearchStrategy[list[Shot]]:
    """A handful of genuine deliveries, their resends, and hostile shots built
    from them with bytes and text hypothesis chooses."""
    routes = st.sampled_from(sorted(fuzzing.PROVIDERS))
    junk = st.binary(max_size=200)
    # What an HTTP client lets travel in a header value (it refuses the
    # rest before the receiver could see it).
    text = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=60)

    @st.composite
    def batch(draw: st.DrawFn) -> list[Shot]:
        count = draw(st.integers(1, 4))
        seeds = [fuzzing.genuine(draw(routes), fuzzing.new_id()) for _ in range(count)]
        out = list(seeds)
        for _ in range(draw(st.integers(0, 8))):
            seed = draw(st.sampled_from(seeds))

            kind = draw(st.integers(0, 10))
            if kind == 0:
                out.append(fuzzing.resend(seed))
            elif kind == 1:
                position, flip = draw(st.integers(0, 10**6)), draw(st.integers(1, 255))
                out.append(fuzzing.tampered(seed, position, flip))
            elif kind == 2:
                out.append(fuzzing.forged(seed.body, draw(text)))
            elif kind == 3:
                out.append(fuzzing.unsigned(draw(junk)))
            elif kind == 4:
                poison = draw(st.sampled_from(fuzzing.poisoned_ids()))
                out.append(fuzzing.signed_stripe(poison, "poisoned id"))
            elif kind == 5:
                out.append(fuzzing.signed_stripe(draw(junk), "signed noise"))
            elif kind == 6:
                out.append(fuzzing.oversized_body(seed.body))
            elif kind == 7:
                out.append(fuzzing.oversized_headers(seed))
            elif kind == 8:
                # A captured delivery of any provider, one unsigned (or signed)
                # header changed: a duplicate or a refusal, never a new event.
                header = draw(st.sampled_from(sorted(seed.headers)))
                out.append(fuzzing.replay_altered(seed, header, draw(text)))
            elif kind == 9:
                route = draw(st.sampled_from(["paypal", "x" * 300]))
                out.append(fuzzing.other_route(draw(junk), route))
            else:
                out.append(fuzzing.wrong_method(seed))
        return draw(st.permutations(out))

    return batch()


async def fire(url: str, batch: list[Shot]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(shot: Shot) -> httpx.Response:
            try:
                return await client.request(
                    shot.method, shot.path, content=shot.body, headers=shot.headers
                )
            except httpx.TransportError:
                if not shot.kind.startswith("oversized"):
                    raise
                # Refused from its Content-Length, and the connection closed
                # while the body was still being sent: a refusal too.
                return httpx.Response(413)

        return await asyncio.gather(*(one(s) for s in batch))


async def stored(database_url: str) -> list[tuple[tuple[str, str], bytes]]:
    async with create_store(database_url) as store:
        events = await store.list_events(limit=100_000)
    return [((e.provider, e.event_id), e.body) for e in events]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
@given(batch=shots())
def test_no_hostile_delivery_hurts_a_genuine_one(
    server: str, database_url: str, batch: list[Shot]
) -> None:
    before = {key for key, _ in asyncio.run(stored(database_url))}
    responses = asyncio.run(fire(server, batch))
    genuine: dict[tuple[str, str], bytes] = {}
    for shot, response in zip(batch, responses, strict=True):
        assert response.status_code < 500, (shot.kind, response.status_code, response.text)
        assert response.status_code in shot.expected, (shot.kind, response.status_code)
        if shot.genuine is not None:
            genuine[shot.genuine] = shot.body
    after = asyncio.run(stored(database_url))
    keys = [key for key, _ in after]
    assert len(keys) == len(set(keys))  # each event once
    # Nothing but the genuine events was created (a replay of a captured
    # delivery may arrive first, and then is that event, not a new one)...
    assert set(keys) - before == set(genuine) - before
    # ...and none was swallowed: each is stored with the bytes its sender signed.
    bodies = dict(after)
    for key, body in genuine.items():
        assert bodies[key] == body, key


def test_after_the_fuzz_sqlite_is_writable_by_another_process(
    server: str, database_url: str, engine: str
) -> None:
    poison = [fuzzing.signed_stripe(b, "poisoned id") for b in fuzzing.poisoned_ids()]
    answers = asyncio.run(fire(server, poison))
    assert {a.status_code for a in answers} <= fuzzing.REJECTED
    if engine != "sqlite":
        return
    script = (
        "import sqlite3, sys\n"
        "c = sqlite3.connect(sys.argv[1], timeout=0, isolation_level=None)\n"
        "c.execute('BEGIN IMMEDIATE'); c.execute('ROLLBACK')\n"
    )
    path = database_url.removeprefix("sqlite:///")
    result = subprocess.run([sys.executable, "-c", script, path], capture_output=True, timeout=30)
    assert result.returncode == 0, result.stderr
