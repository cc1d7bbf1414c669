"""Delete on the model and endpoint pages (studio.deletion_pages; rules in hosting.deletion)."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse

from hosting import actions
from hosting.access import get_endpoint_for_user, get_model_for_user
from hosting.deletion import (
    delete_model,
    delete_model_version,
    endpoint_deletion_plan,
    model_deletion_plan,
    version_deletion_plan,
)
from studio.deletion_pages import confirm_or_delete
from studio.views import page


@page
def model_delete(request: HttpRequest, pk: int) -> HttpResponse:
    model = get_model_for_user(request.user, pk, write=True)
    return confirm_or_delete(request, plan=lambda: model_deletion_plan(model), delete=lambda: delete_model(model),
                             back_url=reverse("model-detail", args=[pk]), done_url=reverse("models"),
                             noun=f"model {model.name}")


@page
def model_version_delete(request: HttpRequest, pk: int, number: int) -> HttpResponse:
    model = get_model_for_user(request.user, pk, write=True)
    version = model.versions.select_related("model").filter(version=number).first()
    if version is None:
        raise Http404(f"Model '{model.name}' has no version {number}.")
    back = reverse("model-detail", args=[pk])
    return confirm_or_delete(request, plan=lambda: version_deletion_plan(version),
                             delete=lambda: delete_model_version(version), back_url=back, done_url=back,
                             noun=f"{model.name} v{number}")


@page
def endpoint_delete(request: HttpRequest, name: str) -> HttpResponse:
    endpoint = get_endpoint_for_user(request.user, name, write=True)
    return confirm_or_delete(request, plan=lambda: endpoint_deletion_plan(endpoint),
                             delete=lambda: actions.delete_endpoint(endpoint),
                             back_url=reverse("endpoint-detail", args=[name]),
                             done_url=reverse("model-detail", args=[endpoint.model_version.model_id]),
                             noun=f"endpoint {endpoint.name}")
