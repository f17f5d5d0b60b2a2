"""GitHub as ``onceonly dev`` plays it: no automatic retries, push events (no fake API)."""

from __future__ import annotations

import hashlib
import random

from ..profile import DeliverySchedule, DevProfile, Outgoing, PaymentFacts, encode, hex_id

__all__ = ["PROFILE", "GitHubProfile"]


class GitHubProfile(DevProfile):
    name = "github"
    schedule = DeliverySchedule(
        "github",
        (),
        timeout=10.0,
        source="GitHub: no automatic retries (redeliver by hand); 10 s timeout.",
    )
    event_type = "push"

    def build_event(
        self, kind: str, event_id: str | None, facts: PaymentFacts, token: str, r: random.Random
    ) -> Outgoing:
        eid = event_id or hex_id(r)
        # The receiver's event id is the hash of the signed body: each push names
        # its own head commit, as GitHub's do.
        after = hashlib.sha1(eid.encode()).hexdigest()
        body = {
            "action": "created",
            "ref": "refs/heads/main",
            "after": after,
            "repository": {"full_name": "x/y"},
        }
        return Outgoing(eid, encode(body), headers={"x-github-event": kind}, delivery_id=eid)


PROFILE = GitHubProfile()
