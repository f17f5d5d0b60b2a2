"""The Idempotency-Key header, client scopes and the request headers the middleware reads."""

from __future__ import annotations

from typing import Any

import pytest

from onceonly.idempotency import IdempotencyMiddleware, InvalidKey, by_header, parse_key
from onceonly.idempotency.keys import HeaderScope
from onceonly.store.sqlite import SQLiteStore


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ("8e03978e-40d5-43e8-bc93-6894a57f9324", "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ('"8e03978e-40d5-43e8-bc93-6894a57f9324"', "8e03978e-40d5-43e8-bc93-6894a57f9324"),
        ("  order 17\t", "order 17"),  # inner spaces are printable ASCII
        ('"a \\"quoted\\" \\\\ key"', 'a "quoted" \\ key'),
        ("x" * 255, "x" * 255),
    ],
)
def test_bare_tokens_and_sf_strings_name_the_same_keys(raw: str, key: str) -> None:
    assert parse_key(raw) == key


@pytest.mark.parametrize(
    "raw",
    [
        "",
        '""',
        "x" * 256,
        "clé",  # not ASCII
        "tab\tinside",
        'bare"quote',
        "back\\slash",
        '"unterminated',
        '"done" trailing',
        '"bad \\x escape"',
    ],
)
def test_malformed_keys_are_refused(raw: str) -> None:
    with pytest.raises(InvalidKey):
        parse_key(raw)


def test_scope_is_a_stable_hash_of_the_credential_never_the_credential() -> None:
    scope = by_header("Authorization")
    a = scope({"authorization": "Bearer sk_a"})
    assert a == scope({"authorization": "Bearer sk_a"})  # remembered, same answer
    assert a != scope({"authorization": "Bearer sk_b"})
    assert a is not None
    assert "sk_a" not in a
    assert scope({}) is None  # no credential, no client: never a shared scope
    assert by_header("authorization")({"authorization": "Bearer sk_a"}) == a


def test_remembered_scopes_stay_bounded() -> None:
    scope = HeaderScope("x-api-key")
    first = scope({"x-api-key": "key-0"})
    for i in range(HeaderScope.MEMO_SIZE + 10):
        scope({"x-api-key": f"key-{i}"})
    assert len(scope._memo) <= HeaderScope.MEMO_SIZE
    assert scope({"x-api-key": "key-0"}) == first


async def _app(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - never run
    raise AssertionError


def _middleware(**options: Any) -> IdempotencyMiddleware:
    # Constructing a store opens nothing: no file is created here.
    return IdempotencyMiddleware(_app, store=SQLiteStore("/nonexistent/onceonly.db"), **options)


def test_only_the_headers_that_matter_are_read_and_repeats_are_joined() -> None:
    mw = _middleware(fingerprint_headers=("Content-Type", "X-Tenant"))
    headers = mw._pick_headers(
        {
            "headers": [
                (b"idempotency-key", b"k-1"),
                (b"Authorization", b"Bearer sk_a"),  # a server that did not lower-case
                (b"x-tenant", b"t1"),
                (b"x-tenant", b"t2"),
                (b"user-agent", b"ignored"),
                (b"content-length", b"12"),
            ]
        }
    )
    assert headers == {
        "idempotency-key": "k-1",
        "authorization": "Bearer sk_a",
        "x-tenant": "t1, t2",
        "content-length": "12",
    }


def test_a_custom_scope_gets_every_header() -> None:
    mw = _middleware(scope=lambda headers: headers.get("x-tenant", "none"))
    assert mw._wanted is None  # it may read any header: none is filtered out
