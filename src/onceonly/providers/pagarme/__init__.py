"""The Pagar.me provider: ``verifier.py`` checks its deliveries, ``client.py`` reads its API
and ``profile.py`` plays it in ``onceonly dev`` (see :mod:`onceonly.providers`)."""

from __future__ import annotations

from .verifier import Pagarme

__all__ = ["Pagarme"]
