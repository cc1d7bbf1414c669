"""The one access helper for tuning jobs, used by pages and the API alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.shortcuts import get_object_or_404

from studio.access import check_role
from tuning.models import TuningJob

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


def get_tuning_job_for_user(user: User | AnonymousUser, pk: int, *, write: bool = False) -> TuningJob:
    """The tuning job if the user may read it (write: change it); 404 for other projects'."""
    tuning = get_object_or_404(TuningJob.objects.select_related("project"), pk=pk)
    check_role(user, tuning.project, write=write)
    return tuning
