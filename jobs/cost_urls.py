"""Cost pages (a project's spend, instance prices); included at the site's root by
trainyard_site.urls."""

from __future__ import annotations

from django.urls import URLPattern

urlpatterns: list[URLPattern] = []
