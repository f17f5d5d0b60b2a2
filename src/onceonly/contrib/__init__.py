"""onceonly inside the frameworks Python payment code runs on.

Each subpackage is optional and imports its framework only when used:
:mod:`onceonly.contrib.django` (a Django app), :mod:`onceonly.contrib.flask`
(webhooks in a Flask view, Idempotency-Keys scoped by its logged-in user; the
WSGI middleware itself is :class:`onceonly.idempotency.WSGIIdempotencyMiddleware`),
:mod:`onceonly.contrib.celery` (tasks that act once) and
:mod:`onceonly.contrib.alembic` (autogenerate leaves the onceonly tables alone).
They compose the application like the CLI does, and reach the database only
through :mod:`onceonly.store`'s repositories.
"""
