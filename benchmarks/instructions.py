"""Instructions per request, counted by valgrind: where timing cannot tell two trees apart.

On a shared VM the same code's requests/s moves by 30% from one minute to
the next, so a change worth 2-5% cannot be seen in a timing, even in process.
The number of instructions a request runs does not move with the machine's
load: the same tree counted as both A and B comes out within 0.1%.
This script counts them for one hot path, for the baseline endpoint of that
path and for one or two trees, and prints the ratios.

    python benchmarks/instructions.py                               # receive, SQLite, this checkout
    python benchmarks/instructions.py --a HEAD~1                    # ... and HEAD~1 against it
    python benchmarks/instructions.py --target fresh --engine memory --a main --b .

Targets, each driven in process as ASGI calls, 32 at a time (as 32
connections would be), every answer checked:

  receive   signed Stripe deliveries into onceonly's receiver (as
            receive_cpu.py sends them); engines sqlite and nodb (the receiver
            over a store that keeps only keys: the path's own Python).
            Baseline: the lean Starlette route (an empty 200).
  fresh     Idempotency-Key requests with new keys through
            idempotency_app.py's app (as idempotency_cpu.py sends them);
            engines sqlite and memory (the in-memory key store: the
            middleware's own Python). Baseline: the same endpoint, bare.
  replay    the same keys again, answered from the middleware's cache.

PostgreSQL is not offered: its work happens in the server's processes,
which valgrind does not see, so the count would leave out what it costs.

How: each figure comes from two runs of a child process under ``valgrind
--tool=cachegrind --cache-sim=no``, one with --low requests and one with
--high, after the same warm-up. Both first prepare --high requests (signed,
encoded), then set them aside from the garbage collector (``gc.freeze``).
Instructions per request = (count at high - count at low) / (high - low):
the interpreter's start, the imports, the requests' making and the warm-up
cancel out. SQLite's commits are kept on the event loop, as a quick disk
keeps them (under valgrind each takes long enough on the clock to send the
next to the store's thread). Only user-space instructions are counted: the
kernel's part of a commit (its writes and fdatasync) is not. Children run
with PYTHONHASHSEED=0, this interpreter and its installed packages, and the
tree's ``src`` first on PYTHONPATH.

--a and --b each take a git revision (its ``src/`` exported with ``git
archive``) or ``.`` (this checkout's ``src/``, uncommitted changes included:
the default for --b). Without --a, only --b is counted. The baseline is
counted once, with --b's tree on the path.

Exit status: 0 counted, 1 a child failed (a wrong answer, a crash), 2 the
benchmark could not run (no valgrind, a bad revision).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _harness import BenchmarkError, log, parser_for
from receive_ab import THIS_CHECKOUT, export_src

BENCHMARKS = Path(__file__).resolve().parent
TARGETS = {
    "receive": ("sqlite", "nodb"),
    "fresh": ("sqlite", "memory"),
    "replay": ("sqlite", "memory"),
}
BASELINE = "baseline"
CONCURRENCY = 32
_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")


class ChildFailed(Exception):
    """A counted child exited with an error: its answers were wrong, or it crashed."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = parser_for("python benchmarks/instructions.py", __doc__)
    parser.add_argument("--target", choices=sorted(TARGETS), default="receive")
    parser.add_argument(
        "--engine",
        default="sqlite",
        help="receive: sqlite or nodb; fresh, replay: sqlite or memory",
    )
    parser.add_argument("--a", metavar="REV", help="tree A: a git revision or . (optional)")
    parser.add_argument(
        "--b", default=THIS_CHECKOUT, metavar="REV", help="tree B: a git revision or ."
    )
    parser.add_argument("--low", type=int, default=320, help="requests in the shorter count")
    parser.add_argument("--high", type=int, default=1600, help="requests in the longer count")
    parser.add_argument(
        "--warmup", type=int, default=640, help="requests before either count (not counted)"
    )
    parser.add_argument("--valgrind", default="valgrind", help="the valgrind binary")
    args = parser.parse_args(argv)
    if args.engine not in TARGETS[args.target]:
        parser.error(
            f"--engine {args.engine!r}: {args.target} takes {' or '.join(TARGETS[args.target])}"
        )
    if args.low < 1 or args.high <= args.low or args.warmup < 0:
        parser.error("needs 1 <= --low < --high and --warmup >= 0")
    return args


def instructions(valgrind_stderr: str) -> int:
    """The total of cachegrind's summary line ("I refs: 2,285,608,228")."""
    found = _REFS.findall(valgrind_stderr)
    if not found:
        raise BenchmarkError("valgrind printed no instruction count:\n" + valgrind_stderr[-2000:])
    return int(found[-1].replace(",", ""))


@dataclass(frozen=True)
class Count:
    what: str  # the target, or BASELINE
    engine: str
    src: Path

    def command(self, valgrind: str, requests: int, warmup: int, prepared: int) -> list[str]:
        child = [sys.executable, str(Path(__file__).resolve()), "--child", self.what, self.engine]
        tool = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
        return [*tool, *child, str(requests), str(warmup), str(prepared)]

    def run(self, valgrind: str, requests: int, warmup: int, prepared: int) -> int:
        env = dict(os.environ, PYTHONHASHSEED="0")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.src), str(BENCHMARKS), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        done = subprocess.run(
            self.command(valgrind, requests, warmup, prepared),
            cwd=BENCHMARKS,
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise ChildFailed(
                f"{self.what} on {self.engine} ({self.src}) exited with {done.returncode}:\n"
                + done.stderr[-3000:]
            )
        return instructions(done.stderr)

    def per_request(self, args: argparse.Namespace) -> float:
        # Both counts prepare --high requests (signed, encoded) before the
        # warm-up, so that making the requests cancels out with the rest.
        low = self.run(args.valgrind, args.low, args.warmup, args.high)
        high = self.run(args.valgrind, args.high, args.warmup, args.high)
        return float(high - low) / float(args.high - args.low)


# ---------------------------------------------------------------------------
# The children: the requests themselves (run under valgrind, or alone to try).


def _commits_inline(engine: str) -> None:
    """Keep SQLite's commits on the event loop, where a quick disk keeps them.

    A commit that took over INLINE_COMMIT_SECONDS (1 ms) on the clock sends
    the next one to the store's thread. Under valgrind every commit does, so
    the count would follow the thread's path, and how many went there would
    depend on the clock: the same tree counted twice came out 1.2% apart."""
    if engine == "sqlite":
        from onceonly.store import sqlite as sqlite_store

        sqlite_store.INLINE_COMMIT_SECONDS = math.inf


def _set_aside() -> None:
    """Move what exists now (the app, the prepared requests) out of the
    collector's reach: otherwise each full collection walks the requests
    prepared for the longer count, and the two counts no longer differ by
    the requests alone."""
    gc.collect()
    gc.freeze()


async def _receive(
    engine: str, requests: int, warmup: int, prepared: int, *, baseline: bool
) -> None:
    import receive_cpu
    from nodb_app import WithoutDatabase
    from onceonly import Onceonly
    from onceonly.providers import Stripe

    with tempfile.TemporaryDirectory(prefix="onceonly-instructions-") as work:
        onceonly = None
        if baseline:
            app = receive_cpu.lean()
        else:
            kind = WithoutDatabase if engine == "nodb" else Onceonly
            url = None if engine == "nodb" else f"sqlite:///{Path(work) / 'receive.db'}"
            onceonly = kind(
                database_url=url, providers={"stripe": Stripe(receive_cpu.SECRET)}, environ={}
            )
            app = onceonly.asgi()
        warm = receive_cpu.deliveries(warmup, "warm")
        counted = receive_cpu.deliveries(max(prepared, requests), "counted")[:requests]
        _set_aside()
        for batch in (warm, counted):
            for start in range(0, len(batch), CONCURRENCY):
                statuses = await asyncio.gather(
                    *(receive_cpu.call(app, *d) for d in batch[start : start + CONCURRENCY])
                )
                if set(statuses) != {200}:
                    raise SystemExit(f"answers {sorted(set(statuses))}, expected only 200")
        if onceonly is not None:
            await onceonly.store.close()


async def _idempotency(
    target: str, engine: str, requests: int, warmup: int, prepared: int, *, baseline: bool
) -> None:
    import idempotency_cpu
    from idempotency import cycle_request
    from idempotency_app import MEMORY, build

    with tempfile.TemporaryDirectory(prefix="onceonly-instructions-") as work:
        url = MEMORY if engine == "memory" else f"sqlite:///{Path(work) / 'keys.db'}"
        app = build(None if baseline else url, 32 * 1024 * 1024)
        task, inbox = await idempotency_cpu._lifespan(app)
        try:
            # Fixed tags: the same keys in every child, so that both counts
            # insert alike (idempotency_cpu._drive checks every answer is 201).
            # Replays cycle over 500 keys, first stored and asked for once
            # more (the cache fills), for the warm-up and the count alike.
            replay = target == "replay"
            length = max(prepared, requests, warmup if replay else 0, 500 if replay else 0)
            keys = 500 if replay else length
            counted = [cycle_request("436f756e", 0, i % keys) for i in range(length)]
            warm = counted if replay else [cycle_request("5761726d", 0, i) for i in range(warmup)]
            _set_aside()
            if replay and not baseline:
                await idempotency_cpu._drive(app, keys, CONCURRENCY, counted.__getitem__)
                await idempotency_cpu._drive(app, keys, CONCURRENCY, counted.__getitem__)
            await idempotency_cpu._drive(app, warmup, CONCURRENCY, warm.__getitem__)
            await idempotency_cpu._drive(app, requests, CONCURRENCY, counted.__getitem__)
        finally:
            await inbox.put({"type": "lifespan.shutdown"})
            await task


def child(what: str, engine: str, requests: int, warmup: int, prepared: int = 0) -> None:
    """The requests of one count (``--child``): the target's, or its baseline's,
    after `warmup` more; `prepared` requests are made (signed, encoded) first,
    of which the first `requests` are sent."""
    _commits_inline(engine)
    baseline = what.startswith(BASELINE)
    target = what.partition(":")[2] if baseline else what
    if target == "receive":
        asyncio.run(_receive(engine, requests, warmup, prepared, baseline=baseline))
    else:
        asyncio.run(_idempotency(target, engine, requests, warmup, prepared, baseline=baseline))


# ---------------------------------------------------------------------------


def _export(revision: str, into: Path) -> Path:
    """The tree's ``src`` at `into`/src. This checkout's is copied too: a tree
    imported from a path of another length ran 0.7% more instructions per
    request (1.0070 and 1.0071 for the same code), so both sides of a
    comparison sit at paths of the same length."""
    into.mkdir()
    if revision == THIS_CHECKOUT:
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        return Path(shutil.copytree(export_src(revision, into), into / "src", ignore=ignore))
    return export_src(revision, into)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--child"]:
        what, engine, *sizes = argv[1:6]
        child(what, engine, *(int(n) for n in sizes))
        return 0
    args = parse_args(argv)
    valgrind = shutil.which(args.valgrind)
    if valgrind is None:
        log(f"error: {args.valgrind} not found; install it (apt-get install -y valgrind)")
        return 2
    args.valgrind = valgrind
    with tempfile.TemporaryDirectory(prefix="onceonly-instructions-src-") as work:
        try:
            trees = {"b": _export(args.b, Path(work) / "b")}
            if args.a is not None:
                trees = {"a": _export(args.a, Path(work) / "a"), **trees}
            counts = {
                "baseline": Count(f"{BASELINE}:{args.target}", args.engine, trees["b"]),
                **{side: Count(args.target, args.engine, src) for side, src in trees.items()},
            }
            figures: dict[str, float] = {}
            for side, count in counts.items():
                log(f"[{side}] counting {count.what} on {count.engine} ({count.src})")
                figures[side] = count.per_request(args)
        except BenchmarkError as exc:
            log(f"error: {exc}")
            return 2
        except ChildFailed as exc:
            log(f"error: {exc}")
            return 1
    print(report(args, figures))
    return 0


def report(args: argparse.Namespace, figures: dict[str, float]) -> str:
    base = figures["baseline"]
    name = {"baseline": "baseline", "a": f"A ({args.a})", "b": f"B ({args.b})"}
    lines = [
        f"instructions per request, {args.target} on {args.engine}: counts at {args.low} and "
        f"{args.high} requests after {args.warmup} of warm-up (valgrind, user space only)",
        f"{'tree':<28} {'per request':>14} {'vs baseline':>12}",
    ]
    for side in ("baseline", "a", "b"):
        if side in figures:
            lines.append(f"{name[side]:<28} {figures[side]:>14,.0f} {figures[side] / base:>11.3f}x")
    if "a" in figures:
        lines.append(f"B / A: {figures['b'] / figures['a']:.4f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
