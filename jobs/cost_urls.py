"""Cost pages (a project's spend, instance prices); included at the site's root by
trainyard_site.urls."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs import views_cost

urlpatterns: list[URLPattern] = [
    path("projects/<slug:slug>/spend/", views_cost.project_spend_page, name="project-spend"),
    path("projects/<slug:slug>/spend/launches.csv", views_cost.project_spend_csv, name="project-spend-csv"),
    path("projects/<slug:slug>/prices/", views_cost.instance_prices_page, name="instance-prices"),
]
