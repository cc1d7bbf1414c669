"""The hosting pages (models, endpoints, batch predictions); included under /models/ by
studio.page_urls."""

from __future__ import annotations

from django.urls import path

from hosting import views

urlpatterns = [
    path("", views.models, name="models"),
]
