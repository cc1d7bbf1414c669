"""The studio's own API routes (tokens, projects, members and notification channels);
included under /api/v1/ by trainyard_site.urls."""

from django.urls import path

from studio import api_notify, views_api

urlpatterns = [
    path("tokens/", views_api.TokenListView.as_view(), name="api-tokens"),
    path("tokens/<int:pk>/", views_api.TokenDetailView.as_view(), name="api-token"),
    path("projects/", views_api.ProjectListView.as_view(), name="api-projects"),
    path("projects/<slug:slug>/members/", views_api.ProjectMembersView.as_view(), name="api-project-members"),
    path("projects/<slug:slug>/notification-channels/", api_notify.ChannelListView.as_view(),
         name="api-notification-channels"),
    path("projects/<slug:slug>/notification-channels/<int:pk>/", api_notify.ChannelDetailView.as_view(),
         name="api-notification-channel"),
    path("projects/<slug:slug>/notification-channels/<int:pk>/test/", api_notify.ChannelTestView.as_view(),
         name="api-notification-channel-test"),
    path("projects/<slug:slug>/notification-channels/<int:pk>/rotate-secret/",
         api_notify.ChannelRotateSecretView.as_view(), name="api-notification-channel-rotate-secret"),
    path("projects/<slug:slug>/notification-channels/<int:pk>/deliveries/",
         api_notify.ChannelDeliveriesView.as_view(), name="api-notification-channel-deliveries"),
]
