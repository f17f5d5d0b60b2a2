"""Asaas's API client, kept at its first import path (it lives in
:mod:`onceonly.providers.asaas.client`)."""

from __future__ import annotations

from ..providers.asaas.client import AsaasClient

__all__ = ["AsaasClient"]
