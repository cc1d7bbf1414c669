"""Every page route (the API lives in studio/urls.py under /api/)."""

from django.urls import include, path

from datasets import views as dataset_views
from studio import views, views_tokens

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    path("", views.overview, name="overview"),
    path("datasets/", dataset_views.dataset_list, name="dataset-list"),
    path("datasets/new/", dataset_views.dataset_upload, name="dataset-upload"),
    path("datasets/<int:pk>/", dataset_views.dataset_detail, name="dataset-detail"),
    path("datasets/versions/<int:pk>/", dataset_views.version_redirect, name="dataset-version"),
    path("datasets/versions/<int:pk>/status/", dataset_views.version_status, name="dataset-version-status"),
    path("datasets/versions/<int:pk>/delete/", dataset_views.version_delete, name="dataset-version-delete"),
    path("datasets/versions/<int:pk>/files/<path:path>", dataset_views.version_file, name="dataset-file"),
    path("jobs/", include("jobs.page_urls")),
    path("tuning/", include("tuning.page_urls")),
    path("models/", include("hosting.page_urls")),
    path("review/", include("review.page_urls")),
    path("nodes/", views.nodes, name="nodes"),
    # Browsers ask for /favicon.ico on pages that link none (the API's JSON, the docs).
    path("favicon.ico", views.favicon, name="favicon"),
    path("account/tokens/", views_tokens.token_list, name="tokens"),
    path("account/tokens/<int:pk>/revoke/", views_tokens.token_revoke, name="token-revoke"),
]
