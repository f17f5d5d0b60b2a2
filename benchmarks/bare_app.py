"""The baseline for benchmarks/receive.py: a bare Starlette endpoint under uvicorn.

It does what any webhook endpoint must do and nothing onceonly adds: route
``POST /webhooks/{provider}``, read the whole body, answer 200 with a small JSON
document. No signature check, no parsing, no database.

uvicorn runs it with the settings ``onceonly serve`` uses: one process, the
default ``loop="auto"``/``http="auto"`` (uvloop and httptools when installed),
access log off, lifespan on.

    python benchmarks/bare_app.py --host 127.0.0.1 --port 8001
"""

from __future__ import annotations

import argparse

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


async def receive(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"received": True, "duplicate": False, "bytes": len(body)})


app = Starlette(routes=[Route("/webhooks/{provider}", receive, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args()

    import uvicorn

    # The same keyword arguments as onceonly.cli.serve passes to uvicorn.run.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
