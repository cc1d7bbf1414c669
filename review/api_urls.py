"""The review API routes (teams, flows and their statistics, human loops, claims and answers);
included under /api/v1/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from review import api, api_stats

urlpatterns = [
    path("work-teams/", api.WorkTeamListView.as_view(), name="api-work-teams"),
    path("work-teams/<int:pk>/", api.WorkTeamDetailView.as_view(), name="api-work-team"),
    path("flow-definitions/", api.FlowDefinitionListView.as_view(), name="api-flow-definitions"),
    path("flow-definitions/<int:pk>/", api.FlowDefinitionDetailView.as_view(), name="api-flow-definition"),
    path("flow-definitions/<int:pk>/export/", api.FlowDefinitionExportView.as_view(), name="api-flow-definition-export"),
    path("flow-definitions/<int:pk>/export/preview/", api.FlowDefinitionExportPreviewView.as_view(),
         name="api-flow-definition-export-preview"),
    path("human-loops/", api.HumanLoopListView.as_view(), name="api-human-loops"),
    path("human-loops/<str:name>/", api.HumanLoopDetailView.as_view(), name="api-human-loop"),
    path("human-loops/<str:name>/stop/", api.HumanLoopStopView.as_view(), name="api-human-loop-stop"),
    path("human-loops/<str:name>/output", api.HumanLoopOutputView.as_view(), name="api-human-loop-output"),
    path("review/claim/", api.ClaimView.as_view(), name="api-review-claim"),
    path("review/assignments/<int:pk>/answer/", api.AnswerView.as_view(), name="api-review-answer"),
    path("review/assignments/<int:pk>/release/", api.ReleaseView.as_view(), name="api-review-release"),
    path("dataset-versions/<int:pk>/retrain/", api.RetrainView.as_view(), name="api-dataset-version-retrain"),
    path("flow-definitions/<int:pk>/stats/", api_stats.FlowStatsView.as_view(), name="api-flow-definition-stats"),
]
