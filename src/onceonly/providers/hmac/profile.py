"""The generic HMAC sender as ``onceonly dev`` plays it: a modest schedule and the
generic payment event (no provider, so no fake API)."""

from __future__ import annotations

from ..profile import DeliverySchedule, DevProfile

__all__ = ["PROFILE", "HMACProfile"]


class HMACProfile(DevProfile):
    name = "hmac"
    schedule = DeliverySchedule(
        "hmac",
        (5.0, 60.0, 5 * 60.0, 30 * 60.0),
        timeout=10.0,
        source="Generic HMAC sender: no provider behind it; a modest schedule.",
    )
    event_type = "payment.succeeded"


PROFILE = HMACProfile()
