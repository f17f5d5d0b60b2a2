"""MercadoPago's API client, kept at its first import path (it lives in
:mod:`onceonly.providers.mercadopago.client`)."""

from __future__ import annotations

from ..providers.mercadopago.client import MercadoPagoClient

__all__ = ["MercadoPagoClient"]
