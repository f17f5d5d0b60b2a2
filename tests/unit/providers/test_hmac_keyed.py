"""The keyed HMAC prototypes: each message signed as a fresh ``hmac.new`` would."""

from __future__ import annotations

import hashlib
import hmac
import threading

from onceonly.providers.base import hmac_sha256


def test_each_key_and_message_gets_its_own_signature() -> None:
    keys = [b"whsec_one", b"whsec_two", b"", b"k" * 200]  # long keys are hashed first
    messages = [(b"1700000000", b".", b"{}"), (b"",), (b"a" * 5000, b"b")]
    for _ in range(2):  # the second round is served by the prototypes
        for key in keys:
            for parts in messages:
                expected = hmac.new(key, b"".join(parts), hashlib.sha256).digest()
                assert hmac_sha256(key, *parts) == expected


def test_a_message_does_not_leak_into_the_next_one() -> None:
    key = b"whsec_shared"
    first = hmac_sha256(key, b"first message")
    assert hmac_sha256(key, b"second") == hmac.new(key, b"second", hashlib.sha256).digest()
    assert hmac_sha256(key, b"first message") == first


def test_threads_signing_at_once_get_the_same_answers() -> None:
    key = b"whsec_threads"
    expected = {i: hmac.new(key, str(i).encode(), hashlib.sha256).digest() for i in range(200)}
    wrong: list[int] = []

    def sign() -> None:
        for i in range(200):
            if hmac_sha256(key, str(i).encode()) != expected[i]:
                wrong.append(i)

    threads = [threading.Thread(target=sign) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
