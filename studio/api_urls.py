"""The studio's own API routes (tokens, projects and members); included under /api/v1/ by
trainyard_site.urls."""

from django.urls import path

from studio import views_api

urlpatterns = [
    path("tokens/", views_api.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:pk>/", views_api.TokenDetailView.as_view(), name="api-token"),
    path("projects/", views_api.ProjectListView.as_view(), name="api-projects"),
    path("projects/<slug:slug>/members/", views_api.ProjectMembersView.as_view(), name="api-project-members"),
]
