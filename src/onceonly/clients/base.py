"""The API clients' base, kept at its first import path.

It lives in :mod:`onceonly.providers.client`, beside the provider folders whose
clients build on it; importing it from here keeps working (and installs the
same logging filter).
"""

from __future__ import annotations

from ..providers.client import (
    EXCERPT_CHARS,
    ApiClient,
    ApiRetryPolicy,
    RetryPolicy,
    Target,
    body_json,
    check_base_url,
    parse_retry_after,
    path_id,
    safe_id,
)

__all__ = [
    "EXCERPT_CHARS",
    "ApiClient",
    "ApiRetryPolicy",
    "RetryPolicy",
    "Target",
    "body_json",
    "check_base_url",
    "parse_retry_after",
    "path_id",
    "safe_id",
]
