"""The job page's Delete (studio.deletion_pages; the rules are in jobs.deletion)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from jobs.access import get_job_for_user
from jobs.deletion import delete_job, job_deletion_plan
from studio.deletion_pages import confirm_or_delete
from studio.views import page


@page
def job_delete(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_job_for_user(request.user, pk, write=True)
    return confirm_or_delete(request, plan=lambda: job_deletion_plan(job), delete=lambda: delete_job(job)[0],
                             back_url=reverse("job-detail", args=[pk]), done_url=reverse("job-list"),
                             noun=f"job {job.name}")
