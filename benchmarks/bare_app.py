"""The baselines for benchmarks/receive.py: bare Starlette endpoints under uvicorn.

Two apps, picked with ``--app``:

``bare``
    What any webhook endpoint must do and nothing onceonly adds: route
    ``POST /webhooks/{provider}``, read the whole body, answer 200 with a small
    JSON document. No signature check, no parsing, no database.
``lean``
    The leanest Starlette endpoint there is: one fixed route,
    ``POST /webhooks/stripe``, that awaits the body and answers an empty 200
    (no JSON, no path parameter). The reference the receive goal is stated
    against: all that is left is uvicorn, HTTP and Starlette's routing.

uvicorn runs either with the settings ``onceonly serve`` uses: the default
``loop="auto"``/``http="auto"`` (uvloop and httptools when installed), access
log off, lifespan on; one process, or ``--workers N`` uvicorn worker processes
(as ``onceonly serve --workers N``), for comparisons at the same process count.

    python benchmarks/bare_app.py --host 127.0.0.1 --port 8001 [--app lean] [--workers 2]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


async def receive(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"received": True, "duplicate": False, "bytes": len(body)})


async def receive_lean(request: Request) -> Response:
    await request.body()
    return Response(status_code=200)


app = Starlette(routes=[Route("/webhooks/{provider}", receive, methods=["POST"])])
lean = Starlette(routes=[Route("/webhooks/stripe", receive_lean, methods=["POST"])])
APPS = {"bare": app, "lean": lean}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--app", choices=sorted(APPS), default="bare")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    args = parser.parse_args()
    if args.workers < 1:
        parser.error("--workers must be >= 1")

    import uvicorn

    # One process runs the app object, as onceonly serve does. uvicorn's worker
    # processes import the app themselves: they need its import string.
    target: Starlette | str = APPS[args.app]
    workers: dict[str, Any] = {}
    if args.workers > 1:
        target = f"bare_app:{'app' if args.app == 'bare' else 'lean'}"
        workers = {"workers": args.workers, "app_dir": str(Path(__file__).resolve().parent)}
    # The same keyword arguments as onceonly.cli.serve passes to uvicorn.run.
    uvicorn.run(
        target,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
        **workers,
    )


if __name__ == "__main__":
    main()
