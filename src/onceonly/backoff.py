"""The one backoff formula: the worker's retries of a failed handler and the API
clients' retries of a failed request both wait this long.

A leaf module (the standard library only), so that both can import it without
importing each other.
"""

from __future__ import annotations

import random

__all__ = ["backoff"]


def backoff(attempt: int, *, base: float, cap: float) -> float:
    """Seconds before retry number `attempt` (1-based): exponential, capped, with
    jitter between half and all of it so that a burst of failures spreads out."""
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return float(delay * random.uniform(0.5, 1.0))
