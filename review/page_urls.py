"""The review pages; included under /review/ by studio.page_urls."""

from __future__ import annotations

from django.urls import path

from review import views

urlpatterns = [
    path("", views.review_inbox, name="review-inbox"),
]
