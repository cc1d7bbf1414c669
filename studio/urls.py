from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from datasets import api as datasets_api
from jobs import api as jobs_api
from jobs import api_nodes
from studio import views_api
from tuning import api as tuning_api

api_v1 = [
    path("health", views_api.HealthView.as_view(), name="api-health"),
    path("tokens/", views_api.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:pk>/", views_api.TokenDetailView.as_view(), name="api-token"),
    path("projects/", views_api.ProjectListView.as_view(), name="api-projects"),
    path("projects/<slug:slug>/members/", views_api.ProjectMembersView.as_view(), name="api-project-members"),
    path("datasets/", datasets_api.DatasetListView.as_view(), name="api-datasets"),
    path("datasets/<int:pk>/", datasets_api.DatasetDetailView.as_view(), name="api-dataset"),
    path("dataset-versions/", datasets_api.DatasetVersionListView.as_view(), name="api-dataset-versions"),
    path("dataset-versions/<int:pk>/", datasets_api.DatasetVersionDetailView.as_view(), name="api-dataset-version"),
    path("", include("datasets.file_urls")),
    path("algorithms/", jobs_api.AlgorithmListView.as_view(), name="api-algorithms"),
    path("scripts/", jobs_api.ScriptUploadView.as_view(), name="api-scripts"),
    path("jobs/", jobs_api.JobListView.as_view(), name="api-jobs"),
    path("jobs/<int:pk>/", jobs_api.JobDetailView.as_view(), name="api-job"),
    path("jobs/<int:pk>/stop/", jobs_api.JobStopView.as_view(), name="api-job-stop"),
    path("tuning-jobs/", tuning_api.TuningJobListView.as_view(), name="api-tuning-jobs"),
    path("tuning-jobs/<int:pk>/", tuning_api.TuningJobDetailView.as_view(), name="api-tuning-job"),
    path("tuning-jobs/<int:pk>/stop/", tuning_api.TuningJobStopView.as_view(), name="api-tuning-job-stop"),
    path("nodes/", api_nodes.NodeListView.as_view(), name="api-nodes"),
    path("nodes/<str:name>/", api_nodes.NodeDetailView.as_view(), name="api-node"),
    path("", include("jobs.metrics_urls")),
    path("", include("hosting.api_urls")),
    path("", include("review.api_urls")),
    path("", include("review.stats_urls")),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/redoc/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-redoc"),
    path("admin/", admin.site.urls),
    path("", include("studio.page_urls")),
]
