"""The one access helper for training jobs, used by pages and the API alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.shortcuts import get_object_or_404

from jobs.models import TrainingJob
from studio.access import check_role

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


def get_job_for_user(user: User | AnonymousUser, pk: int, *, write: bool = False) -> TrainingJob:
    """The job if the user may read it (write: change it); 404 for other projects' jobs."""
    job = get_object_or_404(TrainingJob.objects.select_related("project"), pk=pk)
    check_role(user, job.project, write=write)
    return job
