"""Tools for local development and tests: a fake gateway that behaves like a provider.

Nothing here names a provider: each one's retry schedule, event shapes and
fake API paths are its development profile (``onceonly/providers/<name>/profile.py``,
a :class:`~onceonly.providers.profile.DevProfile`), found by
:mod:`onceonly.dev.profiles`.

- :mod:`onceonly.dev.schedules`: each provider's retry schedule, timeout and
  success rule, and the decision taken after each attempt.
- :mod:`onceonly.dev.delivery`: the delivery engine (asyncio + httpx) that sends
  signed deliveries with that behaviour, plus duplicates, out-of-order delivery
  and injected faults.
- :mod:`onceonly.dev.payloads`: event bodies shaped like each provider's.
- :mod:`onceonly.dev.api`: the fake provider API that serves the objects the
  events point to.
- :mod:`onceonly.dev.cli`: ``onceonly dev gateway`` and ``onceonly dev send``.
"""
