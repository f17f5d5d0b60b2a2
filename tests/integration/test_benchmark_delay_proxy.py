"""benchmarks/delay_proxy.py between a real client and a real echo server on
loopback: what goes through comes back whole and in order, each way takes the
delay, data sent while earlier data waits is not held up further, and an end
of stream passes through."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

PROXY = Path(__file__).resolve().parents[2] / "benchmarks" / "delay_proxy.py"


def _echo(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # closed: the test is over
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_echo, args=(server,), daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()


def _start(target: str, delay_ms: float) -> tuple[subprocess.Popen[bytes], int]:
    argv = [sys.executable, str(PROXY), "--target", target, "--delay-ms", str(delay_ms)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    word, port = proc.stdout.readline().decode().split()
    assert word == "ready"
    return proc, int(port)


@pytest.fixture
def proxy(echo_port: int) -> Iterator[int]:
    proc, port = _start(f"127.0.0.1:{echo_port}", 100)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait()


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the stream ended early"
        data += chunk
    return data


def test_bytes_come_back_whole_in_order_after_the_delay_each_way(proxy: int) -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB: several reads and writes
    with socket.create_connection(("127.0.0.1", proxy), timeout=10) as conn:
        started = time.monotonic()
        conn.sendall(payload)
        assert _read_exactly(conn, len(payload)) == payload
        elapsed = time.monotonic() - started
    assert elapsed >= 0.2  # 100 ms there, 100 ms back


def test_data_sent_while_earlier_data_waits_is_not_held_up_further(proxy: int) -> None:
    with socket.create_connection(("127.0.0.1", proxy), timeout=10) as conn:
        conn.sendall(b"first")
        time.sleep(0.02)
        conn.sendall(b"second")
        assert _read_exactly(conn, 5) == b"first"
        first_back = time.monotonic()
        assert _read_exactly(conn, 6) == b"second"
        gap = time.monotonic() - first_back
    # 20 ms apart on the way out, about as far apart on the way back: each
    # one's delay counted from when the one before it went on would put them
    # 100 ms apart.
    assert gap < 0.08


def test_the_end_of_a_stream_passes_through(proxy: int) -> None:
    with socket.create_connection(("127.0.0.1", proxy), timeout=10) as conn:
        conn.sendall(b"bye")
        conn.shutdown(socket.SHUT_WR)
        assert _read_exactly(conn, 3) == b"bye"
        assert conn.recv(10) == b""  # the echo server saw the end and closed


def test_an_unreachable_target_closes_the_client_and_the_proxy_goes_on() -> None:
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        closed_port = spare.getsockname()[1]  # nothing listens there
    proc, port = _start(f"127.0.0.1:{closed_port}", 0)
    try:
        for _ in range(2):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                assert conn.recv(10) == b""
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize(
    "argv",
    [["--target", "nowhere"], ["--target", "127.0.0.1:1", "--delay-ms", "-1"], []],
)
def test_bad_arguments_are_refused_with_a_message(argv: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(PROXY), *argv], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2
    assert "usage: python benchmarks/delay_proxy.py" in done.stderr
