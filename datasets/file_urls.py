"""Routes for reading a dataset version's files back (datasets.api_files); included under
/api/v1/ by studio.urls."""

from __future__ import annotations

from django.urls import path

from datasets import api_files

urlpatterns = [
    path("dataset-versions/<int:pk>/files/", api_files.DatasetVersionFileListView.as_view(),
         name="api-dataset-version-files"),
    path("dataset-versions/<int:pk>/files/<path:path>", api_files.DatasetVersionFileView.as_view(),
         name="api-dataset-version-file"),
    path("dataset-versions/<int:pk>/download", api_files.DatasetVersionDownloadView.as_view(),
         name="api-dataset-version-download"),
]
