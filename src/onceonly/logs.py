"""Structured log fields: every line about an event says which one, by field.

Log lines about an event (received, claimed, attempt failed, dead, processed,
lease lost, effect called or reused) carry, in ``extra=``, the fields of
:func:`event_fields`: ``event_pk``, ``provider``, ``event_id``,
``event_type``, ``tenant`` (``""`` for a deployment with one account),
``attempt`` and, in the worker, ``worker``. The human message
says the same in words; the fields are for machines: ``onceonly serve
--log-format json`` (or ``ONCEONLY_LOG_FORMAT=json``) writes each record as
one JSON object per line with :class:`JsonFormatter`, the fields at the top
level. A field added later appears there without a change to the
formatter: it writes every attribute a record was given beyond the standard
ones.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .events import Event

__all__ = ["JsonFormatter", "event_fields"]


def event_fields(event: Event, **more: Any) -> dict[str, Any]:
    """The ``extra=`` of a log line about `event` (its attempt number
    included), with `more` (``worker=``, ``handler=``, ...)."""
    fields: dict[str, Any] = {
        "event_pk": event.id,
        "provider": event.provider,
        "event_id": event.event_id,
        "event_type": event.event_type,
        "attempt": event.attempts,
        "tenant": event.tenant,
    }
    fields.update(more)
    return fields


# What every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
    # uvicorn's copy of the message with terminal colours: noise in JSON.
    "color_message",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``,
    ``logger``, ``message``, the ``extra=`` fields, and ``exception`` (the
    formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                data[name] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        # default=str: a field that is not JSON (a datetime, a path) is still written.
        return json.dumps(data, default=str, ensure_ascii=False)
