"""Training job pages, included under /jobs/ by studio/page_urls.py."""

from django.urls import path

from jobs import views, views_datasets, views_delete

urlpatterns = [
    path("", views.job_list, name="job-list"),
    path("new/", views.job_create, name="job-create"),
    path("compare/", views.job_compare, name="job-compare"),
    path("<int:pk>/", views.job_detail, name="job-detail"),
    path("<int:pk>/model", views.job_model, name="job-model"),
    path("<int:pk>/logs", views.job_logs, name="job-logs"),
    path("<int:pk>/delete/", views_delete.job_delete, name="job-delete"),
    path("by-dataset/<int:pk>/", views_datasets.dataset_jobs, name="dataset-jobs"),
]
