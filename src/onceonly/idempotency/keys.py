"""The Idempotency-Key header, request fingerprints and client scopes."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Mapping, Sequence

from .._exceptions import InvalidKey

__all__ = [
    "ClientScope",
    "HeaderScope",
    "InvalidKey",
    "by_header",
    "fingerprint",
    "parse_key",
    "public_scope",
]

MAX_KEY_LENGTH = 255
_LENGTH = struct.Struct(">Q").pack  # a part's length, before it


def parse_key(raw: str) -> str:
    """The key from an ``Idempotency-Key`` header value.

    The draft makes it a Structured Field sf-string (``"8e03978e-..."``, with
    ``\\"`` and ``\\\\`` escapes); many clients send a bare token (Stripe style).
    Both are accepted. Keys are 1 to 255 printable ASCII characters.
    """
    value = raw.strip(" \t")
    # The common case, a bare token such as a UUID, in two C-level checks.
    if (
        value
        and len(value) <= MAX_KEY_LENGTH
        and value.isascii()
        and value.isprintable()
        and '"' not in value
        and "\\" not in value
    ):
        return value
    if value.startswith('"'):
        value = _sf_string(value)
    elif '"' in value or "\\" in value:
        raise InvalidKey("a bare key must not contain quotes or backslashes")
    if not value:
        raise InvalidKey("the key is empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidKey(f"the key is longer than {MAX_KEY_LENGTH} characters")
    if any(not 0x20 <= ord(ch) <= 0x7E for ch in value):
        raise InvalidKey("the key must be printable ASCII")
    return value


def _sf_string(value: str) -> str:
    out: list[str] = []
    i = 1
    while i < len(value):
        ch = value[i]
        if ch == "\\":
            if i + 1 >= len(value) or value[i + 1] not in '"\\':
                raise InvalidKey("invalid escape in the quoted key")
            out.append(value[i + 1])
            i += 2
            continue
        if ch == '"':
            if value[i + 1 :].strip(" \t"):
                raise InvalidKey("unexpected text after the quoted key")
            return "".join(out)
        out.append(ch)
        i += 1
    raise InvalidKey("the quoted key has no closing quote")


def fingerprint(
    method: str, path: str, query: bytes, body: bytes, headers: Sequence[tuple[str, str]]
) -> str:
    """SHA-256 over what makes two requests "the same request".

    The digest is stored with each key and compared on every retry, so its
    input never changes between releases (a retry that spans an upgrade would
    get 422): method, path and query each after its length in 8 bytes, then
    one ``name:value`` line per header, then the body."""
    m, p = method.encode(), path.encode()
    lines = "".join([f"{name}:{value}\n" for name, value in headers]).encode("latin-1")
    # What precedes the body in one buffer and one call: a fresh request
    # pays this on the hot path (benchmarks/instructions.py).
    digest = hashlib.sha256(
        b"".join((_LENGTH(len(m)), m, _LENGTH(len(p)), p, _LENGTH(len(query)), query, lines))
    )
    digest.update(body)
    return digest.hexdigest()


#: Maps a request's headers (lower-case names) to the identity keys are
#: scoped to. Two clients sending the same key never see each other's response.
#: ``None`` means the request names no client: a request with a key and no
#: client is refused (400), never put in a scope shared with other clients.
ClientScope = Callable[[Mapping[str, str]], str | None]


class HeaderScope:
    """The scope of :func:`by_header`: a hash of one header's value.

    `header` tells the middleware that this header is all the scope reads, so
    it need not collect the others. A client sends the same credential on
    every request: recent hashes are remembered (a bounded number)."""

    __slots__ = ("_memo", "header")

    MEMO_SIZE = 4096

    def __init__(self, header: str) -> None:
        self.header = header.lower()
        self._memo: dict[str, str] = {}

    def __call__(self, headers: Mapping[str, str]) -> str | None:
        value = headers.get(self.header)
        if not value:
            # No credential, no client: with cookie sessions, "everyone
            # without Authorization" was one scope, and one user's stored
            # response (their card's last digits) was replayed to another.
            return None
        scope = self._memo.get(value)
        if scope is None:
            digest = hashlib.sha256(f"{self.header}:{value}".encode("latin-1"))
            scope = digest.hexdigest()[:32]
            if len(self._memo) >= self.MEMO_SIZE:
                self._memo.clear()  # many distinct credentials: start over, stay bounded
            self._memo[value] = scope
        return scope


def by_header(name: str = "authorization") -> ClientScope:
    """Scope keys by a credential header (default ``Authorization``), hashed so
    the credential itself is never stored. A request with an Idempotency-Key
    but without the header is refused with 400."""
    return HeaderScope(name)


def public_scope(headers: Mapping[str, str]) -> str:
    """One scope for every request: for an endpoint without client identity
    (a guest checkout) whose keys are unguessable, and only where a response
    replayed to whoever sends the same key gives away nothing. Declaring it is
    a decision; it is never a default."""
    return "public"
