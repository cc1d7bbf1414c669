"""Metric, log and live-event endpoints of a job; included under /api/v1/ by studio.urls."""

from __future__ import annotations

from django.urls import path

from jobs import api_metrics

urlpatterns = [
    path("jobs/<int:pk>/metrics/", api_metrics.JobMetricsView.as_view(), name="api-job-metrics"),
    path("jobs/<int:pk>/system-metrics/", api_metrics.JobSystemMetricsView.as_view(), name="api-job-system-metrics"),
    path("jobs/<int:pk>/logs/", api_metrics.JobLogsView.as_view(), name="api-job-logs"),
    path("jobs/<int:pk>/stream", api_metrics.JobStreamView.as_view(), name="api-job-stream"),
]
