"""Model and endpoint pages."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from studio.views import page


@page
def models(request: HttpRequest) -> HttpResponse:
    return render(request, "hosting/models.html")
