"""Delete on the flow page and the work teams' list (studio.deletion_pages; rules in review.deletion)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from review.access import get_flow_for_user, get_work_team_for_user
from review.deletion import delete_flow, delete_work_team, flow_deletion_plan, team_deletion_plan
from studio.access import signed_in
from studio.deletion_pages import confirm_or_delete
from studio.views import page


@page
def flow_delete(request: HttpRequest, pk: int) -> HttpResponse:
    flow = get_flow_for_user(signed_in(request.user), pk, write=True)
    return confirm_or_delete(request, plan=lambda: flow_deletion_plan(flow), delete=lambda: delete_flow(flow),
                             back_url=reverse("review-flow", args=[pk]), done_url=reverse("review-flows"),
                             noun=f"flow {flow.name}")


@page
def team_delete(request: HttpRequest, pk: int) -> HttpResponse:
    team = get_work_team_for_user(signed_in(request.user), pk, write=True)
    back = reverse("review-flows")
    return confirm_or_delete(request, plan=lambda: team_deletion_plan(team), delete=lambda: delete_work_team(team),
                             back_url=back, done_url=back, noun=f"work team {team.name}")
