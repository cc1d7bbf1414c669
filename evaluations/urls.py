"""Evaluation pages; included under /evaluations/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from evaluations import views

urlpatterns = [
    path("new/", views.evaluation_new, name="evaluation-new"),
    path("new/register/<int:job_pk>/", views.evaluation_register_job, name="evaluation-register-job"),
    path("compare/", views.evaluation_compare, name="evaluation-compare"),
    path("<int:pk>/", views.evaluation_detail, name="evaluation-detail"),
    path("<int:pk>/status/", views.evaluation_status, name="evaluation-status"),
    path("<int:pk>/proposal/", views.evaluation_propose, name="evaluation-propose"),
    path("<int:pk>/calibrate/", views.evaluation_calibrate, name="evaluation-calibrate"),
    path("<int:pk>/apply/", views.evaluation_activate, name="evaluation-activate"),
]
