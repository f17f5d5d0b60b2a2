"""Standard Webhooks (Svix) as ``onceonly dev`` plays it: its retries, the 410 that
disables an endpoint, and the generic payment event (no fake API)."""

from __future__ import annotations

from ..profile import HOUR, DeliverySchedule, DevProfile

__all__ = ["PROFILE", "StandardWebhooksProfile"]


class StandardWebhooksProfile(DevProfile):
    name = "standardwebhooks"
    schedule = DeliverySchedule(
        "standardwebhooks",
        (5.0, 5 * 60.0, 30 * 60.0, 2 * HOUR, 5 * HOUR, 10 * HOUR, 10 * HOUR),
        timeout=15.0,
        disable_on=frozenset({410}),
        source="Standard Webhooks / Svix: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h; 410 "
        "disables the endpoint. The 15 s timeout is an assumption.",
    )
    event_type = "payment.succeeded"


PROFILE = StandardWebhooksProfile()
