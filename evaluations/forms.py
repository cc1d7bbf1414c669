"""The evaluation pages' forms. Fields are plain strings: the actions check every value
(one validation for the pages and the API), and their EvaluationError comes back on the
field it names (studio.forms.ActionFormMixin). Each form turns its cleaned strings into
the action's body: a field left empty is left out, so the action's default applies,
except where empty means "none" (no flow, no costs)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS

from studio.forms import ActionFormMixin


def _text() -> forms.CharField:
    return forms.CharField(required=False)


class EvaluationPageForm(ActionFormMixin, forms.Form):
    # Fields left out of the body when empty (the action's default then applies).
    optional: tuple[str, ...] = ()
    # Fields sent even when empty: "" is the action's "none".
    always: tuple[str, ...] = ()

    def body(self) -> dict[str, Any]:
        data = self.cleaned_data
        body = {name: data[name] for name in self.optional if data.get(name) not in (None, "")}
        body.update({name: data.get(name) or "" for name in self.always})
        return body

    def page_errors(self) -> dict[str, str]:
        """{field: its first message}; the form's own (non-field) message under "form"."""
        return {("form" if name == NON_FIELD_ERRORS else name): str(errors[0]) for name, errors in self.errors.items()}


class NewEvaluationForm(EvaluationPageForm):
    """/evaluations/new/: a model version over a ready dataset version of its project."""

    model_version = _text()
    dataset_version = _text()
    channel = _text()
    target_error = _text()
    flow_definition = _text()
    calibration_fraction = _text()

    optional = ("model_version", "dataset_version", "channel", "target_error", "flow_definition", "calibration_fraction")


class ProposeForm(EvaluationPageForm):
    """A new threshold proposal from the stored scores (evaluations.actions.propose)."""

    target_error = _text()
    delta = _text()
    flow_definition = _text()
    review_cost = _text()
    error_cost = _text()

    optional = ("target_error", "delta")
    always = ("flow_definition", "review_cost", "error_cost")


class ActivateForm(EvaluationPageForm):
    """Apply a proposal's threshold to a classification flow of the project
    (evaluations.actions.activate_flow): the flow is resolved by the view."""

    flow_definition = _text()
    choice = forms.ChoiceField(choices=[("risk", "risk"), ("cost", "cost")], initial="risk")


class CalibrateForm(EvaluationPageForm):
    """Serve the evaluation's calibration on its model version
    (evaluations.actions.calibrate_model_version)."""

    method = forms.ChoiceField(choices=[("temperature", "temperature"), ("isotonic", "isotonic"), ("none", "none")],
                               initial="temperature")
