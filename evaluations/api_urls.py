"""The evaluations API routes; included under /api/v1/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from evaluations import api

urlpatterns = [
    path("evaluations/", api.EvaluationListView.as_view(), name="api-evaluations"),
    path("evaluations/compare/", api.CompareView.as_view(), name="api-evaluations-compare"),
    path("evaluations/<int:pk>/", api.EvaluationDetailView.as_view(), name="api-evaluation"),
    path("evaluations/<int:pk>/proposal/", api.ProposalView.as_view(), name="api-evaluation-proposal"),
    path("evaluations/<int:pk>/per-class.csv", api.PerClassCsvView.as_view(), name="api-evaluation-per-class"),
    path("model-versions/<int:pk>/calibration/", api.ModelVersionCalibrationView.as_view(),
         name="api-model-version-calibration"),
    path("flow-definitions/<int:pk>/activation/", api.FlowActivationView.as_view(), name="api-flow-definition-activation"),
]
