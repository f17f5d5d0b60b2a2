"""PagBank's API client, kept at its first import path (it lives in
:mod:`onceonly.providers.pagbank.client`)."""

from __future__ import annotations

from ..providers.pagbank.client import PagBankClient, parse_transaction_xml

__all__ = ["PagBankClient", "parse_transaction_xml"]
