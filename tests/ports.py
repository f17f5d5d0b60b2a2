"""Loopback ports for the servers tests start, one block per pytest-xdist worker.

The usual trick (bind port 0, read the number, close, hand it to a server)
races: between the close and the server's own bind, another worker's trick,
or any outgoing connection, can be handed the same number from the kernel's
ephemeral range. The server that loses fails to start while the test's "is it
up?" probe is answered by another test's server, and the test then talks to
the wrong one (seen in CI: every delivery answered 404 by a stranger).

So ports come from below the ephemeral range, from a block each worker owns,
in turn; a port something else already holds (another run, a local service)
is passed over.
"""

from __future__ import annotations

import itertools
import os
import socket

_FIRST = 20000  # under Linux's ephemeral range (32768-60999 by default)
_BLOCK = 1000  # a worker starts far fewer servers than this in one run
_BLOCKS = 12  # 20000-31999


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...; unset under -n 0
    digits = name.removeprefix("gw")
    return int(digits) if digits.isdigit() else _BLOCKS - 1


def _candidates() -> itertools.cycle[int]:
    start = _FIRST + (_worker_index() % _BLOCKS) * _BLOCK
    # Start at a point of the block that depends on the process, so two runs
    # side by side (a developer's and CI's) rarely walk the same numbers.
    offset = os.getpid() % _BLOCK
    block = list(range(start, start + _BLOCK))
    return itertools.cycle(block[offset:] + block[:offset])


_NEXT = _candidates()


def free_port() -> int:
    """A loopback port that no other test of this run is handed."""
    for _ in range(_BLOCK):
        port = next(_NEXT)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no free loopback port in {_FIRST}-{_FIRST + _BLOCK * _BLOCKS - 1}")
