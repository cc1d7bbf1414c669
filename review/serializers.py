"""Review request validation at the edge (shapes, ranges) and response JSON. Checks that
need the database (the team's project and size, members' membership) are in
review.actions.teams."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from rest_framework import serializers

from review.activation import check_activation
from review.consolidation import NO_CONSENSUS
from review.models import Assignment, FlowDefinition, HumanLoop, LoopOrder, TaskType, WorkTeam
from studio.validators import clean_name

MAX_LABELS = 100
MAX_LABEL_LENGTH = 300
MAX_INSTRUCTIONS = 50_000
MAX_AVAILABILITY_SECONDS = 365 * 24 * 3600
MAX_TIME_LIMIT_SECONDS = 24 * 3600
MAX_TASK_COUNT = 100


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


# --- requests -------------------------------------------------------------------------------
class WorkTeamCreateSerializer(serializers.Serializer):
    project = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=5000)
    members = serializers.ListField(child=serializers.CharField(max_length=150), allow_empty=False, max_length=1000)

    def validate_name(self, value: str) -> str:
        return clean_name(value)


class ActivationField(serializers.JSONField):
    def to_internal_value(self, data: Any) -> dict:
        value = super().to_internal_value(data)
        clean, errors = check_activation(value)
        if errors:
            raise serializers.ValidationError([f"{k.split('.', 1)[-1]}: {v}" if k != "activation" else v
                                               for k, v in errors.items()])
        return clean


class FlowDefinitionCreateSerializer(serializers.Serializer):
    project = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    name = serializers.CharField(max_length=200)
    work_team = serializers.IntegerField(min_value=1)
    task_type = serializers.ChoiceField(choices=TaskType.choices, default=TaskType.CLASSIFICATION)
    labels = serializers.ListField(child=serializers.CharField(max_length=MAX_LABEL_LENGTH), required=False,
                                   default=list, max_length=MAX_LABELS)
    title = serializers.CharField(max_length=300)
    instructions = serializers.CharField(required=False, allow_blank=True, default="", max_length=MAX_INSTRUCTIONS,
                                         trim_whitespace=False)
    task_count = serializers.IntegerField(min_value=1, max_value=MAX_TASK_COUNT, default=1)
    task_availability_seconds = serializers.IntegerField(min_value=1, max_value=MAX_AVAILABILITY_SECONDS,
                                                         default=7 * 24 * 3600)
    task_time_limit_seconds = serializers.IntegerField(min_value=1, max_value=MAX_TIME_LIMIT_SECONDS, default=300)
    activation = ActivationField(required=False, default=dict)
    order = serializers.ChoiceField(choices=LoopOrder.choices, default=LoopOrder.OLDEST)
    show_prediction = serializers.BooleanField(default=True)

    def validate_name(self, value: str) -> str:
        return clean_name(value)

    def validate_title(self, value: str) -> str:
        return clean_name(value)

    def validate_labels(self, value: list[str]) -> list[str]:
        labels = [label.strip() for label in value]
        if any(not label for label in labels):
            raise serializers.ValidationError("Labels may not be blank.")
        if NO_CONSENSUS in labels:
            raise serializers.ValidationError(f"\"{NO_CONSENSUS}\" is reserved for loops whose reviewers disagree.")
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise serializers.ValidationError(f"Duplicate labels: {', '.join(duplicates)}.")
        return labels

    def validate(self, attrs: dict) -> dict:
        if not attrs.get("activation"):
            attrs["activation"] = check_activation({})[0]
        if attrs["task_type"] == TaskType.CLASSIFICATION:
            if len(attrs.get("labels") or []) < 2:
                raise serializers.ValidationError({"labels": "A classification flow needs at least two labels."})
        elif attrs.get("labels"):
            raise serializers.ValidationError({"labels": "A free_text flow takes no labels."})
        return attrs


class HumanLoopCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=128)
    flow_definition = serializers.IntegerField(min_value=1)
    input_content = serializers.JSONField()
    prediction = serializers.JSONField(required=False, allow_null=True, default=None)

    def validate_input_content(self, value: Any) -> dict:
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return value

    def validate_prediction(self, value: Any) -> dict | None:
        if value is not None and not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object {\"label\", \"confidence\", \"probabilities\"}.")
        return value


class ClaimSerializer(serializers.Serializer):
    flow_definition = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)


class AnswerSerializer(serializers.Serializer):
    answer = serializers.JSONField()


class ExportSerializer(serializers.Serializer):
    dataset = serializers.CharField(max_length=200, required=False, allow_blank=True, allow_null=True, default=None,
                                    help_text="reviewed_only: the dataset to add a version to (default <flow>-reviewed). "
                                              "merged: the training dataset, so leave it empty.")
    mode = serializers.ChoiceField(choices=["merged", "reviewed_only"], required=False, allow_null=True, default=None,
                                   help_text="merged (the default when the loops came from a registered model's job): "
                                             "the next version of that job's training dataset, the reviewed records "
                                             "merged in; reviewed_only: the reviewed records alone.")

    def validate_dataset(self, value: str | None) -> str | None:
        return clean_name(value) if value else None


# --- responses ------------------------------------------------------------------------------
def work_team_json(team: WorkTeam, members: list[str] | None = None) -> dict:
    if members is None:
        members = sorted(team.members.values_list("username", flat=True))
    return {"id": team.pk, "project": team.project.slug, "name": team.name, "description": team.description,
            "members": members, "created_at": iso(team.created_at)}


def flow_json(flow: FlowDefinition) -> dict:
    return {
        "id": flow.pk, "project": flow.project.slug, "name": flow.name,
        "work_team": {"id": flow.work_team_id, "name": flow.work_team.name},
        "task_type": flow.task_type, "labels": flow.labels, "title": flow.title,
        "instructions": flow.instructions, "instructions_html": flow.instructions_html,
        "task_count": flow.task_count, "task_availability_seconds": flow.task_availability_seconds,
        "task_time_limit_seconds": flow.task_time_limit_seconds, "activation": flow.activation,
        "calibration": flow.calibration or None,
        "order": flow.order, "show_prediction": flow.show_prediction,
        "created_by": flow.created_by.username if flow.created_by_id and flow.created_by else None,
        "created_at": iso(flow.created_at),
    }


def loop_json(loop: HumanLoop, *, answers: list[Assignment] | None = None) -> dict:
    body = {
        "name": loop.name, "project": loop.project.slug,
        "flow_definition": {"id": loop.flow_definition_id, "name": loop.flow_definition.name},
        "status": loop.status, "failure_reason": loop.failure_reason,
        "input_content": loop.input_content, "prediction": loop.prediction, "confidence": loop.confidence,
        "activation_reason": loop.activation_reason, "source": loop.source, "model_version": loop.model_version_id,
        "answers_needed": loop.answers_needed, "answers_count": loop.answers_count,
        "holds_count": loop.holds_count, "open_slots": loop.open_slots, "escalations": loop.escalations,
        "consolidated_label": loop.consolidated_label, "agreement": loop.agreement, "output_uri": loop.output_uri,
        "output_url": f"/api/v1/human-loops/{quote(loop.name, safe='')}/output" if loop.output_uri else None,
        "created_at": iso(loop.created_at), "expires_at": iso(loop.expires_at),
        "completed_at": iso(loop.completed_at),
    }
    if answers is not None:
        body["human_answers"] = [{"worker": a.worker.username, "answer": a.answer, "answered_at": iso(a.answered_at),
                                  "time_spent_seconds": a.time_spent_seconds} for a in answers]
    return body


def claim_json(assignment: Assignment) -> dict:
    loop = assignment.loop
    flow = loop.flow_definition
    prediction = None
    if flow.show_prediction and isinstance(loop.prediction, dict):
        prediction = {"label": loop.prediction.get("label"), "confidence": loop.prediction.get("confidence")}
    return {
        "assignment": assignment.pk,
        "human_loop": loop.name,
        "flow_definition": {"id": flow.pk, "name": flow.name, "title": flow.title, "task_type": flow.task_type},
        "input_content": loop.input_content,
        "labels": flow.labels,
        "instructions": flow.instructions_html,
        "prediction": prediction,
        "lease_expires_at": iso(assignment.lease_expires_at),
        "task_time_limit_seconds": flow.task_time_limit_seconds,
        "claimed_at": iso(assignment.claimed_at),
    }
