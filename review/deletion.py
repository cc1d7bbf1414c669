"""Deleting flow definitions and work teams (studio.deletion has the machinery).

Rules:
- a flow an endpoint sends items to is refused, naming the endpoint (detach the flow from
  it first); so is one a running batch prediction sends items to;
- a flow's items go with it, those still waiting for reviewers included (the confirm
  says how many, and how many a reviewer holds right now), with their answers and their
  output JSON in the store; exported dataset versions stay (they are datasets now);
- a work team a flow uses is refused, naming the flow.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import ProtectedError
from django.urls import reverse

from review.models import Assignment, AssignmentStatus, FlowDefinition, HumanLoop, LoopStatus, WorkTeam
from studio.deletion import Blocker, DeletionBlocked, DeletionPlan, count_objects, plural, record_objects


def flow_url(flow: FlowDefinition) -> str:
    return reverse("review-flow", args=[flow.pk])


def flow_outputs_uri(flow: FlowDefinition) -> str:
    """Where the flow's loops write their output JSON (review.output.output_key)."""
    from datasets.storage import object_uri

    return object_uri(f"review/{flow.project.slug}/flows/{flow.pk}")


def flow_deletion_plan(flow: FlowDefinition) -> DeletionPlan:
    from hosting.models import BatchPrediction, BatchStatus, Endpoint

    plan = DeletionPlan(what=f"flow {flow.pk} '{flow.name}'")
    for endpoint in Endpoint.objects.filter(flow_definition=flow).order_by("name"):
        plan.blockers.append(Blocker(
            f"Endpoint '{endpoint.name}' sends items to flow '{flow.name}': detach the flow from it first.",
            name=endpoint.name, url=reverse("endpoint-detail", args=[endpoint.name])))
    running = BatchPrediction.objects.filter(flow_definition=flow, status__in=[BatchStatus.PENDING, BatchStatus.RUNNING])
    for batch in running.select_related("model_version"):
        plan.blockers.append(Blocker(
            f"Batch prediction {batch.pk} is {batch.status} and sends items to flow '{flow.name}': wait for it to finish.",
            name=f"batch prediction {batch.pk}", url=reverse("model-detail", args=[batch.model_version.model_id])))
    loops = HumanLoop.objects.filter(flow_definition=flow)
    waiting = loops.filter(status=LoopStatus.IN_PROGRESS).count()
    held = Assignment.objects.filter(loop__flow_definition=flow, status=AssignmentStatus.HELD).count()
    answers = Assignment.objects.filter(loop__flow_definition=flow, status=AssignmentStatus.ANSWERED).count()
    outputs = flow_outputs_uri(flow)
    files, _ = count_objects(outputs)
    plan.goes = [plural(loops.count(), "review item"), plural(answers, "answer"), plural(files, "review output file")]
    if waiting:
        plan.goes.append(f"{plural(waiting, 'item')} still waiting for reviewers"
                         + (f" ({held} held by a reviewer right now)" if held else ""))
    plan.uris = [outputs]
    return plan


def delete_flow(flow: FlowDefinition) -> None:
    with transaction.atomic():
        flow = FlowDefinition.objects.select_for_update().select_related("project").get(pk=flow.pk)
        plan = flow_deletion_plan(flow)
        if plan.blocked:
            raise DeletionBlocked(plan)
        # Assignments cascade from their loops, loops from the flow.
        flow.delete()
        record_objects(plan.what, plan.uris)


def team_deletion_plan(team: WorkTeam) -> DeletionPlan:
    plan = DeletionPlan(what=f"work team {team.pk} '{team.name}'")
    for flow in FlowDefinition.objects.filter(work_team=team).order_by("name"):
        plan.blockers.append(Blocker(
            f"Work team '{team.name}' reviews for flow '{flow.name}': delete that flow first.",
            name=flow.name, url=flow_url(flow)))
    plan.goes = [f"the team's membership ({plural(team.members.count(), 'member')}; their accounts stay)"]
    return plan


def delete_work_team(team: WorkTeam) -> None:
    with transaction.atomic():
        team = WorkTeam.objects.select_for_update().get(pk=team.pk)
        plan = team_deletion_plan(team)
        if plan.blocked:
            raise DeletionBlocked(plan)
        try:
            team.delete()
        except ProtectedError:  # a flow that took the team after the check
            raise DeletionBlocked(team_deletion_plan(team)) from None
