"""The studio's own pages: sign-in, API tokens, a project's notification channels and the
favicon; included at the site's root by trainyard_site.urls."""

from django.urls import path

from studio import views, views_notify, views_tokens

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    # Browsers ask for /favicon.ico on pages that link none (the API's JSON, the docs).
    path("favicon.ico", views.favicon, name="favicon"),
    path("account/tokens/", views_tokens.token_list, name="tokens"),
    path("account/tokens/<int:pk>/revoke/", views_tokens.token_revoke, name="token-revoke"),
    path("projects/<slug:slug>/notifications/", views_notify.channel_list, name="notification-channels"),
    path("projects/<slug:slug>/notifications/<int:pk>/test/", views_notify.channel_test, name="notification-channel-test"),
    path("projects/<slug:slug>/notifications/<int:pk>/toggle/", views_notify.channel_toggle,
         name="notification-channel-toggle"),
    path("projects/<slug:slug>/notifications/<int:pk>/rotate-secret/", views_notify.channel_rotate,
         name="notification-channel-rotate"),
    path("projects/<slug:slug>/notifications/<int:pk>/delete/", views_notify.channel_delete,
         name="notification-channel-delete"),
]
