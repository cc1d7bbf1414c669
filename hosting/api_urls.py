"""The hosting API routes; included under /api/v1/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from hosting import api

urlpatterns = [
    path("models/", api.ModelListView.as_view(), name="api-models"),
    path("models/<int:pk>/", api.ModelDetailView.as_view(), name="api-model"),
    path("models/<int:pk>/versions/<int:number>/", api.ModelVersionDetailView.as_view(), name="api-model-version"),
    path("models/<int:pk>/versions/<int:number>/download", api.ModelVersionDownloadView.as_view(),
         name="api-model-version-download"),
    path("endpoints/", api.EndpointListView.as_view(), name="api-endpoints"),
    path("endpoints/<str:name>/", api.EndpointDetailView.as_view(), name="api-endpoint"),
    path("endpoints/<str:name>/invocations", api.InvocationView.as_view(), name="api-endpoint-invocations"),
    path("batch-predictions/", api.BatchPredictionListView.as_view(), name="api-batch-predictions"),
    path("batch-predictions/<int:pk>/", api.BatchPredictionDetailView.as_view(), name="api-batch-prediction"),
    path("batch-predictions/<int:pk>/download", api.BatchPredictionDownloadView.as_view(),
         name="api-batch-prediction-download"),
]
