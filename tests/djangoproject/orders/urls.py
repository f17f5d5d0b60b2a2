"""``/orders/sync/...`` (sync views) and ``/orders/async/...`` (async views)."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("sync/orders", views.create_order),
    path("sync/slow", views.slow),
    path("sync/boom", views.boom),
    path("sync/invalid", views.invalid),
    path("sync/report", views.report),
    path("sync/trickle", views.trickle),
    path("sync/whoami", views.whoami),
    path("sync/refund", views.Refund.as_view()),
    path("async/orders", views.acreate_order),
    path("async/slow", views.aslow),
    path("async/boom", views.aboom),
    path("async/invalid", views.ainvalid),
    path("async/report", views.areport),
    path("async/trickle", views.atrickle),
    path("async/whoami", views.awhoami),
    path("async/capture", views.acapture),
    path("login", views.log_in),
]
