"""Tuning job pages; included under /tuning/ by trainyard_site.urls."""

from django.urls import path

from tuning import views, views_delete

urlpatterns = [
    path("", views.tuning_list, name="tuning"),
    path("new/", views.tuning_create, name="tuning-create"),
    path("<int:pk>/", views.tuning_detail, name="tuning-detail"),
    path("<int:pk>/data/", views.tuning_data, name="tuning-data"),
    path("<int:pk>/delete/", views_delete.tuning_delete, name="tuning-delete"),
]
