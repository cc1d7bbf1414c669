"""The hosting pages' forms: each turns the posted ids into the job, model version, flow
definition or dataset version they name, with the same checks and messages as the API's
actions, so a page hands its action instances, never the posted strings.

A form's fields are plain strings; clean() looks them up in the action's order and stops
at the first refusal, so a page shows one message as it always has. A refusal about the
model itself ("model") is the form's non-field error; `page_errors` keys it "model" again
for the templates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS

from hosting import actions
from hosting.actions import HostingError
from hosting.models import Endpoint, Model
from jobs.models import TrainingJob
from studio.errors import ActionError
from studio.forms import ActionFormMixin


def _text() -> forms.CharField:
    return forms.CharField(required=False, strip=False)


class HostingForm(ActionFormMixin, forms.Form):
    def resolve(self, data: dict[str, Any]) -> dict[str, Any]:
        """The looked-up instances, by field name; raises the action's HostingError."""
        raise NotImplementedError

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            data.update(self.resolve(data))
        except ActionError as exc:
            self.add_action_error(exc)
        return data

    def page_errors(self) -> dict[str, str]:
        """{field: its message} as the hosting templates show them."""
        return {("model" if name == NON_FIELD_ERRORS else name): str(errors[0]) for name, errors in self.errors.items()}


class RegisterForm(HostingForm):
    """The models page's register form: a completed job of a project the viewer writes in."""

    job = _text()
    name = _text()

    def __init__(self, *args: Any, can_write: Callable[[int], bool], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.can_write = can_write

    def resolve(self, data: dict[str, Any]) -> dict[str, Any]:
        raw = (data.get("job") or "").strip()
        job = TrainingJob.objects.filter(pk=int(raw)).select_related("project").first() if raw.isdigit() else None
        if job is None or not self.can_write(job.project_id):
            raise HostingError("job", "Pick a completed job of a project where you are a scientist or admin.")
        return {"job": job}


class ModelPageForm(HostingForm):
    """A form on a model's page: a version of that model and a review flow of its project
    (or none), resolved the same way for every such form."""

    model_version = _text()
    flow_definition = _text()

    def __init__(self, *args: Any, model: Model, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.model = model

    def version(self, data: dict[str, Any]) -> Any:
        return actions.resolve_model_version(self.model.project, self.model, data.get("model_version"))

    def flow(self, data: dict[str, Any], version: Any) -> Any:
        return actions.flow_in_project(self.model.project, data.get("flow_definition") or None, version)


class DeployForm(ModelPageForm):
    """The deploy form on a model's page: a version of that model, a name, a flow or none."""

    name = _text()

    def resolve(self, data: dict[str, Any]) -> dict[str, Any]:
        version = self.version(data)
        name = actions.endpoint_name(data.get("name"))
        return {"model_version": version, "name": name, "flow_definition": self.flow(data, version)}


class BatchForm(ModelPageForm):
    """The batch form on a model's page: a version of that model, a dataset version of its
    project and a flow or none."""

    dataset_version = _text()

    def resolve(self, data: dict[str, Any]) -> dict[str, Any]:
        version = self.version(data)
        dataset_version = actions.dataset_version_in_project(self.model.project, data.get("dataset_version"))
        return {"model_version": version, "dataset_version": dataset_version, "flow_definition": self.flow(data, version)}


class EndpointSettingsForm(HostingForm):
    """The settings form on an endpoint's page. The form always sends its version choice;
    a request without one keeps the version served (never "the latest", which would switch
    versions nobody picked): `model_version` is then actions.UNSET."""

    model_version = _text()
    flow_definition = _text()

    def __init__(self, *args: Any, endpoint: Endpoint, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.endpoint = endpoint

    def resolve(self, data: dict[str, Any]) -> dict[str, Any]:
        endpoint = self.endpoint
        wanted = (data.get("model_version") or "").strip()
        version = (actions.resolve_model_version(endpoint.project, endpoint.model_version.model, wanted)
                   if wanted else actions.UNSET)
        served = endpoint.model_version if version is actions.UNSET else version
        flow = actions.flow_in_project(endpoint.project, data.get("flow_definition") or None, served)
        return {"model_version": version, "flow_definition": flow}
