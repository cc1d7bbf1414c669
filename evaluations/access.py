"""The one access helper for evaluations, used by pages and the API alike: project readers
see them, scientists and admins start and use them; anyone else gets a 404."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.http import Http404

from evaluations.models import Evaluation
from studio.access import check_role


def get_evaluation_for_user(user: User | AnonymousUser, pk: int, *, write: bool = False) -> Evaluation:
    evaluation = (Evaluation.objects.select_related("project", "model_version__model", "dataset_version__dataset",
                                                    "created_by").filter(pk=pk).first())
    if evaluation is None:
        raise Http404("No such evaluation.")
    check_role(user, evaluation.project, write=write)
    return evaluation
