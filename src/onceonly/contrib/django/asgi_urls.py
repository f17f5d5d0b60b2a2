"""``path("webhooks/", include("onceonly.contrib.django.asgi_urls"))``: the
receiver as an async view, for projects served by an ASGI server only."""

from __future__ import annotations

from django.urls import path

from .views import receive_async

app_name = "onceonly"
urlpatterns = [
    path("<str:provider>", receive_async, name="receive"),
    # Many merchants, one deployment (docs/tenants.md).
    path("<str:provider>/<str:tenant>", receive_async, name="receive-tenant"),
]
