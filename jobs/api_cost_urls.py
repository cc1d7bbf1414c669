"""Cost API routes (instance prices, a project's spend); included under /api/v1/ by
trainyard_site.urls."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
