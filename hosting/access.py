"""The one access helper per hosting object, used by pages and the API alike. Objects of a
project the user cannot read (outsiders, reviewers) are 404, never 403."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.shortcuts import get_object_or_404

from hosting.models import BatchPrediction, Endpoint, Model
from studio.access import check_role

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


def get_model_for_user(user: User | AnonymousUser, pk: int, *, write: bool = False) -> Model:
    model = get_object_or_404(Model.objects.select_related("project"), pk=pk)
    check_role(user, model.project, write=write)
    return model


def get_endpoint_for_user(user: User | AnonymousUser, name: str, *, write: bool = False) -> Endpoint:
    endpoint = get_object_or_404(
        Endpoint.objects.select_related("project", "model_version__model", "flow_definition"), name=name)
    check_role(user, endpoint.project, write=write)
    return endpoint


def get_batch_for_user(user: User | AnonymousUser, pk: int, *, write: bool = False) -> BatchPrediction:
    batch = get_object_or_404(BatchPrediction.objects.select_related("project", "model_version__model"), pk=pk)
    check_role(user, batch.project, write=write)
    return batch
