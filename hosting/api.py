"""Model, endpoint and batch-prediction endpoints (conventions: docs/SPEC.md §6)."""

from __future__ import annotations

import json
import math
from typing import Any

from django.http import Http404, HttpResponse
from django.utils.text import slugify
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from hosting import actions
from hosting.access import get_batch_for_user, get_endpoint_for_user, get_model_for_user
from hosting.actions import UNSET
from hosting.invocation import endpoint_for_invocation, flush_invocation_counts, invoke
from hosting.models import BatchPrediction, BatchStatus, Endpoint, Model, ModelVersion
from studio.access import get_project_for_user
from studio.api import ApiError, PaginatedAPIView, paginate, project_for_write
from studio.deletion import destroy_schema
from studio.models import Project
from studio.parsers import reject_nul

OBJECT = OpenApiTypes.OBJECT


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ApiError("The body must be a JSON object.")
    return request.data


def _required(body: dict[str, Any], *names: str) -> None:
    missing = {name: ["This field is required."] for name in names if body.get(name) in (None, "")}
    if missing:
        raise ApiError(f"{next(iter(missing))}: This field is required.", fields=missing)


# --- representations ---------------------------------------------------------------------------
def version_json(version: ModelVersion) -> dict[str, Any]:
    return {
        "id": version.pk, "model": version.model_id, "version": version.version, "job": version.job_id,
        "artifact_uri": version.artifact_uri, "algorithm": version.algorithm, "kind": version.kind,
        "labels": version.labels, "input_schema": version.input_schema, "metrics": version.metrics,
        "hyperparameters": version.hyperparameters, "dataset_versions": version.dataset_versions,
        "calibration": version.calibration or None, "calibrated": bool((version.calibration or {}).get("method")),
        "created_by": version.created_by.username if version.created_by_id and version.created_by else None,
        "created_at": version.created_at.isoformat(),
        "download_url": f"/api/v1/models/{version.model_id}/versions/{version.version}/download",
    }


def model_json(model: Model, *, versions: list[ModelVersion] | None = None) -> dict[str, Any]:
    latest = versions[0] if versions else model.latest_version()
    body = {"id": model.pk, "project": model.project.slug, "name": model.name, "description": model.description,
            "created_at": model.created_at.isoformat(),
            "latest_version": version_json(latest) if latest else None,
            "endpoints": sorted(Endpoint.objects.filter(model_version__model=model).values_list("name", flat=True))}
    if versions is not None:
        body["versions"] = [version_json(v) for v in versions]
    return body


def endpoint_json(endpoint: Endpoint) -> dict[str, Any]:
    version = endpoint.model_version
    return {
        "name": endpoint.name, "project": endpoint.project.slug,
        "model": {"id": version.model_id, "name": version.model.name},
        "model_version": {"id": version.pk, "version": version.version, "kind": version.kind},
        "flow_definition": endpoint.flow_definition_id, "invocations": endpoint.invocations,
        "created_at": endpoint.created_at.isoformat(), "updated_at": endpoint.updated_at.isoformat(),
        "invocation_url": f"/api/v1/endpoints/{endpoint.name}/invocations",
    }


def batch_json(batch: BatchPrediction) -> dict[str, Any]:
    return {
        "id": batch.pk, "project": batch.project.slug, "model": batch.model_version.model_id,
        "model_version": {"id": batch.model_version_id, "version": batch.model_version.version},
        "dataset_version": batch.dataset_version_id, "flow_definition": batch.flow_definition_id,
        "status": batch.status, "failure_reason": batch.failure_reason, "output_uri": batch.output_uri,
        "records_total": batch.records_total, "records_done": batch.records_done,
        "human_loops_started": batch.human_loops_started, "created_at": batch.created_at.isoformat(),
        "started_at": batch.started_at.isoformat() if batch.started_at else None,
        "finished_at": batch.finished_at.isoformat() if batch.finished_at else None,
        "download_url": (f"/api/v1/batch-predictions/{batch.pk}/download"
                         if batch.status == BatchStatus.COMPLETED and batch.output_uri else None),
    }


def _endpoints():
    return Endpoint.objects.select_related("project", "model_version__model")


# --- models ------------------------------------------------------------------------------------
class ModelListView(PaginatedAPIView):
    @extend_schema(operation_id="models_list", parameters=[OpenApiParameter("project", str)], responses=OBJECT)
    def get(self, request: Request) -> Response:
        models = Model.objects.readable_by(request.user).select_related("project")
        if slug := request.query_params.get("project"):
            models = models.filter(project=get_project_for_user(request.user, slug))
        return paginate(self, request, models.order_by("project__slug", "name"),
                        lambda page: [model_json(m) for m in page])

    @extend_schema(request=OBJECT, responses={201: OBJECT})
    def post(self, request: Request) -> Response:
        body = _body(request)
        _required(body, "project", "name", "job")
        project = project_for_write(request.user, str(body["project"]))
        version = actions.register_model(project=project, name=body["name"], job=body["job"], user=request.user,
                                         description=str(body.get("description") or ""))
        model = version.model
        return Response(model_json(model, versions=list(model.versions.order_by("-version"))),
                        status=status.HTTP_201_CREATED)


class ModelDetailView(APIView):
    @extend_schema(responses=OBJECT)
    def get(self, request: Request, pk: int) -> Response:
        model = get_model_for_user(request.user, pk)
        return Response(model_json(model, versions=list(model.versions.select_related("created_by").order_by("-version"))))

    @destroy_schema(description="Delete a model with its versions and their finished batch predictions. 409 while "
                    "an endpoint serves one of its versions (the message names the endpoint).")
    def delete(self, request: Request, pk: int) -> Response:
        from hosting.deletion import delete_model

        delete_model(get_model_for_user(request.user, pk, write=True))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelVersionDetailView(APIView):
    @extend_schema(responses=OBJECT)
    def get(self, request: Request, pk: int, number: int) -> Response:
        model = get_model_for_user(request.user, pk)
        version = model.versions.select_related("created_by").filter(version=number).first()
        if version is None:
            raise Http404(f"Model '{model.name}' has no version {number}.")
        return Response(version_json(version))

    @destroy_schema(description="Delete a model version with its finished batch predictions. 409 while an endpoint "
                    "serves it (the message names the endpoint) or a batch prediction over it runs.")
    def delete(self, request: Request, pk: int, number: int) -> Response:
        from hosting.deletion import delete_model_version

        model = get_model_for_user(request.user, pk, write=True)
        version = model.versions.filter(version=number).first()
        if version is None:
            raise Http404(f"Model '{model.name}' has no version {number}.")
        delete_model_version(version)
        return Response(status=status.HTTP_204_NO_CONTENT)


def download_version(request, model: Model, number: int) -> HttpResponse:
    """model.tar.gz of a version: streamed from a file:// store, or a short-lived
    presigned link for S3 (the bytes then never pass through the web server)."""
    from datasets.storage import download_response

    version = model.versions.filter(version=number).first()
    if version is None:
        raise Http404(f"Model '{model.name}' has no version {number}.")
    return download_response(version.artifact_uri, f"{slugify(model.name) or 'model'}-v{version.version}-model.tar.gz")


class ModelVersionDownloadView(APIView):
    @extend_schema(responses={(200, "application/gzip"): OpenApiTypes.BINARY})
    def get(self, request: Request, pk: int, number: int) -> HttpResponse:
        return download_version(request, get_model_for_user(request.user, pk), number)


# --- endpoints ---------------------------------------------------------------------------------
class EndpointListView(PaginatedAPIView):
    @extend_schema(operation_id="endpoints_list", parameters=[OpenApiParameter("project", str)], responses=OBJECT)
    def get(self, request: Request) -> Response:
        endpoints = _endpoints().filter(project__in=Project.objects.readable_by(request.user))
        if slug := request.query_params.get("project"):
            endpoints = endpoints.filter(project=get_project_for_user(request.user, slug))
        return paginate(self, request, endpoints.order_by("name"), lambda page: [endpoint_json(e) for e in page])

    @extend_schema(request=OBJECT, responses={201: OBJECT})
    def post(self, request: Request) -> Response:
        body = _body(request)
        _required(body, "project", "name", "model")
        project = project_for_write(request.user, str(body["project"]))
        version = actions.resolve_model_version(project, body["model"], body.get("model_version"))
        endpoint = actions.create_endpoint(project=project, name=body["name"], model_version=version,
                                           flow_definition=body.get("flow_definition"), user=request.user)
        return Response(endpoint_json(_endpoints().get(pk=endpoint.pk)), status=status.HTTP_201_CREATED)


class EndpointDetailView(APIView):
    @extend_schema(responses=OBJECT)
    def get(self, request: Request, name: str) -> Response:
        flush_invocation_counts()  # this process's pending counts, so the figure includes them
        return Response(endpoint_json(get_endpoint_for_user(request.user, name)))

    @extend_schema(request=OBJECT, responses=OBJECT)
    def patch(self, request: Request, name: str) -> Response:
        endpoint = get_endpoint_for_user(request.user, name, write=True)
        body = _body(request)
        version = UNSET
        if "model" in body or "model_version" in body:
            model = body.get("model") or endpoint.model_version.model
            version = actions.resolve_model_version(endpoint.project, model, body.get("model_version"))
        flow = body.get("flow_definition", UNSET)
        actions.update_endpoint(endpoint, model_version=version, flow_definition=flow)
        return Response(endpoint_json(_endpoints().get(pk=endpoint.pk)))

    @destroy_schema(description="Delete an endpoint: its invocation URL stops answering. The review items it sent stay.")
    def delete(self, request: Request, name: str) -> Response:
        actions.delete_endpoint(get_endpoint_for_user(request.user, name, write=True))
        return Response(status=status.HTTP_204_NO_CONTENT)


MAX_INVOCATION_BYTES = 64 * 1024 * 1024  # 10,000 instances of a wide table or a few hundred images


def _read_body(request: Request) -> bytes:
    """The raw body, up to MAX_INVOCATION_BYTES (Django's own 2.5 MB form limit is for
    forms; an invocation of 10,000 rows is larger). Over it: 413, not a 500."""
    too_large = ApiError(f"The request body is over {MAX_INVOCATION_BYTES // (1024 * 1024)} MB: send fewer instances "
                         "per request, or run a batch prediction over a dataset version.", code="too_large",
                         status_code=413)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > MAX_INVOCATION_BYTES:
        raise too_large
    data = request._request.read(MAX_INVOCATION_BYTES + 1)
    if len(data) > MAX_INVOCATION_BYTES:
        raise too_large
    return data


class _NonFinite(ValueError):
    """A NaN, Infinity or too-large number in an invocation body (Python's json takes them)."""


def _non_finite(literal: str) -> float:
    raise _NonFinite(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NonFinite(literal)
    return value


class InvocationView(APIView):
    """Lean on purpose (the hot path): no serializer, no pagination; JSON in and out with
    the json module, and the endpoint row read once (see hosting.invocation)."""

    @extend_schema(request=OBJECT, responses=OBJECT)
    def post(self, request: Request, name: str) -> HttpResponse:
        endpoint = endpoint_for_invocation(request.user, name)
        if endpoint is None:
            raise ApiError(f"No endpoint '{name}'.", code="not_found", status_code=404)
        try:
            body = json.loads(_read_body(request) or b"null", parse_constant=_non_finite, parse_float=_finite_float)
        except _NonFinite as exc:
            raise ApiError(f"The body holds {exc}, which is not a finite number (JSON has no NaN or Infinity).",
                           fields={"instances": [f"{exc} is not a finite number"]}) from None
        except (ValueError, UnicodeDecodeError):
            raise ApiError("The body is not valid JSON.") from None
        if not isinstance(body, dict) or "instances" not in body:
            raise ApiError("instances: This field is required.", fields={"instances": ["This field is required."]})
        reject_nul(body)  # no text or JSON column (a human loop's input) can hold a NUL
        result = invoke(endpoint, body["instances"])
        return HttpResponse(json.dumps(result), content_type="application/json")


# --- batch predictions -------------------------------------------------------------------------
class BatchPredictionListView(PaginatedAPIView):
    @extend_schema(operation_id="batch_predictions_list", parameters=[OpenApiParameter("project", str)], responses=OBJECT)
    def get(self, request: Request) -> Response:
        batches = BatchPrediction.objects.select_related("project", "model_version").filter(
            project__in=Project.objects.readable_by(request.user))
        if slug := request.query_params.get("project"):
            batches = batches.filter(project=get_project_for_user(request.user, slug))
        return paginate(self, request, batches, lambda page: [batch_json(b) for b in page])

    @extend_schema(request=OBJECT, responses={202: OBJECT})
    def post(self, request: Request) -> Response:
        body = _body(request)
        _required(body, "project", "model", "dataset_version")
        project = project_for_write(request.user, str(body["project"]))
        version = actions.resolve_model_version(project, body["model"], body.get("model_version"))
        batch = actions.submit_batch_prediction(project=project, model_version=version,
                                                dataset_version=body["dataset_version"],
                                                flow_definition=body.get("flow_definition"), user=request.user)
        return Response(batch_json(batch), status=status.HTTP_202_ACCEPTED)


class BatchPredictionDetailView(APIView):
    @extend_schema(responses=OBJECT)
    def get(self, request: Request, pk: int) -> Response:
        return Response(batch_json(get_batch_for_user(request.user, pk)))


def download_batch_output(batch: BatchPrediction) -> HttpResponse:
    """predictions.jsonl of a Completed batch, streamed (or a presigned S3 link). The file
    is written whole when the batch completes, so before that there is nothing to give."""
    from datasets.storage import download_response

    if batch.status == BatchStatus.FAILED:
        raise ApiError(f"Batch prediction {batch.pk} failed, so it wrote no predictions.jsonl: "
                       f"{batch.failure_reason or 'see its failure_reason'}", code="not_ready", status_code=409)
    if batch.status != BatchStatus.COMPLETED or not batch.output_uri:
        raise ApiError(f"Batch prediction {batch.pk} is {batch.status}: its predictions.jsonl is there once it "
                       "is Completed.", code="not_ready", status_code=409)
    return download_response(batch.output_uri, f"batch-{batch.pk}-predictions.jsonl", "application/x-ndjson")


class BatchPredictionDownloadView(APIView):
    @extend_schema(operation_id="batch_predictions_download",
                   responses={(200, "application/x-ndjson"): OpenApiTypes.BINARY,
                              302: OpenApiResponse(description="S3: a presigned link to predictions.jsonl")})
    def get(self, request: Request, pk: int) -> HttpResponse:
        return download_batch_output(get_batch_for_user(request.user, pk))
