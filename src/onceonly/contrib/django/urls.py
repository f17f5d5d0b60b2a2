"""``path("webhooks/", include("onceonly.contrib.django.urls"))``: ``POST /webhooks/<provider>``."""

from __future__ import annotations

from django.urls import path

from .views import receive

app_name = "onceonly"
urlpatterns = [
    path("<str:provider>", receive, name="receive"),
    # Many merchants, one deployment (docs/tenants.md).
    path("<str:provider>/<str:tenant>", receive, name="receive-tenant"),
]
