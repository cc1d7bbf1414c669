"""The review pages; included under /review/ by trainyard_site.urls."""

from __future__ import annotations

from django.urls import path

from review import views, views_delete

urlpatterns = [
    path("", views.review_inbox, name="review-inbox"),
    path("counts/", views.review_inbox_counts, name="review-inbox-counts"),
    path("held/", views.review_inbox_held, name="review-inbox-held"),
    path("flows/", views.flow_list, name="review-flows"),
    path("flows/new/", views.flow_create, name="review-flow-create"),
    path("teams/new/", views.team_create, name="review-team-create"),
    path("flows/<int:pk>/", views.flow_detail, name="review-flow"),
    path("flows/<int:pk>/delete/", views_delete.flow_delete, name="review-flow-delete"),
    path("teams/<int:pk>/delete/", views_delete.team_delete, name="review-team-delete"),
    path("flows/<int:pk>/items/<path:name>/", views.loop_detail, name="review-loop"),  # a loop name may hold "/"
    path("flows/<int:pk>/data/", views.flow_data, name="review-flow-data"),
    path("flows/<int:pk>/export/", views.flow_export, name="review-flow-export"),
    path("flows/<int:pk>/exports/<int:version_pk>/retrain/", views.flow_retrain, name="review-flow-retrain"),
]
