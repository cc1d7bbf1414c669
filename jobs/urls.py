"""Training job pages and the nodes page; included at the site's root by
trainyard_site.urls (the job pages live under /jobs/, the nodes page at /nodes/)."""

from django.urls import path

from jobs import views, views_alarms, views_datasets, views_delete, views_nodes, views_rules

urlpatterns = [
    path("jobs/", views.job_list, name="job-list"),
    path("jobs/new/", views.job_create, name="job-create"),
    path("jobs/compare/", views.job_compare, name="job-compare"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/model", views.job_model, name="job-model"),
    path("jobs/<int:pk>/logs", views.job_logs, name="job-logs"),
    path("jobs/<int:pk>/delete/", views_delete.job_delete, name="job-delete"),
    path("jobs/by-dataset/<int:pk>/", views_datasets.dataset_jobs, name="dataset-jobs"),
    path("nodes/", views_nodes.nodes, name="nodes"),
    path("alarms/", views_alarms.alarms, name="alarms"),
    path("jobs/<int:pk>/rules/add/", views_rules.rule_add, name="job-rule-add"),
    path("jobs/<int:pk>/rules/<int:rule_id>/toggle/", views_rules.rule_toggle, name="job-rule-toggle"),
    path("jobs/<int:pk>/rules/<int:rule_id>/delete/", views_rules.rule_delete, name="job-rule-delete"),
]
