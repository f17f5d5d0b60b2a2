"""A TCP proxy on loopback that delays every byte by a fixed time each way.

    python benchmarks/delay_proxy.py --listen 15432 --target 127.0.0.1:5432 --delay-ms 0.25

It stands for a database farther away than the benchmark's own machine (in
another zone, across a network), so that the receive path can be measured
against one: ``python benchmarks/receive.py --pg-delay-ms 0.25`` starts it in
front of PostgreSQL for the server's connections only.

Each direction of each connection has a reader thread, which stamps what it
reads with the time it may go on, and a sender thread, which sleeps until
then and writes it: order is kept, and data read while earlier data waits is
not held up further. Threads, because an event loop's timers round to whole
milliseconds. The proxy adds a round trip of its own even at 0 ms (about
0.1 ms on a 2-core VM, where loopback alone takes 0.03 ms): receive.py
measures the round trip through it and prints it.

It prints ``ready <port>`` on stdout once it accepts connections, and runs
until killed.
"""

from __future__ import annotations

import argparse
import queue
import socket
import sys
import threading
import time
from collections.abc import Sequence

Stamped = tuple[float, bytes]


def _read(source: socket.socket, out: queue.SimpleQueue[Stamped], delay: float) -> None:
    """Everything `source` sends, stamped with when it may go on; b"" at the end."""
    try:
        while data := source.recv(65536):
            out.put((time.monotonic() + delay, data))
    except OSError:
        pass
    out.put((time.monotonic() + delay, b""))


def _send(pending: queue.SimpleQueue[Stamped], target: socket.socket) -> None:
    try:
        while True:
            due, data = pending.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                target.shutdown(socket.SHUT_WR)
                return
            target.sendall(data)
    except OSError:
        pass


def _pipe(source: socket.socket, target: socket.socket, delay: float) -> None:
    pending: queue.SimpleQueue[Stamped] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(source, pending, delay), daemon=True).start()
    threading.Thread(target=_send, args=(pending, target), daemon=True).start()


def serve(listen: int, host: str, port: int, delay: float) -> None:
    server = socket.create_server(("127.0.0.1", listen))
    print(f"ready {server.getsockname()[1]}", flush=True)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection((host, port), timeout=10)
        except OSError:
            client.close()  # the client sees the refusal as a closed connection
            continue
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _pipe(client, upstream, delay)
        _pipe(upstream, client, delay)


def _target(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError("expected HOST:PORT")
    return host, int(port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python benchmarks/delay_proxy.py",
        description="TCP proxy on 127.0.0.1 that delays every byte by a fixed time each way.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--listen", type=int, default=0, help="port to listen on (0: any)")
    parser.add_argument("--target", type=_target, required=True, help="HOST:PORT to forward to")
    parser.add_argument(
        "--delay-ms", type=float, default=0.25, help="added to each direction, in milliseconds"
    )
    args = parser.parse_args(argv)
    if args.delay_ms < 0 or not 0 <= args.listen <= 65535:
        parser.error("needs --delay-ms >= 0 and a port between 0 and 65535")
    host, port = args.target
    try:
        serve(args.listen, host, port, args.delay_ms / 1000)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
