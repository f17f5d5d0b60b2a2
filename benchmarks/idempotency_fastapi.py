"""The FastAPI version of idempotency_app.py's endpoint, for ``--app fastapi``.

Issue 19 quoted fresh keys against "a bare FastAPI endpoint", and FastAPI is
how the README and docs/idempotency.md show the middleware. This is the same
`POST /orders` written the way a FastAPI user writes it: the body read into
a pydantic model, the answer returned as one, the 201 set on the route. Same
request, same answer's fields, so the wrk script and the checks do not change.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel


class Item(BaseModel):
    sku: str
    quantity: int = 1


class Shipping(BaseModel):
    method: str
    country: str


class NewOrder(BaseModel):
    customer: str | None = None
    currency: str = "usd"
    items: list[Item] = []
    shipping: Shipping | None = None


class Order(BaseModel):
    id: str
    object: str = "order"
    status: str
    customer: str | None
    items: int
    amount: int
    currency: str
    created: int


async def create_order(order: NewOrder) -> Order:
    return Order(
        id=f"ord_{uuid.uuid4().hex}",
        status="created",
        customer=order.customer,
        items=len(order.items),
        amount=sum(i.quantity * 1250 for i in order.items),
        currency=order.currency,
        created=int(time.time()),
    )


async def healthz() -> PlainTextResponse:
    return PlainTextResponse("ok")


def create_app(
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    app = FastAPI(lifespan=lifespan)
    app.post("/orders", status_code=201)(create_order)
    app.get("/healthz")(healthz)
    return app
