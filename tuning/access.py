"""The one access helper for tuning jobs, used by pages and the API alike."""

from __future__ import annotations

from django.shortcuts import get_object_or_404

from studio.access import check_role
from tuning.models import TuningJob


def get_tuning_job_for_user(user, pk: int, *, write: bool = False) -> TuningJob:
    """The tuning job if the user may read it (write: change it); 404 for other projects'."""
    tuning = get_object_or_404(TuningJob.objects.select_related("project"), pk=pk)
    check_role(user, tuning.project, write=write)
    return tuning
