"""Work teams and the flow definitions that send their items to them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction

from review.errors import ReviewError
from review.markdown import render_instructions
from review.models import FlowDefinition, WorkTeam
from studio.models import Membership


def create_work_team(*, project, name: str, members: Sequence, user: User, description: str = "") -> WorkTeam:
    """A team of the project's members. Members must belong to the project (any role)."""
    member_ids = {m.pk for m in members}
    in_project = set(Membership.objects.filter(project=project, user_id__in=member_ids).values_list("user_id", flat=True))
    outside = [m.username for m in members if m.pk not in in_project]
    if outside:
        raise ReviewError("members", f"Not members of project '{project.slug}': {', '.join(sorted(outside))}.")
    try:
        with transaction.atomic():
            team = WorkTeam.objects.create(project=project, name=name, description=description, created_by=user)
            team.members.set(members)
    except IntegrityError as exc:
        raise ReviewError("name", f"A work team named '{name}' already exists in this project.", status=409) from exc
    return team


def create_flow_definition(*, project, user: User, data: dict[str, Any]) -> FlowDefinition:
    """A flow from validated serializer data (shapes are checked there; here what needs
    the database: the team and its size)."""
    team = data["work_team"]
    if team.project_id != project.pk:
        raise ReviewError("work_team", "The work team belongs to another project.")
    size = team.members.count()
    task_count = data.get("task_count", 1)
    if task_count > size:
        raise ReviewError("task_count", f"Must be at most the work team's size ({size} member{'s' if size != 1 else ''}).")
    instructions = data.get("instructions", "")
    fields = {k: v for k, v in data.items() if k in {
        "task_type", "labels", "title", "task_count", "task_availability_seconds", "task_time_limit_seconds",
        "activation", "order", "show_prediction"}}
    try:
        with transaction.atomic():
            return FlowDefinition.objects.create(project=project, name=data["name"], work_team=team,
                                                 instructions=instructions,
                                                 instructions_html=render_instructions(instructions),
                                                 created_by=user, **fields)
    except IntegrityError as exc:
        raise ReviewError("name", f"A flow definition named '{data['name']}' already exists in this project.",
                          status=409) from exc


def set_flow_threshold(flow: FlowDefinition, *, threshold: float, record: dict[str, Any],
                       combine: str | None = None) -> FlowDefinition:
    """Route the flow's predictions at `threshold` (activation.confidence_below) and record
    where it came from (`record`: the evaluation, temperature, target, choice, expected
    figures; FlowDefinition.calibration). One UPDATE: the endpoints and batches that read
    the flow next use it; loops already started are unchanged. The audit sample stays as it
    was (it is what measures the threshold later); `combine` is changed only when given."""
    if not 0 <= threshold <= 1:
        raise ReviewError("threshold", f"Must be from 0 to 1, got {threshold}.")
    activation = {"confidence_below": None, "sample_percent": 0.0, "combine": "any", **(flow.activation or {})}
    activation["confidence_below"] = float(threshold)
    if combine is not None:
        activation["combine"] = combine
    with transaction.atomic():
        FlowDefinition.objects.filter(pk=flow.pk).update(activation=activation, calibration=record)
    flow.activation, flow.calibration = activation, record
    return flow
