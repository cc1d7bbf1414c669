"""The dataset API routes (datasets, versions, reading a version's files back); included
under /api/v1/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from datasets import api, api_files

urlpatterns = [
    path("datasets/", api.DatasetListView.as_view(), name="api-datasets"),
    path("datasets/<int:pk>/", api.DatasetDetailView.as_view(), name="api-dataset"),
    path("dataset-versions/", api.DatasetVersionListView.as_view(), name="api-dataset-versions"),
    path("dataset-versions/<int:pk>/", api.DatasetVersionDetailView.as_view(), name="api-dataset-version"),
    path("dataset-versions/<int:pk>/files/", api_files.DatasetVersionFileListView.as_view(),
         name="api-dataset-version-files"),
    path("dataset-versions/<int:pk>/files/<path:path>", api_files.DatasetVersionFileView.as_view(),
         name="api-dataset-version-file"),
    path("dataset-versions/<int:pk>/download", api_files.DatasetVersionDownloadView.as_view(),
         name="api-dataset-version-download"),
]
