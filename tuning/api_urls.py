"""The tuning job API routes; included under /api/v1/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from tuning import api

urlpatterns = [
    path("tuning-jobs/", api.TuningJobListView.as_view(), name="api-tuning-jobs"),
    path("tuning-jobs/<int:pk>/", api.TuningJobDetailView.as_view(), name="api-tuning-job"),
    path("tuning-jobs/<int:pk>/stop/", api.TuningJobStopView.as_view(), name="api-tuning-job-stop"),
]
