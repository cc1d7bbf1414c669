"""GET /api/v1/flow-definitions/<id>/stats/: a flow's review statistics (review.stats) for
the project's readers; reviewers and other projects' users get 404 like any flow they
cannot read."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from review.access import get_flow_for_user
from review.models import FlowDefinition
from review.stats import flow_stats
from studio.access import check_role, signed_in

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


def get_flow_for_reader(user: User | AnonymousUser, pk: int) -> FlowDefinition:
    """The flow if the user reads its project (admin, scientist, viewer). Stats and flow
    pages are the project's view of the work: a reviewer, even of this flow's team, gets
    404 like anyone outside the project."""
    flow = get_flow_for_user(signed_in(user), pk)
    check_role(user, flow.project)
    return flow


class FlowStatsView(APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT},
                   description="Backlog, completed per hour (last 24 h), median time to complete, per-reviewer "
                               "throughput, agreement, and model vs. human accuracy with a confusion matrix.")
    def get(self, request: Request, pk: int) -> Response:
        flow = get_flow_for_reader(request.user, pk)
        return Response(flow_stats(flow))
