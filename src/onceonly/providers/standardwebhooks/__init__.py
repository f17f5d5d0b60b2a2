"""The StandardWebhooks provider: ``verifier.py`` checks its deliveries
and ``profile.py`` plays it in ``onceonly dev`` (see :mod:`onceonly.providers`)."""

from __future__ import annotations

from .verifier import StandardWebhooks

__all__ = ["StandardWebhooks"]
