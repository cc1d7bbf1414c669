"""The root URLconf: every app's API under /api/v1/ (each app's api_urls.py), the schema
and its docs, the admin, and every app's pages (each app's urls.py)."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from jobs.api_nodes import ClusterHistoryView
from trainyard_site.health import HealthView
from trainyard_site.prometheus import metrics_view

api_v1 = [
    path("health", HealthView.as_view(), name="api-health"),
    path("", include("studio.api_urls")),
    path("", include("datasets.api_urls")),
    path("", include("jobs.api_urls")),
    path("", include("jobs.api_cost_urls")),
    path("cluster/history/", ClusterHistoryView.as_view(), name="api-cluster-history"),
    path("", include("tuning.api_urls")),
    path("", include("hosting.api_urls")),
    path("", include("review.api_urls")),
    path("", include("evaluations.api_urls")),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),  # Prometheus (trainyard_site.prometheus), not part of the API
    path("", include("studio.urls")),
    path("", include("overview.urls")),
    path("datasets/", include("datasets.urls")),
    path("", include("jobs.urls")),
    path("", include("jobs.cost_urls")),
    path("tuning/", include("tuning.urls")),
    path("models/", include("hosting.urls")),
    path("review/", include("review.urls")),
    path("evaluations/", include("evaluations.urls")),
]
