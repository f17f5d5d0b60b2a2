"""Hiding secrets before a payload reaches a browser.

Two rules:

- **Headers** whose name contains a word that marks a credential
  (``signature``, ``authorization``, ``token``, ``cookie``, ``secret``,
  ``hmac``, ``api-key``, ...) are always hidden: a webhook's signature header
  is a valid credential for that very body, and a forwarded ``Authorization``
  or ``Cookie`` is someone's session. Names are compared in lower case with
  ``_`` read as ``-`` (``X-Api_Key`` is ``x-api-key``).
- **Body fields** named by the operator (``ONCEONLY_DASHBOARD_REDACT=card.number,payer.email``)
  are hidden in JSON and form-encoded bodies. A dotted path walks objects key by
  key, in any case (``payer.email`` hides ``Payer.Email``), and also matches a
  key that itself holds dots (``{"payer.email": ...}``, as flattened exports
  write it); lists on the way are walked element by element, so
  ``items.card.number`` hides the card number of every item; ``*`` matches any
  key.

The dashboard and ``onceonly events show`` (every format) show payloads
through the same rules.

Other bodies (XML, plain text) cannot be redacted field by field and are shown
as they arrived; a binary body is shown as base64.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

__all__ = ["REDACTED", "Redactor", "ShownBody", "ShownHeader"]

REDACTED = "[redacted]"

#: A header whose lower-cased name contains one of these is never shown.
SENSITIVE_HEADER_WORDS = (
    "signature",
    "authorization",
    "token",
    "cookie",
    "secret",
    "hmac",
    "password",
    "api-key",
    "apikey",
    "session",
    "credential",
    "private-key",
)


@dataclass(frozen=True, slots=True)
class ShownHeader:
    name: str
    value: str
    redacted: bool


@dataclass(frozen=True, slots=True)
class ShownBody:
    """A body ready to display: `kind` is ``json``, ``form``, ``text``,
    ``binary`` or ``empty``; `redacted` counts the values hidden."""

    text: str
    kind: str
    redacted: int


def parse_fields(raw: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"card.number, payer.email"`` (or a list of paths) as clean paths."""
    if raw is None:
        return ()
    parts = raw.split(",") if isinstance(raw, str) else list(raw)
    return tuple(p.strip() for p in parts if p and p.strip())


class Redactor:
    """Hides credential headers and the configured body fields."""

    def __init__(self, fields: Iterable[str] = ()) -> None:
        self.fields = parse_fields(fields)
        self._paths = [tuple(f.lower().split(".")) for f in self.fields]

    @staticmethod
    def is_sensitive_header(name: str) -> bool:
        lowered = name.lower().replace("_", "-")
        return any(word in lowered for word in SENSITIVE_HEADER_WORDS)

    def header_values(self, headers: Mapping[str, str]) -> dict[str, str]:
        """`headers` with every credential's value replaced (for JSON output)."""
        return {h.name: h.value for h in self.headers(headers)}

    def headers(self, headers: Mapping[str, str]) -> list[ShownHeader]:
        shown = []
        for name, value in sorted(headers.items()):
            if self.is_sensitive_header(name):
                shown.append(ShownHeader(name, REDACTED, True))
            else:
                shown.append(ShownHeader(name, value, False))
        return shown

    def body(self, body: bytes | None, content_type: str | None = None) -> ShownBody:
        if not body:
            return ShownBody("", "empty", 0)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            return ShownBody(base64.b64encode(body).decode(), "binary", 0)
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        except RecursionError:
            # Nested deeper than Python parses (a hostile payload): shown as
            # text, unless fields are to be hidden, which cannot be found then.
            if self._paths:
                return ShownBody(
                    f"(JSON nested too deeply to redact; {len(body)} bytes hidden)", "text", 1
                )
            return ShownBody(text, "text", 0)
        else:
            hidden = [0]
            for path in self._paths:
                data = _redact(data, path, hidden)
            return ShownBody(json.dumps(data, indent=2, ensure_ascii=False), "json", hidden[0])
        if content_type and "x-www-form-urlencoded" in content_type.lower():
            return self._form(text)
        return ShownBody(text, "text", 0)

    def _form(self, text: str) -> ShownBody:
        names = {".".join(p) for p in self._paths}
        lines = []
        hidden = 0
        for key, value in parse_qsl(text, keep_blank_values=True):
            secret = key.lower() in names
            hidden += secret
            lines.append(f"{key}={REDACTED if secret else value}")
        return ShownBody("\n".join(lines), "form", hidden)


def _redact(node: Any, path: tuple[str, ...], hidden: list[int]) -> Any:
    """`node` with the value at `path` replaced, counting replacements in `hidden`."""
    if not path:
        hidden[0] += 1
        return REDACTED
    if isinstance(node, list):
        return [_redact(item, path, hidden) for item in node]
    if not isinstance(node, dict):
        return node
    return {key: _redact_key(key, value, path, hidden) for key, value in node.items()}


def _redact_key(key: Any, value: Any, path: tuple[str, ...], hidden: list[int]) -> Any:
    """`value` (found under `key`) with what `path` names from `key` on hidden."""
    name = str(key).lower()
    if path[0] in ("*", name):
        return _redact(value, path[1:], hidden)
    # A key holding dots stands for as many steps of the path.
    steps = name.split(".")
    if len(steps) > 1 and tuple(steps) == path[: len(steps)]:
        return _redact(value, path[len(steps) :], hidden)
    return value
