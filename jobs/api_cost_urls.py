"""Cost API routes (instance prices, a project's spend); included under /api/v1/ by
trainyard_site.urls."""

from __future__ import annotations

from django.urls import URLPattern, path

from jobs import api_cost

urlpatterns: list[URLPattern] = [
    path("projects/<slug:slug>/spend/", api_cost.ProjectSpendView.as_view(), name="api-project-spend"),
    path("projects/<slug:slug>/spend/launches/", api_cost.ProjectSpendLaunchesView.as_view(),
         name="api-project-spend-launches"),
    path("projects/<slug:slug>/instance-prices/", api_cost.InstancePriceListView.as_view(),
         name="api-project-instance-prices"),
    path("projects/<slug:slug>/instance-prices/<str:instance_type>/", api_cost.InstancePriceDetailView.as_view(),
         name="api-project-instance-price"),
]
