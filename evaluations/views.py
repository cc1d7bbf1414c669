"""Evaluation pages: the report of one evaluation."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from evaluations.access import get_evaluation_for_user
from studio.views import page


@page
def evaluation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    evaluation = get_evaluation_for_user(request.user, pk)
    return render(request, "evaluations/detail.html", {"evaluation": evaluation})
