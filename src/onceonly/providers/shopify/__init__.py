"""The Shopify provider: ``verifier.py`` checks its deliveries
and ``profile.py`` plays it in ``onceonly dev`` (see :mod:`onceonly.providers`)."""

from __future__ import annotations

from .verifier import Shopify

__all__ = ["Shopify"]
