"""Instructions per request, counted by valgrind: where timing cannot tell two trees apart.

On a shared VM the same code's requests/s moves by 30% from one minute to
the next, so a change worth 2-5% cannot be seen in a timing, even in process.
The number of instructions a request runs does not move with the machine's
load: the same tree counted as both A and B comes out within about 0.2%.
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
--high, after the same warm-up. Instructions per request = (count at high -
count at low) / (high - low): the interpreter's start, the imports and the
warm-up cancel out. Only user-space instructions are counted: the kernel's
part of a commit (its writes and fdatasync) is not. Children run with
PYTHONHASHSEED=0, this interpreter and its installed packages, and the tree's
``src`` first on PYTHONPATH.

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
import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
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
# The n-th request's headers and body.
MakeRequest = Callable[[int], tuple[dict[str, str], bytes]]
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

    def command(self, valgrind: str, requests: int, warmup: int) -> list[str]:
        child = [sys.executable, str(Path(__file__).resolve()), "--child", self.what, self.engine]
        tool = [valgrind, "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
        return [*tool, *child, str(requests), str(warmup)]

    def run(self, valgrind: str, requests: int, warmup: int) -> int:
        env = dict(os.environ, PYTHONHASHSEED="0")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.src), str(BENCHMARKS), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        done = subprocess.run(
            self.command(valgrind, requests, warmup),
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
        low = self.run(args.valgrind, args.low, args.warmup)
        high = self.run(args.valgrind, args.high, args.warmup)
        return float(high - low) / float(args.high - args.low)


# ---------------------------------------------------------------------------
# The children: the requests themselves (run under valgrind, or alone to try).


async def _receive(engine: str, requests: int, warmup: int, *, baseline: bool) -> None:
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
        for tag, n in (("warm", warmup), ("counted", requests)):
            batch = receive_cpu.deliveries(n, tag)
            for start in range(0, n, CONCURRENCY):
                statuses = await asyncio.gather(
                    *(receive_cpu.call(app, *d) for d in batch[start : start + CONCURRENCY])
                )
                if set(statuses) != {200}:
                    raise SystemExit(f"answers {sorted(set(statuses))}, expected only 200")
        if onceonly is not None:
            await onceonly.store.close()


async def _idempotency(
    target: str, engine: str, requests: int, warmup: int, *, baseline: bool
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
            warm: MakeRequest = functools.partial(cycle_request, "5761726d", 0)
            counted: MakeRequest = functools.partial(cycle_request, "436f756e", 0)
            if target == "replay" and not baseline:
                # 500 keys stored, then each asked for once more (the cache
                # fills); the warm-up and the count cycle over them.
                stored = counted

                def again(i: int) -> tuple[dict[str, str], bytes]:
                    return stored(i % 500)

                await idempotency_cpu._drive(app, 500, CONCURRENCY, again)
                await idempotency_cpu._drive(app, 500, CONCURRENCY, again)
                warm = counted = again
            await idempotency_cpu._drive(app, warmup, CONCURRENCY, warm)
            await idempotency_cpu._drive(app, requests, CONCURRENCY, counted)
        finally:
            await inbox.put({"type": "lifespan.shutdown"})
            await task


def child(what: str, engine: str, requests: int, warmup: int) -> None:
    """The requests of one count (``--child``): the target's, or its baseline's."""
    baseline = what.startswith(BASELINE)
    target = what.partition(":")[2] if baseline else what
    if target == "receive":
        asyncio.run(_receive(engine, requests, warmup, baseline=baseline))
    else:
        asyncio.run(_idempotency(target, engine, requests, warmup, baseline=baseline))


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
        what, engine, requests, warmup = argv[1:5]
        child(what, engine, int(requests), int(warmup))
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
