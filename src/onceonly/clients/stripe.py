"""Stripe's API client, kept at its first import path (it lives in
:mod:`onceonly.providers.stripe.client`)."""

from __future__ import annotations

from ..providers.stripe.client import StripeClient

__all__ = ["StripeClient"]
