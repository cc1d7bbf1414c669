"""The hosting pages (models, endpoints, batch predictions); included under /models/ by
trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from hosting import views, views_delete

urlpatterns = [
    path("", views.models, name="models"),
    path("register/", views.model_register, name="model-register"),
    path("<int:pk>/", views.model_detail, name="model-detail"),
    path("<int:pk>/endpoints/new/", views.endpoint_create, name="endpoint-create"),
    path("<int:pk>/batch/", views.batch_create, name="batch-create"),
    path("endpoints/<str:name>/", views.endpoint_detail, name="endpoint-detail"),
    path("<int:pk>/delete/", views_delete.model_delete, name="model-delete"),
    path("<int:pk>/versions/<int:number>/delete/", views_delete.model_version_delete, name="model-version-delete"),
    path("endpoints/<str:name>/delete/", views_delete.endpoint_delete, name="endpoint-delete"),
    path("endpoints/<str:name>/settings/", views.endpoint_update, name="endpoint-update"),
]
