"""Review statistics API routes (review.stats); included under /api/v1/ by studio.urls."""

from __future__ import annotations

from django.urls import path

from review import api_stats

urlpatterns = [
    path("flow-definitions/<int:pk>/stats/", api_stats.FlowStatsView.as_view(), name="api-flow-definition-stats"),
]
