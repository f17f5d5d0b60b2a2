"""The test project's URLs (the onceonly include is added by the Django work)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls), path("orders/", include("orders.urls"))]
