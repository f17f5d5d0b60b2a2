"""Which request headers are kept with an event, and how many are accepted.

A delivery's headers are written by whoever sent it. What is stored with the
event is an allow-list, decided per delivery:

- the headers its provider read to verify and identify it (signature,
  timestamp, delivery id, topic: whatever the provider's code looked at),
  tracked by :class:`ReadHeaders`, so each provider's needs are stated once, in
  its own code;
- a few that help whoever debugs a delivery later (:data:`DEBUG_HEADERS`);
- never a credential (:func:`is_credential`): a forwarded ``Authorization`` or
  ``Cookie`` is someone's session, and Asaas's ``asaas-access-token`` is the
  shared secret itself.

Everything else (proxies' additions, whatever an attacker adds) is dropped
before the event reaches the database.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import lru_cache

__all__ = ["DEBUG_HEADERS", "ReadHeaders", "is_credential"]

#: Kept for debugging whether or not the provider read them.
DEBUG_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "user-agent",
        "date",
        "x-request-id",
        "x-forwarded-for",
        "forwarded",
        "traceparent",
        # Senders' delivery ids and topics: unsigned, so never an identity,
        # but what their support and logs name a delivery by.
        "x-github-delivery",
        "x-github-event",
        "x-github-hook-id",
        "x-shopify-webhook-id",
        "x-shopify-event-id",
        "x-shopify-topic",
        "x-shopify-shop-domain",
        "x-shopify-triggered-at",
    }
)

#: A header whose name (lower case, ``_`` read as ``-``) contains one of these
#: carries a credential and is never stored, even when a provider read it.
_CREDENTIAL_WORDS = (
    "authorization",
    "cookie",
    "password",
    "secret",
    "api-key",
    "apikey",
    "access-token",
    "session",
    "credential",
)


# One regular expression rather than a loop over the words: this runs for
# every kept header of every delivery.
_CREDENTIAL = re.compile("|".join(re.escape(word) for word in _CREDENTIAL_WORDS))


# Bounded: header names are the sender's to choose, so a cache without a
# limit would be theirs to fill. The names of real deliveries are a few dozen.
@lru_cache(maxsize=1024)
def is_credential(name: str) -> bool:
    return _CREDENTIAL.search(name.lower().replace("_", "-")) is not None


class ReadHeaders(Mapping[str, str]):
    """Headers that remember which of them were looked at (by ``[]``,
    ``get``, ``in`` or iteration)."""

    __slots__ = ("_headers", "read")

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = headers
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> str:
        value = self._headers[name]
        self.read.add(name)
        return value

    def __contains__(self, name: object) -> bool:
        found = name in self._headers
        if found and isinstance(name, str):
            self.read.add(name)
        return found

    def __iter__(self) -> Iterator[str]:
        # Whoever walks them all may need any of them.
        self.read.update(self._headers)
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)

    def kept(self, extra: Mapping[str, str]) -> dict[str, str]:
        """What is stored with the event: what was read, the debugging set
        and the provider's own ``onceonly-*`` notes, less every credential."""
        kept = {
            name: value
            for name, value in self._headers.items()
            if (name in self.read or name in DEBUG_HEADERS) and not is_credential(name)
        }
        kept.update(extra)
        return kept
