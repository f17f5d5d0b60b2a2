"""The delivery engine of the fake gateway: signed deliveries, sent the way senders send.

A :class:`Sender` posts each :class:`Outgoing` event to a receiver URL, signed by
the provider's own :meth:`~onceonly.providers.Provider.sign` (a fresh signature
per attempt, as senders that sign a timestamp do), and follows the provider's
:class:`~onceonly.dev.schedules.DeliverySchedule`: a timeout, a connection error or
an answer the provider does not count as success means another attempt after
the next delay of its schedule. Delays and timeouts are divided by `speedup`,
so three days of Stripe retries fit in a test.

On top of the provider's own behaviour, :class:`Faults` injects what the
network and the sender do on a bad day, each with a probability per attempt:

- ``duplicates``: the attempt goes out as several identical requests at once
  (a sender's retry racing its first try);
- ``timeouts``: the sender stops waiting after a few milliseconds, whether or
  not the receiver committed (so the retry may be a duplicate, or not);
- ``lost_acks``: the receiver's 2xx is lost on the way back (a proxy answering
  502 after the commit, a reset connection), so a delivered event is sent again;
- ``spread``: first attempts start at random times within that many seconds,
  so events arrive out of order (retries shuffle them further);
- ``lost``: the event is lost for good, per event: no attempt is ever sent
  (a sender that gave up, an Asaas event dropped after 14 days). Only
  ``onceonly reconcile`` finds it.

With a seed, every random decision is a function of the seed, the event and
the attempt number: the same seed injects the same faults into the same
attempts (the timing of a real network still varies).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import httpx

from ..providers import Provider
from ..providers.profile import DeliverySchedule, Outgoing
from .schedules import Verdict, decide, policy_for

__all__ = [
    "Answer",
    "DeliveryReport",
    "DeliveryStats",
    "EventOutcome",
    "Faults",
    "Outgoing",
    "Sender",
]

#: An injected timeout stops waiting after this many seconds, at random.
INJECTED_TIMEOUT = (0.002, 0.03)


@dataclass(frozen=True, slots=True)
class Faults:
    """Faults injected on top of the provider's own behaviour (probabilities per attempt)."""

    duplicates: float = 0.0
    copies: int = 2
    timeouts: float = 0.0
    lost_acks: float = 0.0
    spread: float = 0.0
    lost: float = 0.0

    def __post_init__(self) -> None:
        for name in ("duplicates", "timeouts", "lost_acks", "lost"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a probability, between 0 and 1; got {value}")
        if self.copies < 2:
            raise ValueError("copies must be at least 2")
        if self.spread < 0:
            raise ValueError("spread must be >= 0")


@dataclass(frozen=True, slots=True)
class Answer:
    """What one request got: a status, or ``None`` with the error (timeout, connection)."""

    status: int | None
    duplicate: bool = False
    error: str | None = None
    text: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return str(self.status) if self.status is not None else (self.error or "error")


@dataclass
class DeliveryStats:
    """Running counts, updated after every attempt (for progress displays)."""

    events: int = 0
    requests: int = 0
    attempts: int = 0
    retries: int = 0
    acknowledged: int = 0
    duplicates_answered: int = 0
    timeouts: int = 0
    connection_errors: int = 0
    concurrent_copies: int = 0
    injected_timeouts: int = 0
    lost_acks: int = 0
    given_up: int = 0
    #: Events lost for good (``Faults.lost``): never sent.
    lost: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    paused: bool = False
    disabled: bool = False

    @property
    def finished(self) -> int:
        return self.acknowledged + self.given_up + self.lost

    def to_dict(self) -> dict[str, object]:
        return {
            "events": self.events,
            "requests": self.requests,
            "attempts": self.attempts,
            "retries": self.retries,
            "acknowledged": self.acknowledged,
            "duplicates_answered": self.duplicates_answered,
            "timeouts": self.timeouts,
            "connection_errors": self.connection_errors,
            "concurrent_copies": self.concurrent_copies,
            "injected_timeouts": self.injected_timeouts,
            "lost_acks": self.lost_acks,
            "given_up": self.given_up,
            "lost": self.lost,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "paused": self.paused,
            "disabled": self.disabled,
        }


@dataclass
class EventOutcome:
    """One event's delivery history: an entry per attempt (a status or an error)."""

    event_id: str
    answers: list[str] = field(default_factory=list)
    acknowledged: bool = False
    #: Lost for good (``Faults.lost``): no attempt was sent.
    lost: bool = False

    @property
    def attempts(self) -> int:
        return len(self.answers)


@dataclass
class DeliveryReport:
    """The end of :meth:`Sender.deliver`: the counts, each event's history, the time taken."""

    stats: DeliveryStats
    outcomes: dict[str, EventOutcome]
    elapsed: float

    @property
    def undelivered(self) -> list[str]:
        return [o.event_id for o in self.outcomes.values() if not o.acknowledged]


class Sender:
    """Delivers events to `url` as `provider`'s gateway would.

    `policy` defaults to the provider's (:func:`~onceonly.dev.schedules.policy_for`).
    `timeout` overrides the policy's timeout divided by `speedup`, which is
    otherwise never below `min_timeout` (a loaded test machine is not a slow
    receiver). `concurrency` caps the requests in flight. `on_attempt` is
    called after every attempt with the running :class:`DeliveryStats`.
    """

    def __init__(
        self,
        provider: Provider,
        url: str,
        *,
        policy: DeliverySchedule | None = None,
        speedup: float = 1.0,
        timeout: float | None = None,
        min_timeout: float = 1.0,
        faults: Faults | None = None,
        concurrency: int = 16,
        seed: int | None = None,
        on_attempt: Callable[[DeliveryStats], None] | None = None,
    ) -> None:
        if speedup <= 0:
            raise ValueError("speedup must be positive")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.provider = provider
        self.url = url
        self.policy = policy or policy_for(provider.name)
        self.speedup = speedup
        self.timeout = (
            timeout if timeout is not None else max(min_timeout, self.policy.timeout / speedup)
        )
        self.faults = faults or Faults()
        self.concurrency = concurrency
        self.seed = seed
        self.random = random.Random(seed)
        self.on_attempt = on_attempt
        self.stats = DeliveryStats()
        self._consecutive_failures = 0
        self._stopped = False
        self._slots = asyncio.Semaphore(concurrency)

    def client(self) -> httpx.AsyncClient:
        """An HTTP client sized for this sender (copies of one attempt need their own
        connections to arrive at the same time)."""
        limit = self.concurrency * self.faults.copies
        return httpx.AsyncClient(
            limits=httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
        )

    def signed_headers(self, event: Outgoing) -> dict[str, str]:
        """The headers of one attempt at `event`, signed now (a fresh timestamp
        where the provider signs one)."""
        headers = {"content-type": "application/json", "user-agent": "onceonly-dev-gateway"}
        headers.update(
            self.provider.sign(event.body, delivery_id=event.delivery_id, query=event.query)
        )
        # The event's own headers win over what sign() makes up for them (a
        # Shopify event id shared by every retry, say); none of them is signed.
        headers.update(event.headers)
        return headers

    def signed_query(self, event: Outgoing) -> dict[str, str]:
        """The query string of one attempt at `event`: its own, plus what the
        provider authenticates with in the URL (Efí's ``hmac``)."""
        return self.provider.sign_query(event.query)

    async def send_once(
        self, event: Outgoing, client: httpx.AsyncClient, *, wait: float | None = None
    ) -> Answer:
        """One signed request, no retries: what ``onceonly dev send`` does. `wait`
        overrides the sender's timeout (seconds)."""
        headers = self.signed_headers(event)
        return await self._post(event, headers, client, wait or self.timeout)

    async def deliver(
        self, events: Sequence[Outgoing], client: httpx.AsyncClient | None = None
    ) -> DeliveryReport:
        """Deliver every event (retrying as the provider does) and report what happened."""
        started = time.monotonic()
        self.stats.events += len(events)
        outcomes = {e.event_id: EventOutcome(e.event_id) for e in events}
        # Draw every start time up front, in event order: the seed alone decides them.
        starts = [
            self.random.uniform(0.0, self.faults.spread) if self.faults.spread else 0.0
            for _ in events
        ]
        own = client is None
        http = client or self.client()
        try:
            await asyncio.gather(
                *(
                    self._deliver_one(event, outcomes[event.event_id], http, start)
                    for event, start in zip(events, starts, strict=True)
                )
            )
        finally:
            if own:
                await http.aclose()
        return DeliveryReport(self.stats, outcomes, time.monotonic() - started)

    async def _deliver_one(
        self, event: Outgoing, outcome: EventOutcome, client: httpx.AsyncClient, start: float
    ) -> None:
        if self.faults.lost and self._dice(event, 0).random() < self.faults.lost:
            outcome.lost = True
            self.stats.lost += 1
            self._notify()
            return
        if start:
            await asyncio.sleep(start)
        attempt = 0
        while not self._stopped:
            attempt += 1
            sent, status = await self._attempt(event, attempt, outcome, client)
            if not sent:
                break  # the queue stopped while this attempt waited for a slot
            verdict = decide(self.policy, attempt, status)
            if verdict is Verdict.ACKNOWLEDGED:
                self._consecutive_failures = 0
                outcome.acknowledged = True
                self.stats.acknowledged += 1
                self._notify()
                return
            self._consecutive_failures += 1
            limit = self.policy.pause_after_failures
            if limit is not None and self._consecutive_failures >= limit:
                # Asaas stops the whole queue; it waits until someone re-enables it.
                self.stats.paused = self._stopped = True
            if verdict is Verdict.DISABLE:
                self.stats.disabled = self._stopped = True
            if verdict is Verdict.GIVE_UP or self._stopped:
                self.stats.given_up += 1
                self._notify()
                return
            self.stats.retries += 1
            self._notify()
            delay = self.policy.delay_after(attempt) or 0.0
            await asyncio.sleep(delay / self.speedup)
        self.stats.given_up += 1

    def _dice(self, event: Outgoing, attempt: int) -> random.Random:
        """The generator for one attempt's faults. Seeded by event and attempt, so a
        seed gives every attempt the same faults whatever the timing: two runs
        (the demo's two receivers) face the same bad day."""
        if self.seed is None:
            return self.random
        # Attempt 0 is the event's own dice (lost for good or not).
        return random.Random(f"{self.seed}:{event.event_id}:{attempt}")

    async def _attempt(
        self, event: Outgoing, attempt: int, outcome: EventOutcome, client: httpx.AsyncClient
    ) -> tuple[bool, int | None]:
        """One attempt, possibly as concurrent copies: whether it was sent, and the
        status the sender acts on (``None``: no answer counts)."""
        faults = self.faults
        dice = self._dice(event, attempt)
        copies = faults.copies if dice.random() < faults.duplicates else 1
        timeout = self.timeout
        if dice.random() < faults.timeouts:
            timeout = dice.uniform(*INJECTED_TIMEOUT)
            self.stats.injected_timeouts += 1
        lose_ack = dice.random() < faults.lost_acks
        headers = self.signed_headers(event)
        async with self._slots:
            if self._stopped:
                return False, None
            answers = await asyncio.gather(
                *(self._post(event, headers, client, timeout) for _ in range(copies))
            )
        self.stats.attempts += 1
        if copies > 1:
            self.stats.concurrent_copies += copies - 1
        # The sender sees one answer per attempt: the first success, if any copy
        # got one, else the first answer.
        seen = next(
            (a for a in answers if a.status is not None and self.policy.succeeded(a.status)),
            answers[0],
        )
        if seen.status is not None and self.policy.succeeded(seen.status) and lose_ack:
            self.stats.lost_acks += 1
            outcome.answers.append(f"{seen.status} (lost)")
            return True, None
        outcome.answers.append(seen.describe())
        return True, seen.status

    async def _post(
        self, event: Outgoing, headers: Mapping[str, str], client: httpx.AsyncClient, wait: float
    ) -> Answer:
        self.stats.requests += 1
        try:
            response = await client.post(
                self.url,
                content=event.body,
                headers=dict(headers),
                params=self.signed_query(event) or None,
                timeout=wait,
            )
        except httpx.TimeoutException:
            self.stats.timeouts += 1
            return Answer(None, error="timeout")
        except httpx.TransportError as exc:
            self.stats.connection_errors += 1
            return Answer(None, error=type(exc).__name__)
        self.stats.statuses[response.status_code] += 1
        duplicate = response.headers.get("onceonly-duplicate") == "true"
        if duplicate:
            self.stats.duplicates_answered += 1
        return Answer(
            response.status_code,
            duplicate=duplicate,
            text=response.text,
            headers=dict(response.headers),
        )

    def _notify(self) -> None:
        if self.on_attempt is not None:
            self.on_attempt(self.stats)
