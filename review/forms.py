"""Browser forms for a work team and a review flow. They only collect the fields: the flow
is checked by the API's own serializer (review.serializers.FlowDefinitionCreateSerializer)
and both are written by the same actions as the API, so the page and automation share one
set of rules and messages."""

from __future__ import annotations

import re

from django import forms

from review.models import LoopOrder, TaskType, WorkTeam
from studio.forms import ActionFormMixin

LABEL_SPLIT = re.compile(r"[\n,]")
# Serializer field names that do not exist on the form map to the closest form field.
FLOW_FIELD_FOR = {"activation": "confidence_below", "project": "work_team"}


class WorkTeamForm(ActionFormMixin, forms.Form):
    project = forms.ChoiceField()
    name = forms.CharField(max_length=200)
    members = forms.CharField(
        help_text="Usernames, separated by commas or spaces. Each must belong to the project (any role; reviewers "
                  "see only the inbox).")
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))

    def __init__(self, *args, projects: list, **kwargs):
        super().__init__(*args, **kwargs)
        project = self.fields["project"]
        assert isinstance(project, forms.ChoiceField)
        project.choices = [(p.slug, p.name) for p in projects]

    def clean_members(self) -> list[str]:
        names = [name for name in re.split(r"[\s,]+", self.cleaned_data["members"]) if name]
        if not names:
            raise forms.ValidationError("Name at least one member.")
        return sorted(set(names))


class WorkTeamChoiceField(forms.ModelChoiceField):
    """A work team named with its project, since teams of two projects may share a name."""

    def label_from_instance(self, obj: WorkTeam) -> str:
        return f"{obj.name} ({obj.project.slug})"


class FlowForm(ActionFormMixin, forms.Form):
    action_field_for = FLOW_FIELD_FOR
    work_team = WorkTeamChoiceField(queryset=WorkTeam.objects.none(), empty_label=None,
                                    help_text="Its members answer this flow's items in their inbox.")
    name = forms.CharField(max_length=200, help_text="Unique in the project; the API and loop names use it.")
    title = forms.CharField(max_length=300, help_text="What reviewers see at the top of each item.")
    task_type = forms.ChoiceField(choices=[(TaskType.CLASSIFICATION, "Classification: pick a label"),
                                           (TaskType.FREE_TEXT, "Free text: write an answer")],
                                  initial=TaskType.CLASSIFICATION, widget=forms.RadioSelect)
    labels = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                             help_text="One per line (or comma separated), in the order keys 1–9 pick them.")
    instructions = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 5}),
                                   help_text="Markdown. Shown with every item; scripts and unsafe HTML are removed.")
    task_count = forms.IntegerField(initial=1, help_text="Reviewers per item; a tie asks up to two more.")
    task_time_limit_seconds = forms.IntegerField(initial=300, label="Lease (seconds)",
                                                 help_text="How long a reviewer holds an item before it goes back.")
    task_availability_seconds = forms.IntegerField(initial=7 * 24 * 3600, label="Available for (seconds)",
                                                   help_text="After this an unanswered item expires.")
    confidence_below = forms.FloatField(required=False, initial=0.8, label="Send when confidence is below",
                                        help_text="0–1; leave empty to not use confidence.")
    sample_percent = forms.FloatField(required=False, initial=0, label="And a random sample of (%)",
                                      help_text="0–100 of the other predictions, for auditing.")
    combine = forms.ChoiceField(choices=[("any", "either condition"), ("all", "both conditions")], initial="any",
                                label="Send on")
    order = forms.ChoiceField(choices=[(LoopOrder.OLDEST, "Oldest first"),
                                       (LoopOrder.LEAST_CONFIDENT, "Least confident first")], initial=LoopOrder.OLDEST)
    show_prediction = forms.BooleanField(required=False, initial=True, label="Show reviewers the model's label")

    def __init__(self, *args, teams, **kwargs):
        super().__init__(*args, **kwargs)
        work_team = self.fields["work_team"]
        assert isinstance(work_team, WorkTeamChoiceField)
        work_team.queryset = teams

    def api_data(self) -> dict:
        """The cleaned fields in the shape POST /api/v1/flow-definitions/ takes."""
        data = self.cleaned_data
        labels = [label.strip() for label in LABEL_SPLIT.split(data.get("labels") or "") if label.strip()]
        activation = {"confidence_below": data.get("confidence_below"),
                      "sample_percent": data.get("sample_percent") or 0, "combine": data.get("combine") or "any"}
        return {
            "project": data["work_team"].project.slug, "name": data["name"], "work_team": data["work_team"].pk,
            "task_type": data["task_type"], "labels": labels, "title": data["title"],
            "instructions": data.get("instructions") or "", "task_count": data["task_count"],
            "task_availability_seconds": data["task_availability_seconds"],
            "task_time_limit_seconds": data["task_time_limit_seconds"], "activation": activation,
            "order": data["order"], "show_prediction": bool(data.get("show_prediction")),
        }
