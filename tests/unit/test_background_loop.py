"""The background loop: one event loop that a process's synchronous callers
share (WSGI threads, Django's sync views), a new one in a forked child, the
store closed on it at exit."""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from onceonly._threads import LoopThread, background_loop


async def _loop_id() -> int:
    return id(asyncio.get_running_loop())


def test_every_thread_of_a_process_runs_on_the_same_loop() -> None:
    shared = background_loop()
    with ThreadPoolExecutor(8) as pool:
        loops = set(pool.map(lambda _: background_loop().run(_loop_id()), range(32)))
    # One loop: concurrent requests on server threads meet in one group commit.
    assert loops == {id(shared.loop)}


def test_an_exception_reaches_the_caller() -> None:
    async def fail() -> None:
        raise LookupError("from the loop")

    with pytest.raises(LookupError, match="from the loop"):
        background_loop().run(fail())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_forked_child_gets_a_loop_thread_of_its_own() -> None:
    parent = background_loop()
    parent.run(_loop_id())  # started before the fork, as with gunicorn --preload
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread does not exist here
        try:
            child = background_loop()
            answer = child.run(_loop_id())
            ok = child is not parent and answer == id(child.loop) and child.pid == os.getpid()
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 2) == b"ok"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert background_loop() is parent  # the parent's is untouched


def test_close_runs_the_closers_on_the_loop_and_stops_it() -> None:
    own = LoopThread()
    closed: list[int] = []

    async def close_store() -> None:
        closed.append(id(asyncio.get_running_loop()))

    own.on_close(close_store)
    own.close()
    assert closed == [id(own.loop)]
    assert own.loop.is_closed()
    assert not any(t is own.thread for t in threading.enumerate())
