"""The Idempotency-Key header, client scopes and the request headers the middleware reads."""

from __future__ import annotations

from typing import Any

import pytest

from onceonly.idempotency import (
    IdempotencyMiddleware,
    InvalidKey,
    by_header,
    fingerprint,
    parse_key,
)
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


# A fingerprint is stored with its key and compared on every retry: a release
# that computed it differently would answer 422 to the retries of requests
# made before the upgrade. These digests were taken from the release that
# first stored them.
@pytest.mark.parametrize(
    ("request_parts", "digest"),
    [
        (
            (
                "POST",
                "/orders",
                b"a=1",
                b'{"x":1}',
                [("content-type", "application/json"), ("x-tenant", "t\xe9")],
            ),
            "95588503d3229c4127ffd9151cc71c26c6dff86bd0ed44839857f3fa70318df3",
        ),
        (
            ("PATCH", "/caf\u00e9", b"", b"", []),
            "1a7301bb575c796b2757523e349b1bf4ca3744632cb5a3924c7aeaade62610c4",
        ),
        (
            ("POST", "/o", b"", b"\x00" * 70000, [("content-type", "")]),
            "6ac2bcc08dd49ada66b2bc0087afdc0c57bacc71a29d4cfc14e8c096a1ff6a9b",
        ),
    ],
    ids=["json-with-headers", "no-body-non-ascii-path", "large-body"],
)
def test_a_requests_fingerprint_does_not_change_between_releases(
    request_parts: tuple[str, str, bytes, bytes, list[tuple[str, str]]], digest: str
) -> None:
    method, path, query, body, headers = request_parts
    assert fingerprint(method, path, query, body, headers) == digest
    # The middleware's own way to it (the header lines joined as it reads
    # them) gives the same digest.
    mw = _middleware(fingerprint_headers=[name for name, _ in headers])
    assert mw.policy.fingerprint(method, path, query, body, dict(headers)) == digest


def test_the_fingerprint_tells_apart_what_makes_requests_different() -> None:
    base = ("POST", "/orders", b"", b"{}", [("content-type", "application/json")])
    changed = [
        ("PUT", *base[1:]),
        (base[0], "/orders/", *base[2:]),
        (*base[:2], b"x=1", *base[3:]),
        (*base[:3], b"{ }", base[4]),
        (*base[:4], [("content-type", "text/plain")]),
        # The parts' lengths are hashed too: moving a byte from the path to the
        # query is another request.
        ("POST", "/order", b"s", b"{}", base[4]),
    ]
    digests = {fingerprint(*parts) for parts in [base, *changed]}
    assert len(digests) == len(changed) + 1


def test_header_names_without_letters_and_upper_case_ones_are_read_alike() -> None:
    mw = _middleware(fingerprint_headers=("X-1",))
    headers = mw._pick_headers(
        {"headers": [(b"x-1", b"a"), (b"X-1", b"b"), (b"1-2", b"c"), (b"IDEMPOTENCY-KEY", b"k")]}
    )
    assert headers == {"x-1": "a, b", "idempotency-key": "k"}
