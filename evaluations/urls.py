"""Evaluation pages; included under /evaluations/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from evaluations import views

urlpatterns = [
    path("<int:pk>/", views.evaluation_detail, name="evaluation-detail"),
]
