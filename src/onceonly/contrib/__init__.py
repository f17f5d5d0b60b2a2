"""onceonly inside the frameworks Python payment code runs on.

Each subpackage is optional and imports its framework only when used:
:mod:`onceonly.contrib.django` (a Django app), :mod:`onceonly.contrib.wsgi`
(the Idempotency-Key middleware for Flask and any WSGI app),
:mod:`onceonly.contrib.celery` (tasks that act once) and
:mod:`onceonly.contrib.alembic` (autogenerate leaves the onceonly tables alone).
They compose the application like the CLI does, and reach the database only
through :mod:`onceonly.store`'s repositories.
"""
