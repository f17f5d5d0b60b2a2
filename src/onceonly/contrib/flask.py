"""onceonly inside a Flask app: a view that receives webhooks, and Idempotency-Keys
scoped by the logged-in user.

::

    from onceonly.contrib.flask import webhook_view

    app.add_url_rule(
        "/webhooks/<provider>", view_func=webhook_view(onceonly), methods=["POST"]
    )

The view is the receiver of ``onceonly serve`` (:class:`onceonly.receiver.Receiver`)
run for one request: the same verification, the same group commit, the same
answers (200 only after the commit, 4xx problem documents, 503 with
``Retry-After`` when the database is down), the same metrics. Flask is
imported when a view is called, not when this module is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..wsgi import Environ, call_asgi, declared_length, problem_body, read_upto

if TYPE_CHECKING:
    import flask

    from ..config import Onceonly

__all__ = ["user_scope", "webhook_view"]


def webhook_view(
    onceonly: Onceonly, *, name: str = "onceonly_webhook"
) -> Callable[[str], flask.Response]:
    """A Flask view for ``POST /<provider>`` deliveries, for the providers of
    `onceonly`; route it with a ``<provider>`` variable (and, for tenants, a
    second rule with ``<tenant>``: see docs/tenants.md)::

        app.add_url_rule("/webhooks/<provider>", view_func=webhook_view(onceonly),
                         methods=["POST"])

    `name` is its endpoint name (``url_for``), and must be unique in the app.
    Exempt it from CSRF protection (Flask-WTF: ``csrf.exempt(view)``): the
    signature is what authenticates a delivery.
    """
    receiver = onceonly.receiver()
    limit = receiver.reception.max_body_bytes

    def view(provider: str, tenant: str = "") -> flask.Response:
        from flask import Response, request

        environ = request.environ
        # Read here, on the server's thread, never more than one byte past
        # the limit: the receiver then refuses what is too large (413). One
        # whose Content-Length says so is refused unread, as by `onceonly serve`.
        declared = declared_length(environ)
        body = b"" if declared is not None and declared > limit else read_upto(environ, limit + 1)
        if body is None:
            # The sender went away mid-body: nothing is stored, and the
            # answer (WSGI wants one) reaches nobody.
            detail = "the request body ended before the length its Content-Length announced"
            return Response(
                problem_body(400, "incomplete-body", "Incomplete Body", detail),
                status=400,
                content_type="application/problem+json",
            )
        path = f"/{provider}/{tenant}" if tenant else f"/{provider}"
        answer = call_asgi(receiver, environ, path, body)
        return Response(
            answer.body,
            status=answer.status,
            headers=[(n.decode("latin-1"), v.decode("latin-1")) for n, v in answer.headers],
        )

    view.__name__ = name
    return view


def user_scope(app: flask.Flask, user_id: Callable[[], object]) -> Callable[[Environ], str | None]:
    """An `environ_scope` for :class:`~onceonly.idempotency.WSGIIdempotencyMiddleware`
    that scopes keys by the logged-in user: `user_id` is called inside a
    request context of `app` (its session opened, ``flask_login.current_user``
    usable) and returns the user's id, or ``None`` for an anonymous request
    (which is refused with 400 if it carries a key)::

        app.wsgi_app = WSGIIdempotencyMiddleware(
            app.wsgi_app, onceonly=onceonly,
            environ_scope=user_scope(app, lambda: flask.session.get("user_id")),
        )

    It must not read the request body (``request.form``, ``request.json``):
    the middleware reads it afterwards.
    """

    def scope(environ: Environ) -> str | None:
        with app.request_context(environ):
            ident = user_id()
        if ident is None or ident == "":
            return None
        return f"user:{ident}"

    return scope
