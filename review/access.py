"""The one access helper per review object type, used by pages and the API alike.

Project readers (admin, scientist, viewer) see their projects' teams, flows and loops;
scientists and admins change them. A reviewer reads only what their work teams review:
the flows (never another team's), and the assignments they hold. Anything else is
reported as missing (404), so a reviewer cannot even learn that it exists."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db.models import Q
from django.http import Http404

from review.models import Assignment, FlowDefinition, HumanLoop, WorkTeam
from studio.access import check_role
from studio.models import Project


def get_work_team_for_user(user: User, pk: int, *, write: bool = False) -> WorkTeam:
    team = WorkTeam.objects.select_related("project").filter(pk=pk).first()
    if team is None:
        raise Http404("No such work team.")
    check_role(user, team.project, write=write)
    return team


def flows_visible_to(user: User):
    """Flows of the projects the user reads, and those their work teams review."""
    if user.is_superuser:
        return FlowDefinition.objects.all()
    return FlowDefinition.objects.filter(
        Q(project__in=Project.objects.readable_by(user)) | Q(work_team__members=user)).distinct()


def get_flow_for_user(user: User, pk: int, *, write: bool = False) -> FlowDefinition:
    """The flow if the user reads its project or reviews for it (write: scientist/admin)."""
    flow = FlowDefinition.objects.select_related("project", "work_team").filter(pk=pk).first()
    if flow is None:
        raise Http404("No such flow definition.")
    if not write and flow.work_team.members.filter(pk=user.pk).exists():
        return flow
    check_role(user, flow.project, write=write)
    return flow


def get_loop_for_user(user: User, name: str, *, write: bool = False) -> HumanLoop:
    """A loop by name for project readers (write: scientist/admin). Reviewers see loops
    only through their own assignments, so a loop name alone gives them nothing."""
    loop = (HumanLoop.objects.select_related("project", "flow_definition", "flow_definition__work_team")
            .filter(name=name).first())
    if loop is None:
        raise Http404("No such human loop.")
    check_role(user, loop.project, write=write)
    return loop


def get_assignment_for_user(user: User, pk: int) -> Assignment:
    """The user's own assignment; anyone else's is missing."""
    assignment = Assignment.objects.select_related("loop", "loop__flow_definition").filter(pk=pk, worker=user).first()
    if assignment is None:
        raise Http404("No such assignment.")
    return assignment
