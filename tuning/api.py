"""Tuning job endpoints: create, list, read, stop."""

from __future__ import annotations

from django.db.models import Count, Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import TrainingJob
from studio.access import get_project_for_user
from studio.api import PaginatedAPIView, paginate, project_for_write
from studio.deletion import ARCHIVED_PARAMETER, destroy_schema, wants_archived
from studio.models import Project
from tuning import actions
from tuning.access import get_tuning_job_for_user
from tuning.models import TuningJob
from tuning.serializers import (
    TrialSerializer,
    TuningJobCreateSerializer,
    TuningJobSerializer,
    TuningJobSummarySerializer,
    trial_counts,
)

# What the detail reads of every trial: the fields its rows show, so none is fetched per trial.
TRIAL_FIELDS = (*TrialSerializer.Meta.fields, "tuning_job_id")


def tuning_queryset():
    return TuningJob.objects.select_related("project", "created_by", "best_trial")


def detail(tuning_job_id: int) -> dict:
    tuning = tuning_queryset().prefetch_related(
        Prefetch("warm_start_from", queryset=TuningJob.objects.only("pk"))).get(pk=tuning_job_id)
    trials = list(TrainingJob.objects.filter(tuning_job_id=tuning_job_id).only(*TRIAL_FIELDS).order_by("trial_number"))
    return TuningJobSerializer(tuning, context={"trials": trials}).data


def counts_by_tuning_job(ids: list[int]) -> dict[int, dict[str, int]]:
    rows: dict[int, list[tuple[str, str, int]]] = {}
    grouped = (TrainingJob.objects.filter(tuning_job_id__in=ids).order_by().values("tuning_job_id", "status", "stop_reason")
               .annotate(count=Count("id")))
    for row in grouped:
        rows.setdefault(row["tuning_job_id"], []).append((row["status"], row["stop_reason"], row["count"]))
    return {pk: trial_counts(found) for pk, found in rows.items()}


class TuningJobListView(PaginatedAPIView):
    @extend_schema(parameters=[OpenApiParameter(name, str) for name in ("project", "status", "search")] + [ARCHIVED_PARAMETER],
                   responses=TuningJobSummarySerializer(many=True))
    def get(self, request: Request) -> Response:
        tunings = tuning_queryset().filter(project__in=Project.objects.readable_by(request.user))
        params = request.query_params
        if not wants_archived(params):
            tunings = tunings.filter(archived_at__isnull=True)
        if slug := params.get("project"):
            tunings = tunings.filter(project=get_project_for_user(request.user, slug))
        if wanted := params.get("status"):
            tunings = tunings.filter(status__in=wanted.split(","))
        if search := params.get("search"):
            tunings = tunings.filter(name__icontains=search)

        def rows(page: list[TuningJob]) -> list:
            counts = counts_by_tuning_job([t.pk for t in page])
            return TuningJobSummarySerializer(page, many=True, context={"trial_counts": counts}).data

        return paginate(self, request, tunings.order_by("-created_at", "-pk"), rows)

    @extend_schema(request=TuningJobCreateSerializer, responses={201: TuningJobSerializer})
    def post(self, request: Request) -> Response:
        serializer = TuningJobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = project_for_write(request.user, serializer.validated_data["project"])
        tuning = actions.create_tuning_job(project=project, user=request.user, data=serializer.validated_data)
        return Response(detail(tuning.pk), status=status.HTTP_201_CREATED)


class TuningJobDetailView(APIView):
    @extend_schema(responses=TuningJobSerializer)
    def get(self, request: Request, pk: int) -> Response:
        get_tuning_job_for_user(request.user, pk)
        return Response(detail(pk))

    @destroy_schema(kept=TuningJobSerializer, description="Delete a finished search with its trials, their metrics "
                    "and stored outputs; a search a registered model came from is archived with its trials (200).")
    def delete(self, request: Request, pk: int) -> Response:
        from tuning.deletion import delete_tuning_job

        tuning = get_tuning_job_for_user(request.user, pk, write=True)
        outcome, _ = delete_tuning_job(tuning)
        if outcome == "archived":
            return Response(detail(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TuningJobStopView(APIView):
    @extend_schema(request=None, responses={202: TuningJobSerializer})
    def post(self, request: Request, pk: int) -> Response:
        tuning = get_tuning_job_for_user(request.user, pk, write=True)
        actions.stop_tuning_job(tuning)
        return Response(detail(pk), status=status.HTTP_202_ACCEPTED)
