"""The overview page route; included at the site's root by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from overview import views

urlpatterns = [
    path("", views.overview, name="overview"),
]
