"""The tuning page's Delete (studio.deletion_pages; the rules are in tuning.deletion)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from studio.deletion_pages import confirm_or_delete
from studio.views import page
from tuning.access import get_tuning_job_for_user
from tuning.deletion import delete_tuning_job, tuning_deletion_plan


@page
def tuning_delete(request: HttpRequest, pk: int) -> HttpResponse:
    tuning = get_tuning_job_for_user(request.user, pk, write=True)
    return confirm_or_delete(request, plan=lambda: tuning_deletion_plan(tuning),
                             delete=lambda: delete_tuning_job(tuning)[0],
                             back_url=reverse("tuning-detail", args=[pk]), done_url=reverse("tuning"),
                             noun=f"tuning job {tuning.name}")
