"""Review endpoints: work teams, flow definitions, human loops (management), the reviewer
API (claim, answer, release), export and retrain."""

from __future__ import annotations

import re

from django.contrib.auth import get_user_model
from django.db.models import Prefetch
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from review.access import (
    flows_visible_to,
    get_flow_for_user,
    get_loop_for_user,
    get_work_team_for_user,
)
from review.actions.answers import answer_slot
from review.actions.claims import claim_in_flows, release_slot, reviewable_flows
from review.actions.loops import start_human_loop, stop_loop
from review.actions.teams import create_flow_definition, create_work_team
from review.export import export_flow, preview_export, retrain_from_export
from review.models import Assignment, AssignmentStatus, FlowDefinition, HumanLoop, LoopStatus, WorkTeam
from review.serializers import (
    AnswerSerializer,
    ClaimSerializer,
    ExportSerializer,
    FlowDefinitionCreateSerializer,
    HumanLoopCreateSerializer,
    WorkTeamCreateSerializer,
    claim_json,
    flow_json,
    loop_json,
    work_team_json,
)
from studio.access import check_role, get_project_for_user
from studio.api import ApiError, PaginatedAPIView, id_param, paginate, project_for_write
from studio.deletion import destroy_schema
from studio.models import Project


# --- work teams -----------------------------------------------------------------------------
class WorkTeamListView(PaginatedAPIView):
    @extend_schema(operation_id="work_teams_list", parameters=[OpenApiParameter("project", str)], responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        teams = WorkTeam.objects.select_related("project").filter(project__in=Project.objects.readable_by(request.user))
        if slug := request.query_params.get("project"):
            teams = teams.filter(project=get_project_for_user(request.user, slug))
        teams = teams.prefetch_related(Prefetch("members", queryset=get_user_model().objects.only("username")))

        def rows(page: list[WorkTeam]) -> list[dict]:
            return [work_team_json(t, sorted(m.username for m in t.members.all())) for t in page]

        return paginate(self, request, teams.order_by("project__slug", "name"), rows)

    @extend_schema(request=WorkTeamCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        serializer = WorkTeamCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = project_for_write(request.user, data["project"])
        usernames = list(dict.fromkeys(data["members"]))
        users = list(get_user_model().objects.filter(username__in=usernames))
        unknown = sorted(set(usernames) - {u.username for u in users})
        if unknown:
            raise ApiError(f"members: Not members of project '{project.slug}': {', '.join(unknown)}.",
                           fields={"members": [f"Not members of project '{project.slug}': {', '.join(unknown)}."]})
        team = create_work_team(project=project, name=data["name"], members=users, user=request.user,
                                        description=data["description"])
        return Response(work_team_json(team), status=status.HTTP_201_CREATED)


class WorkTeamDetailView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, pk: int) -> Response:
        return Response(work_team_json(get_work_team_for_user(request.user, pk)))

    @destroy_schema(description="Delete a work team. 409 while a flow uses it (the message names the flow).")
    def delete(self, request: Request, pk: int) -> Response:
        from review.deletion import delete_work_team

        delete_work_team(get_work_team_for_user(request.user, pk, write=True))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- flow definitions -----------------------------------------------------------------------
class FlowDefinitionListView(PaginatedAPIView):
    @extend_schema(operation_id="flow_definitions_list", parameters=[OpenApiParameter("project", str)],
                   responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        flows = flows_visible_to(request.user).select_related("project", "work_team", "created_by")
        if slug := request.query_params.get("project"):
            project = Project.objects.filter(slug=slug).first()
            if project is None:
                raise Http404(f"No project '{slug}'.")
            flows = flows.filter(project=project)
        return paginate(self, request, flows.order_by("project__slug", "name"),
                        lambda page: [flow_json(f) for f in page])

    @extend_schema(request=FlowDefinitionCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        serializer = FlowDefinitionCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        team = (WorkTeam.objects.select_related("project")
                .filter(pk=data["work_team"], project__in=Project.objects.readable_by(request.user)).first())
        if team is None:
            raise ApiError("work_team: No such work team.", fields={"work_team": ["No such work team."]})
        if data.get("project") and data["project"] != team.project.slug:
            raise ApiError("work_team: The work team belongs to another project.",
                           fields={"work_team": ["The work team belongs to another project."]})
        project = project_for_write(request.user, team.project.slug)
        data["work_team"] = team
        flow = create_flow_definition(project=project, user=request.user, data=data)
        return Response(flow_json(flow), status=status.HTTP_201_CREATED)


class FlowDefinitionDetailView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, pk: int) -> Response:
        return Response(flow_json(get_flow_for_user(request.user, pk)))

    @destroy_schema(description="Delete a flow with its review items, their answers and output JSON. 409 while an "
                    "endpoint or a running batch prediction sends items to it (the message names it).")
    def delete(self, request: Request, pk: int) -> Response:
        from review.deletion import delete_flow

        delete_flow(get_flow_for_user(request.user, pk, write=True))
        return Response(status=status.HTTP_204_NO_CONTENT)


class FlowDefinitionExportView(APIView):
    @extend_schema(request=ExportSerializer, responses={201: OpenApiTypes.OBJECT, 200: OpenApiTypes.OBJECT})
    def post(self, request: Request, pk: int) -> Response:
        from datasets.serializers import DatasetVersionSerializer

        flow = get_flow_for_user(request.user, pk, write=True)
        serializer = ExportSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        version = export_flow(flow, request.user, serializer.validated_data["dataset"],
                                      serializer.validated_data.get("mode"))
        if getattr(version, "export_unchanged", False):
            reason = (f"{version.dataset.name} v{version.version} already holds exactly this export; "
                      "no new version was made.")
            return Response({**DatasetVersionSerializer(version).data, "unchanged": True, "reason": reason})
        return Response(DatasetVersionSerializer(version).data, status=status.HTTP_201_CREATED)


class FlowDefinitionExportPreviewView(APIView):
    """What an export would make (the flow page's confirm dialog): nothing is written."""

    @extend_schema(parameters=[OpenApiParameter("mode", str, enum=["merged", "reviewed_only"]),
                               OpenApiParameter("dataset", str)],
                   responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: int) -> Response:
        flow = get_flow_for_user(request.user, pk, write=True)
        serializer = ExportSerializer(data={k: v for k, v in request.query_params.items() if k in ("mode", "dataset")})
        serializer.is_valid(raise_exception=True)
        body = preview_export(flow, serializer.validated_data.get("mode"),
                                      serializer.validated_data["dataset"])
        return Response(body)


class RetrainView(APIView):
    @extend_schema(request=None, responses={201: OpenApiTypes.OBJECT})
    def post(self, request: Request, pk: int) -> Response:
        from datasets.api import get_version_for_user
        from jobs.api import job_detail_queryset
        from jobs.serializers import JobSerializer

        version = get_version_for_user(request.user, pk, write=True)
        job = retrain_from_export(version, request.user)
        return Response(JobSerializer(job_detail_queryset().get(pk=job.pk)).data, status=status.HTTP_201_CREATED)


# --- human loops ----------------------------------------------------------------------------
def loop_queryset():
    return HumanLoop.objects.select_related("project", "flow_definition")


class HumanLoopListView(PaginatedAPIView):
    @extend_schema(operation_id="human_loops_list", parameters=[OpenApiParameter(n, str) for n in ("flow_definition", "status", "project")],
                   responses=OpenApiTypes.OBJECT)
    def get(self, request: Request) -> Response:
        loops = loop_queryset().filter(project__in=Project.objects.readable_by(request.user))
        params = request.query_params
        if slug := params.get("project"):
            loops = loops.filter(project=get_project_for_user(request.user, slug))
        if (flow_id := id_param(params, "flow_definition")) is not None:
            loops = loops.filter(flow_definition_id=flow_id)
        if wanted := params.get("status"):
            statuses = wanted.split(",")
            unknown = sorted(set(statuses) - set(LoopStatus.values))
            if unknown:
                message = f"Unknown status {', '.join(unknown)}; use {', '.join(LoopStatus.values)}."
                raise ApiError(f"status: {message}", fields={"status": [message]})
            loops = loops.filter(status__in=statuses)
        return paginate(self, request, loops.order_by("-created_at", "-id"), lambda page: [loop_json(x) for x in page])

    @extend_schema(request=HumanLoopCreateSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        serializer = HumanLoopCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        flow = (FlowDefinition.objects.select_related("project")
                .filter(pk=data["flow_definition"], project__in=Project.objects.readable_by(request.user)).first())
        if flow is None:
            raise ApiError("flow_definition: No such flow definition.",
                           fields={"flow_definition": ["No such flow definition."]})
        check_role(request.user, flow.project, write=True)
        loop = start_human_loop(name=data["name"], flow=flow, input_content=data["input_content"],
                                        user=request.user, prediction=data["prediction"])
        return Response(loop_json(loop_queryset().get(pk=loop.pk), answers=[]), status=status.HTTP_201_CREATED)


def loop_detail(loop: HumanLoop) -> dict:
    answers = list(Assignment.objects.filter(loop=loop, status=AssignmentStatus.ANSWERED)
                   .select_related("worker").order_by("answered_at", "id"))
    return loop_json(loop, answers=answers)


class HumanLoopDetailView(APIView):
    @extend_schema(responses=OpenApiTypes.OBJECT)
    def get(self, request: Request, name: str) -> Response:
        return Response(loop_detail(get_loop_for_user(request.user, name)))


class HumanLoopStopView(APIView):
    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, name: str) -> Response:
        loop = get_loop_for_user(request.user, name, write=True)
        stop_loop(loop, request.user)
        return Response(loop_detail(loop_queryset().get(pk=loop.pk)))


class HumanLoopOutputView(APIView):
    """The loop's output JSON (A2I's shape), streamed from the object store (or a presigned
    S3 link); written shortly after the loop completes, so 409 until then."""

    @extend_schema(operation_id="human_loops_output_download",
                   responses={(200, "application/json"): OpenApiTypes.BINARY})
    def get(self, request: Request, name: str):
        from datasets.storage import download_response

        loop = get_loop_for_user(request.user, name)
        if not loop.output_uri:
            raise ApiError(f"Human loop {loop.name} is {loop.status}: its output JSON is written once it is Completed.",
                           code="not_ready", status_code=409)
        return download_response(loop.output_uri, f"{loop.name}-output.json", "application/json")


# --- the reviewer API -----------------------------------------------------------------------
def _body_object(request: Request) -> dict:
    data = request.data
    if not isinstance(data, dict):
        raise ApiError("The body must be a JSON object.")
    return data


MAX_ID = 2**63 - 1


def _claim_flow_id(data: dict) -> int | None:
    """The optional flow_definition of a claim: a positive integer (or a string of one)."""
    value = data.get("flow_definition")
    if value is None or value == "":
        return None
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value.strip()):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        message = "A valid integer is required."
    elif value < 1:
        message = "Ensure this value is greater than or equal to 1."
    elif value > MAX_ID:  # past what an id column holds (SQLite: OverflowError, a 500)
        message = f"Ensure this value is less than or equal to {MAX_ID}."
    else:
        return value
    raise ApiError(f"flow_definition: {message}", fields={"flow_definition": [message]})


class ClaimView(APIView):
    """Lean on purpose (every reviewer's hot path): no serializer; the user's flows read
    with one plain statement, and on PostgreSQL the claim is one statement that returns
    what the reviewer is shown (review.actions.claims.claim_in_flows)."""

    @extend_schema(request=ClaimSerializer, responses={200: OpenApiTypes.OBJECT, 204: None})
    def post(self, request: Request) -> Response:
        flow_id = _claim_flow_id(_body_object(request))
        flows = reviewable_flows(request.user, flow_id)
        if flow_id is not None and not flows:
            raise Http404("No such flow definition.")
        assignment = claim_in_flows(request.user, flows)
        if assignment is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(claim_json(assignment))


class AnswerView(APIView):
    @extend_schema(request=AnswerSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, pk: int) -> Response:
        data = _body_object(request)
        if "answer" not in data:
            raise ApiError("answer: This field is required.", fields={"answer": ["This field is required."]})
        assignment = answer_slot(pk, request.user, data["answer"])
        return Response({"assignment": assignment.pk, "status": assignment.status,
                         "human_loop": assignment.loop.name, "loop_status": assignment.loop.status})


class ReleaseView(APIView):
    @extend_schema(request=None, responses={200: OpenApiTypes.OBJECT})
    def post(self, request: Request, pk: int) -> Response:
        assignment = release_slot(pk, request.user)
        return Response({"assignment": assignment.pk, "status": assignment.status,
                         "human_loop": assignment.loop.name})
