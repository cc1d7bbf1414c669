"""The training job API routes (algorithms, scripts, jobs, their metrics, logs and live
events, nodes); included under /api/v1/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from jobs import api, api_metrics, api_nodes, api_rules

urlpatterns = [
    path("algorithms/", api.AlgorithmListView.as_view(), name="api-algorithms"),
    path("scripts/", api.ScriptUploadView.as_view(), name="api-scripts"),
    path("jobs/", api.JobListView.as_view(), name="api-jobs"),
    path("jobs/<int:pk>/", api.JobDetailView.as_view(), name="api-job"),
    path("jobs/<int:pk>/stop/", api.JobStopView.as_view(), name="api-job-stop"),
    path("jobs/<int:pk>/metrics/", api_metrics.JobMetricsView.as_view(), name="api-job-metrics"),
    path("jobs/<int:pk>/system-metrics/", api_metrics.JobSystemMetricsView.as_view(), name="api-job-system-metrics"),
    path("jobs/<int:pk>/logs/", api_metrics.JobLogsView.as_view(), name="api-job-logs"),
    path("jobs/<int:pk>/stream", api_metrics.JobStreamView.as_view(), name="api-job-stream"),
    path("jobs/<int:pk>/rules/", api_rules.JobRuleListView.as_view(), name="api-job-rules"),
    path("jobs/<int:pk>/rules/<int:rule_id>/", api_rules.JobRuleDetailView.as_view(), name="api-job-rule"),
    path("jobs/<int:pk>/alarm-transitions/", api_rules.JobAlarmTransitionsView.as_view(), name="api-job-alarm-transitions"),
    path("alarms/", api_rules.AlarmListView.as_view(), name="api-alarms"),
    path("nodes/", api_nodes.NodeListView.as_view(), name="api-nodes"),
    path("nodes/<str:name>/", api_nodes.NodeDetailView.as_view(), name="api-node"),
]
