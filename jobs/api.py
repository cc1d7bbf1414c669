"""Training job endpoints: submit, list, read, stop; algorithms; script uploads."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs import actions
from jobs.access import get_job_for_user
from jobs.models import JobEvent, JobInput, JobRule, JobStatus, TrainingJob
from jobs.scripts import store_script
from jobs.serializers import JobCreateSerializer, JobSerializer, JobSummarySerializer
from jobs.serializers_responses import AlgorithmListSerializer, StoredScriptSerializer
from studio.access import get_project_for_user
from studio.api import ApiError, PaginatedAPIView, id_param, paginate, project_for_write
from studio.deletion import ARCHIVED_PARAMETER, destroy_schema, wants_archived
from studio.models import Project
from studio.parsers import FormParser, MultiPartParser


def job_detail_queryset():
    return TrainingJob.objects.select_related("project", "created_by").prefetch_related(
        Prefetch("inputs", queryset=JobInput.objects.select_related("dataset_version__dataset")),
        Prefetch("events", queryset=JobEvent.objects.order_by("at", "pk")),
        Prefetch("rules", queryset=JobRule.objects.order_by("pk")),
    )


class JobListView(PaginatedAPIView):
    @extend_schema(
        parameters=[OpenApiParameter(name, str) for name in ("project", "status", "algorithm", "tag", "search")]
        + [ARCHIVED_PARAMETER]
        + [OpenApiParameter("dataset", int, description="Jobs that read any version of this dataset")],
        responses=JobSummarySerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        jobs = TrainingJob.objects.filter(project__in=Project.objects.readable_by(request.user)).select_related("project")
        params = request.query_params
        if not wants_archived(params):
            jobs = jobs.filter(archived_at__isnull=True)
        if slug := params.get("project"):
            jobs = jobs.filter(project=get_project_for_user(request.user, slug))
        if wanted := params.get("status"):
            statuses = wanted.split(",")
            if unknown := [value for value in statuses if value not in JobStatus.values]:
                raise ApiError(f"Unknown status {unknown[0]!r}; use one or more of {', '.join(JobStatus.values)}, "
                               "comma-separated.", fields={"status": [f"Unknown status {unknown[0]!r}."]})
            jobs = jobs.filter(status__in=statuses)
        if algorithm := params.get("algorithm"):
            jobs = jobs.filter(algorithm=algorithm)
        if (dataset := id_param(params, "dataset", "Not an integer.")) is not None:
            jobs = jobs.filter(inputs__dataset_version__dataset_id=dataset).distinct()
        if tag := params.get("tag"):
            jobs = jobs.filter(tags__contains=[tag]) if _json_contains_supported() else jobs.filter(tags__icontains=f'"{tag}"')
        if search := params.get("search"):
            jobs = jobs.filter(name__icontains=search)
        return paginate(self, request, jobs.order_by("-created_at"), lambda page: JobSummarySerializer(page, many=True).data)

    @extend_schema(request=JobCreateSerializer, responses={201: JobSerializer})
    def post(self, request: Request) -> Response:
        serializer = JobCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        project = project_for_write(request.user, serializer.validated_data["project"])
        job = actions.submit_job(project=project, user=request.user, data=serializer.validated_data)
        return Response(JobSerializer(job_detail_queryset().get(pk=job.pk)).data, status=status.HTTP_201_CREATED)


def _json_contains_supported() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


class JobDetailView(APIView):
    @extend_schema(responses=JobSerializer)
    def get(self, request: Request, pk: int) -> Response:
        get_job_for_user(request.user, pk)
        return Response(JobSerializer(job_detail_queryset().get(pk=pk)).data)

    @destroy_schema(kept=JobSerializer, description="Delete a finished job with its metrics and stored outputs; a "
                    "job a registered model came from is archived instead (200). A running job: 409, stop it first.")
    def delete(self, request: Request, pk: int) -> Response:
        from jobs.deletion import delete_job

        job = get_job_for_user(request.user, pk, write=True)
        outcome, _ = delete_job(job)
        if outcome == "archived":
            return Response(JobSerializer(job_detail_queryset().get(pk=pk)).data)
        return Response(status=status.HTTP_204_NO_CONTENT)


class JobStopView(APIView):
    @extend_schema(request=None, responses={202: JobSerializer})
    def post(self, request: Request, pk: int) -> Response:
        job = get_job_for_user(request.user, pk, write=True)
        actions.stop_job(job)
        return Response(JobSerializer(job_detail_queryset().get(pk=pk)).data, status=status.HTTP_202_ACCEPTED)


class AlgorithmListView(APIView):
    @extend_schema(responses=AlgorithmListSerializer)
    def get(self, request: Request) -> Response:
        from algorithms import ALGORITHMS

        results = [spec.as_json() for _, spec in sorted(ALGORITHMS.items())]
        return Response({"count": len(results), "next": None, "previous": None, "results": results})


class ScriptUploadView(APIView):
    parser_classes = [MultiPartParser, FormParser]

    @extend_schema(
        request={"multipart/form-data": {"type": "object", "properties": {"project": {"type": "string"},
                                                                        "file": {"type": "string", "format": "binary"}}}},
        responses={201: StoredScriptSerializer},
    )
    def post(self, request: Request) -> Response:
        slug = request.data.get("project") or ""
        if not slug:
            raise ApiError("project: This field is required.", fields={"project": ["This field is required."]})
        project = project_for_write(request.user, slug)
        upload = request.FILES.get("file")
        if upload is None:
            raise ApiError("file: send the script as a multipart part named 'file'.", fields={"file": ["No file was sent."]})
        stored = store_script(project.slug, upload.name, upload.read())
        return Response({"uri": stored.uri, "entry_point": stored.entry_point, "size": stored.size, "sha256": stored.sha256,
                         "files": stored.files}, status=status.HTTP_201_CREATED)
