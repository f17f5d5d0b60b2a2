"""The records that flow through the inbox: deliveries in, events stored."""

from __future__ import annotations

import base64
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["Delivery", "Event", "EventInfo", "EventStatus", "NewEvent", "Receipt"]


class EventStatus(enum.StrEnum):
    """Where an event is in its life. The event row is the job."""

    PENDING = "pending"
    PROCESSING = "processing"
    PROCESSED = "processed"
    FAILED = "failed"
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class Delivery:
    """One HTTP delivery as a provider sees it: raw bytes, never re-serialised.

    Header names are lower-case; when a header is repeated, the values are
    joined with ", " as HTTP allows.
    """

    provider: str
    body: bytes
    headers: Mapping[str, str]
    query: Mapping[str, str] = field(default_factory=dict)
    #: The merchant account named in the URL (``/webhooks/{provider}/{tenant}``),
    #: ``""`` when the route has none.
    tenant: str = ""


@dataclass(frozen=True, slots=True)
class EventInfo:
    """What a provider extracts from a verified delivery.

    `extra_headers` are stored with the delivery's own headers (names start
    with ``onceonly-``): what the provider learned that the event row would
    otherwise lose, such as the signed query string or that the delivery was
    accepted unverified.
    """

    event_id: str
    event_type: str | None = None
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    #: The provider's object the event is about (a payment's id), when the
    #: payload names one: searchable across events, and a default ordering key.
    object_id: str | None = None
    #: When the provider created the event (not when it was delivered): the
    #: order of an object's events.
    occurred_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event about to be inserted."""

    provider: str
    event_id: str
    event_type: str | None
    body: bytes
    headers: Mapping[str, str]
    #: The merchant account it arrived for (``/webhooks/{provider}/{tenant}``);
    #: ``""`` for a deployment with one account. Part of the dedup key.
    tenant: str = ""
    object_id: str | None = None
    occurred_at: datetime | None = None
    #: Events with the same key are processed one at a time, in `occurred_at`
    #: order (``None``: unordered).
    ordering_key: str | None = None


@dataclass(frozen=True, slots=True)
class Receipt:
    """The database's verdict on one inserted event.

    `id` is the row id: of the new row, or for a duplicate of the row already
    there (the same statement that counted the duplicate returned it).
    """

    duplicate: bool
    id: int | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """A stored event."""

    id: int
    provider: str
    event_id: str
    event_type: str | None
    body: bytes
    headers: Mapping[str, str]
    received_at: datetime
    status: EventStatus
    attempts: int
    #: The last failure, "Type: message", while failed or dead.
    last_error: str | None = None
    #: Deliveries of this event after the first one, and when the last came.
    duplicates: int = 0
    last_duplicate_at: datetime | None = None
    #: When ``onceonly purge`` dropped body and headers (they are empty since).
    payload_purged_at: datetime | None = None
    #: The merchant account (``""``: the deployment's only one).
    tenant: str = ""
    #: The provider's object the event is about (a payment's id), if known.
    object_id: str | None = None
    #: When the provider created the event, if the payload says.
    occurred_at: datetime | None = None
    ordering_key: str | None = None

    def to_dict(self, *, include_body: bool = True) -> dict[str, Any]:
        """A JSON-ready view; the body is decoded as UTF-8 where it can be."""
        data: dict[str, Any] = {
            "id": self.id,
            "provider": self.provider,
            "event_id": self.event_id,
            "event_type": self.event_type,
            "status": self.status.value,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "received_at": self.received_at.isoformat(),
            "duplicates": self.duplicates,
            "last_duplicate_at": _iso(self.last_duplicate_at),
            "payload_purged_at": _iso(self.payload_purged_at),
            "tenant": self.tenant,
            "object_id": self.object_id,
            "occurred_at": _iso(self.occurred_at),
            "ordering_key": self.ordering_key,
            "headers": dict(self.headers),
        }
        if include_body:
            try:
                data["body"] = self.body.decode("utf-8")
            except UnicodeDecodeError:
                data["body_base64"] = base64.b64encode(self.body).decode()
        return data


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None
