"""Review pages: the reviewer inbox, flows and their stats."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from studio.views import page


@page(reviewers=True)
def review_inbox(request: HttpRequest) -> HttpResponse:
    return render(request, "review/inbox.html")
