"""Evaluation, calibration and threshold endpoints (conventions: docs/SPEC.md §6, §9).

    POST /api/v1/evaluations/                           {project, model_version, dataset_version, channel?, ...} → 202
    GET  /api/v1/evaluations/?project=&model=&model_version=
    GET  /api/v1/evaluations/<id>/                      the whole report, the same numbers as its page
    POST /api/v1/evaluations/<id>/proposal/             {target_error, delta, flow_definition, costs} → a new proposal
    GET  /api/v1/evaluations/<id>/per-class.csv         every class's figures (models of more than ten classes)
    GET  /api/v1/evaluations/compare/?a=<id>&b=<id>     two reports' headline figures side by side
    POST /api/v1/model-versions/<id>/calibration/       {evaluation, method?} → the version serves calibrated confidences
    POST /api/v1/flow-definitions/<id>/activation/      {evaluation, choice: "risk"|"cost"} → the flow routes at it
"""

from __future__ import annotations

from typing import Any

from django.http import Http404, HttpResponse
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from evaluations import actions
from evaluations.access import get_evaluation_for_user
from evaluations.models import Evaluation
from hosting.api import version_json
from hosting.models import ModelVersion
from review.access import get_flow_for_user
from review.serializers import flow_json
from studio.access import check_role, get_project_for_user
from studio.api import ApiError, PaginatedAPIView, id_param, paginate, project_for_write
from studio.deletion import destroy_schema
from studio.models import Project

OBJECT = OpenApiTypes.OBJECT
HEADLINE = ("accuracy", "macro_f1", "weighted_f1", "log_loss", "brier", "roc_auc_macro", "perplexity", "bits_per_character")


def _body(request: Request) -> dict[str, Any]:
    if not isinstance(request.data, dict):
        raise ApiError("The body must be a JSON object.")
    return request.data


def _iso(value) -> str | None:
    return value.isoformat() if value else None


def headline(evaluation: Evaluation) -> dict[str, Any]:
    """The figures a list or a comparison shows: the report's headline, ECE before and after
    the temperature on the test part, and the proposal's threshold."""
    report, calibration, proposal = evaluation.report or {}, evaluation.calibration or {}, evaluation.proposal or {}
    figures = {name: report[name] for name in HEADLINE if name in report}
    figures["ece"] = (report.get("calibration") or {}).get("ece_width")
    figures["ece_mass"] = (report.get("calibration") or {}).get("ece_mass")
    figures["temperature"] = calibration.get("temperature")
    figures["ece_after"] = (calibration.get("after") or {}).get("ece_width")
    figures["threshold_risk"] = (proposal.get("risk") or {}).get("threshold")
    figures["coverage_risk"] = (proposal.get("risk") or {}).get("coverage")
    return figures


def evaluation_json(evaluation: Evaluation, *, full: bool = True) -> dict[str, Any]:
    version, data = evaluation.model_version, evaluation.dataset_version
    artifacts = evaluation.artifacts or {}
    body: dict[str, Any] = {
        "id": evaluation.pk, "project": evaluation.project.slug, "status": evaluation.status,
        "failure_reason": evaluation.failure_reason,
        "model": {"id": version.model_id, "name": version.model.name},
        "model_version": {"id": version.pk, "version": version.version, "kind": version.kind},
        "dataset_version": {"id": data.pk, "dataset": data.dataset.name, "version": data.version},
        "channel": evaluation.channel or None, "calibration_fraction": evaluation.calibration_fraction,
        "seed": evaluation.seed, "options": evaluation.options, "labels": evaluation.labels,
        "records_total": evaluation.records_total, "records_done": evaluation.records_done,
        "headline": headline(evaluation), "duration_seconds": evaluation.duration_seconds,
        "created_by": evaluation.created_by.username if evaluation.created_by_id and evaluation.created_by else None,
        "created_at": _iso(evaluation.created_at), "started_at": _iso(evaluation.started_at),
        "finished_at": _iso(evaluation.finished_at),
        "url": reverse("evaluation-detail", args=[evaluation.pk]),
        "per_class_csv_url": (reverse("api-evaluation-per-class", args=[evaluation.pk])
                              if artifacts.get("per_class_csv") else None),
    }
    if full:
        body.update({"report": evaluation.report, "calibration": _calibration_json(evaluation.calibration),
                     "proposal": evaluation.proposal})
    return body


def _calibration_json(calibration: dict[str, Any]) -> dict[str, Any]:
    """The fit as stored, without the isotonic steps' arrays (the model version keeps those)."""
    if not calibration:
        return {}
    shown = dict(calibration)
    if shown.get("isotonic"):
        shown["isotonic"] = {key: value for key, value in shown["isotonic"].items() if key != "mapping"}
        shown["isotonic"]["available"] = True
    return shown


def _evaluations():
    return Evaluation.objects.select_related("project", "model_version__model", "dataset_version__dataset", "created_by")


class EvaluationListView(PaginatedAPIView):
    @extend_schema(operation_id="evaluations_list", parameters=[
        OpenApiParameter("project", str), OpenApiParameter("model", int), OpenApiParameter("model_version", int)],
        responses=OBJECT)
    def get(self, request: Request) -> Response:
        evaluations = _evaluations().filter(project__in=Project.objects.readable_by(request.user))
        if slug := request.query_params.get("project"):
            evaluations = evaluations.filter(project=get_project_for_user(request.user, slug))
        for name, lookup in (("model", "model_version__model_id"), ("model_version", "model_version_id")):
            if (value := id_param(request.query_params, name, "Give an id.")) is not None:
                evaluations = evaluations.filter(**{lookup: value})
        return paginate(self, request, evaluations, lambda page: [evaluation_json(e, full=False) for e in page])

    @extend_schema(request=OBJECT, responses={202: OBJECT})
    def post(self, request: Request) -> Response:
        body = _body(request)
        if body.get("project") in (None, ""):
            raise ApiError("project: This field is required.", fields={"project": ["This field is required."]})
        project = project_for_write(request.user, str(body["project"]))
        evaluation = actions.submit_evaluation(project=project, body=body, user=request.user)
        return Response(evaluation_json(_evaluations().get(pk=evaluation.pk)), status=status.HTTP_202_ACCEPTED)


class EvaluationDetailView(APIView):
    @extend_schema(responses=OBJECT)
    def get(self, request: Request, pk: int) -> Response:
        return Response(evaluation_json(get_evaluation_for_user(request.user, pk)))

    @destroy_schema(description="Delete an evaluation with its stored scores. A flow whose threshold came from it keeps "
                    "the threshold and its record.")
    def delete(self, request: Request, pk: int) -> Response:
        from evaluations.deletion import delete_evaluation

        delete_evaluation(get_evaluation_for_user(request.user, pk, write=True))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ProposalView(APIView):
    @extend_schema(request=OBJECT, responses=OBJECT,
                   description="A new threshold proposal from the evaluation's stored scores: target_error r* in "
                               "(0, 0.5], delta, flow_definition (its task_count and audit sample), review_cost and "
                               "error_cost. Stored as the evaluation's proposal.")
    def post(self, request: Request, pk: int) -> Response:
        evaluation = get_evaluation_for_user(request.user, pk, write=True)
        return Response(actions.propose(evaluation, _body(request)))


class PerClassCsvView(APIView):
    @extend_schema(operation_id="evaluations_per_class_csv", responses={(200, "text/csv"): OpenApiTypes.BINARY})
    def get(self, request: Request, pk: int) -> HttpResponse:
        from datasets.storage import download_response

        evaluation = get_evaluation_for_user(request.user, pk)
        uri = (evaluation.artifacts or {}).get("per_class_csv")
        if not uri:
            raise Http404("This evaluation has no per-class CSV (its model has ten classes or fewer: the report holds "
                          "every class).")
        return download_response(uri, f"evaluation-{evaluation.pk}-per-class.csv", "text/csv")


class CompareView(APIView):
    @extend_schema(operation_id="evaluations_compare", parameters=[OpenApiParameter("a", int, required=True),
                                                                   OpenApiParameter("b", int, required=True)],
                   responses=OBJECT)
    def get(self, request: Request) -> Response:
        ids = []
        for name in ("a", "b"):
            value = id_param(request.query_params, name, "Give the id of an evaluation.")
            if value is None:
                raise ApiError(f"{name}: Give the id of an evaluation.", fields={name: ["Give the id of an evaluation."]})
            ids.append(value)
        first, second = (get_evaluation_for_user(request.user, pk) for pk in ids)
        return Response(compare_json(first, second))


def compare_json(first: Evaluation, second: Evaluation) -> dict[str, Any]:
    a, b = headline(first), headline(second)
    rows = [{"figure": name, "a": a.get(name), "b": b.get(name),
             "difference": (b[name] - a[name]) if isinstance(a.get(name), float) and isinstance(b.get(name), float)
             else None} for name in dict.fromkeys([*a, *b])]
    same_data = (first.dataset_version_id, first.channel) == (second.dataset_version_id, second.channel)
    return {"a": evaluation_json(first, full=False), "b": evaluation_json(second, full=False), "figures": rows,
            "same_data": same_data,
            "note": None if same_data else "The two evaluations read different data: their figures are not comparable "
                                           "item for item."}


class ModelVersionCalibrationView(APIView):
    @extend_schema(operation_id="model_versions_calibration", request=OBJECT, responses=OBJECT,
                   description="Serve calibrated confidences: {evaluation, method: \"temperature\" (default) | "
                               "\"isotonic\" (≥ 1,000 calibration items) | \"none\"}. Endpoints and batch predictions "
                               "of this version then answer calibrated: true with the temperature.")
    def post(self, request: Request, pk: int) -> Response:
        version = ModelVersion.objects.select_related("model__project", "created_by").filter(pk=pk).first()
        if version is None:
            raise Http404("No such model version.")
        check_role(request.user, version.model.project, write=True)
        version = actions.calibrate_model_version(version, _body(request), user=request.user)
        return Response(version_json(version))


class FlowActivationView(APIView):
    @extend_schema(operation_id="flow_definitions_activation", request=OBJECT, responses=OBJECT,
                   description="Route the flow at an evaluation's proposed threshold: {evaluation, choice: \"risk\" | "
                               "\"cost\", target_error?, delta?, review_cost?, error_cost?}. The flow records which "
                               "evaluation, temperature, target and threshold it uses.")
    def post(self, request: Request, pk: int) -> Response:
        flow = get_flow_for_user(request.user, pk, write=True)
        result = actions.activate_flow(flow, _body(request), user=request.user)
        result["flow"] = flow_json(get_flow_for_user(request.user, pk))
        return Response(result)
