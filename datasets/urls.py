"""The dataset pages; included under /datasets/ by trainyard_site.urls."""

from django.urls import path

from datasets import views

urlpatterns = [
    path("", views.dataset_list, name="dataset-list"),
    path("new/", views.dataset_upload, name="dataset-upload"),
    path("<int:pk>/", views.dataset_detail, name="dataset-detail"),
    path("versions/<int:pk>/", views.version_redirect, name="dataset-version"),
    path("versions/<int:pk>/status/", views.version_status, name="dataset-version-status"),
    path("versions/<int:pk>/delete/", views.version_delete, name="dataset-version-delete"),
    path("versions/<int:pk>/files/<path:path>", views.version_file, name="dataset-file"),
]
