"""The test project's URLs: the admin, onceonly's receiver, and a bare view
(the benchmark's baseline)."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt


@csrf_exempt
def bare(request: HttpRequest) -> HttpResponse:
    """Reads the body and answers 200: what any Django view costs."""
    request.read()
    return HttpResponse(b'{"ok":true}', content_type="application/json")


urlpatterns = [
    path("admin/", admin.site.urls),
    path("webhooks/", include("onceonly.contrib.django.urls")),
    # The async view, for ASGI servers (tests/acceptance/test_django_receive.py).
    path("async-webhooks/", include("onceonly.contrib.django.asgi_urls", namespace="async")),
    path("bare/", bare),
    path("orders/", include("orders.urls")),
]
