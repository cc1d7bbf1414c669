"""The studio's own pages: sign-in, API tokens and the favicon; included at the site's root
by trainyard_site.urls."""

from django.urls import path

from studio import views, views_tokens

urlpatterns = [
    path("login/", views.LoginView.as_view(), name="login"),
    path("logout/", views.LogoutView.as_view(), name="logout"),
    # Browsers ask for /favicon.ico on pages that link none (the API's JSON, the docs).
    path("favicon.ico", views.favicon, name="favicon"),
    path("account/tokens/", views_tokens.token_list, name="tokens"),
    path("account/tokens/<int:pk>/revoke/", views_tokens.token_revoke, name="token-revoke"),
]
