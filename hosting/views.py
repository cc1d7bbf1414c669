"""Model and endpoint pages: the models list (with the register form), a model's versions
(with the deploy form) and an endpoint's page with its try-it form.

Reads go through the same access helpers as the API; the two forms post here and call
the same actions as the API (one validation, one write path). The try-it form posts to
the invocation API from static/js/endpoint_detail.js with the session and CSRF token."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.db.models import Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from datasets.pickers import ready_versions
from hosting import actions
from hosting.access import get_endpoint_for_user, get_model_for_user
from hosting.flows import flows_of_project
from hosting.forms import BatchForm, DeployForm, EndpointSettingsForm, RegisterForm
from hosting.invocation import flush_invocation_counts
from hosting.models import BatchPrediction, Endpoint, Model, ModelKind, ModelVersion
from jobs.models import JobStatus, TrainingJob
from jobs.summary import key_metric
from studio.access import Forbidden, signed_in
from studio.models import Project
from studio.pages import can_write_in
from studio.views import page, project_roles, readable_projects

REGISTER_CHOICES = 200  # the newest completed jobs offered in the register form
BATCH_ROWS = 20


def writable_projects(request: HttpRequest) -> list[Project]:
    return [entry.project for entry in project_roles(request) if entry.can_write]


def completed_jobs(projects: list[Project]) -> list[TrainingJob]:
    """The register form's choices, each with `key_metric` (name, value) or None: people
    pick the job by how good it was, not by its number."""
    jobs = list(TrainingJob.objects.filter(project__in=projects, status=JobStatus.COMPLETED).exclude(model_uri="")
                .select_related("project").only("id", "name", "algorithm", "finished_at", "final_metrics",
                                                "project__slug")
                .order_by("-finished_at", "-id")[:REGISTER_CHOICES])
    for job in jobs:
        job.key_metric = key_metric(job)  # type: ignore[attr-defined]
    return jobs


def _models_context(request: HttpRequest) -> dict[str, Any]:
    projects = readable_projects(request)
    versions = ModelVersion.objects.order_by("-version").select_related("job")
    models = list(Model.objects.filter(project__in=projects).select_related("project")
                  .prefetch_related(Prefetch("versions", queryset=versions)).order_by("project__slug", "name"))
    endpoints = list(Endpoint.objects.filter(project__in=projects)
                     .select_related("project", "model_version__model", "flow_definition").order_by("name"))
    by_model: dict[int, list[Endpoint]] = {}
    for endpoint in endpoints:
        by_model.setdefault(endpoint.model_version.model_id, []).append(endpoint)
    rows = []
    for model in models:
        versions_list = list(model.versions.all())
        latest = versions_list[0] if versions_list else None
        rows.append({"model": model, "latest": latest, "count": len(versions_list),
                     "metrics": _headline_metrics(latest), "endpoints": by_model.get(model.pk, [])})
    writable = [p for p in writable_projects(request) if p in set(projects)]
    batches = list(BatchPrediction.objects.filter(project__in=projects)
                   .select_related("model_version__model", "dataset_version__dataset")[:BATCH_ROWS])
    return {"rows": rows, "endpoints": endpoints, "batches": batches, "jobs": completed_jobs(writable),
            "can_register": bool(writable), "show_project": len({m.project_id for m in models}) > 1}


def _headline_metrics(version: ModelVersion | None) -> list[tuple[str, Any]]:
    """The validation/test figures people compare models by, at most three."""
    if version is None:
        return []
    metrics = version.metrics or {}
    preferred = [name for name in ("validation_accuracy", "test_accuracy", "validation_loss") if name in metrics]
    others = sorted(name for name in metrics if name not in preferred and not name.startswith(("train_", "epoch", "step")))
    return [(name, metrics[name]) for name in (preferred + others)[:3]]


@page
def models(request: HttpRequest) -> HttpResponse:
    return render(request, "hosting/models.html", _models_context(request))


@page
@require_http_methods(["POST"])
def model_register(request: HttpRequest) -> HttpResponse:
    """The register form: a completed job's artifact becomes the next version of a model."""
    form = RegisterForm(request.POST, can_write=lambda project_id: can_write_in(request, project_id))
    if form.is_valid():
        job = form.cleaned_data["job"]
        version = form.run_action(lambda: actions.register_model(project=job.project, name=form.cleaned_data["name"],
                                                                 job=job, user=signed_in(request.user)))
        if version is not None:
            messages.success(request, f"Registered {version.model.name} version {version.version}.")
            return redirect("model-detail", pk=version.model_id)
    context = _models_context(request)
    context.update(register_errors=form.page_errors(), register_values=request.POST)
    return render(request, "hosting/models.html", context, status=400)


def _name_inputs(model: Model, versions: list[ModelVersion]) -> None:
    """version.inputs_named: [(channel, its DatasetVersion of the model's project or None,
    the stored id)] — "train: demo-tabular v1", not "train: #1" — in one query."""
    from datasets.models import DatasetVersion

    ids = {raw for version in versions for raw in (version.dataset_versions or {}).values()
           if isinstance(raw, int) and not isinstance(raw, bool)}
    named = {row.pk: row for row in DatasetVersion.objects.filter(pk__in=ids, dataset__project_id=model.project_id)
             .select_related("dataset")}
    for version in versions:
        version.inputs_named = [(channel, named.get(raw) if isinstance(raw, int) else None, raw)  # type: ignore[attr-defined]
                                for channel, raw in sorted((version.dataset_versions or {}).items())]


def _model_context(request: HttpRequest, model: Model) -> dict[str, Any]:
    # "evaluations" is the related name of evaluations.Evaluation's model_version (the app
    # above this one, which hosting does not import): the model page lists them.
    versions = list(model.versions.select_related("job", "created_by").order_by("-version")
                    .prefetch_related("evaluations__dataset_version__dataset"))
    _name_inputs(model, versions)
    evaluations = sorted((evaluation for version in versions for evaluation in version.evaluations.all()),
                         key=lambda evaluation: (evaluation.created_at, evaluation.pk), reverse=True)
    completed = [evaluation for evaluation in evaluations if evaluation.status == "Completed"]
    endpoints = list(Endpoint.objects.filter(model_version__model=model).select_related("model_version", "flow_definition"))
    can_write = can_write_in(request, model.project_id)
    formats = actions.BATCH_FORMATS.get(versions[0].kind, ()) if versions else ()
    return {
        "model": model, "versions": versions, "endpoints": endpoints, "can_write": can_write,
        "dataset_versions": [v for v in ready_versions([model.project]) if v["format"] in formats] if can_write else [],
        "batch_formats": formats,
        "flows": list(flows_of_project(model.project_id)) if can_write else [],
        "batches": list(BatchPrediction.objects.filter(model_version__model=model)
                        .select_related("model_version", "dataset_version__dataset")[:BATCH_ROWS]),
        "evaluations": evaluations,
        "compare_pair": (completed[1], completed[0]) if len(completed) >= 2 else None,
    }


@page
def model_detail(request: HttpRequest, pk: int) -> HttpResponse:
    return render(request, "hosting/model_detail.html", _model_context(request, get_model_for_user(request.user, pk)))


@page
@require_http_methods(["POST"])
def endpoint_create(request: HttpRequest, pk: int) -> HttpResponse:
    """The deploy form on a model's page."""
    model = get_model_for_user(request.user, pk)
    if not can_write_in(request, model.project_id):
        raise Forbidden("Deploying needs the scientist or admin role in this project.")
    form = DeployForm(request.POST, model=model)
    if form.is_valid():
        data = form.cleaned_data
        version = data["model_version"]
        endpoint = form.run_action(lambda: actions.create_endpoint(
            project=model.project, name=data["name"], model_version=version, flow_definition=data["flow_definition"],
            user=request.user))
        if endpoint is not None:
            messages.success(request, f"Endpoint {endpoint.name} now serves version {version.version}.")
            return redirect("endpoint-detail", name=endpoint.name)
    context = _model_context(request, model)
    context.update(deploy_errors=form.page_errors(), deploy_values=request.POST)
    return render(request, "hosting/model_detail.html", context, status=400)


@page
@require_http_methods(["POST"])
def batch_create(request: HttpRequest, pk: int) -> HttpResponse:
    """The batch form on a model's page: predictions for every record of a dataset version."""
    model = get_model_for_user(request.user, pk)
    if not can_write_in(request, model.project_id):
        raise Forbidden("Batch predictions need the scientist or admin role in this project.")
    form = BatchForm(request.POST, model=model)
    if form.is_valid():
        data = form.cleaned_data
        batch = form.run_action(lambda: actions.submit_batch_prediction(
            project=model.project, model_version=data["model_version"], dataset_version=data["dataset_version"],
            flow_definition=data["flow_definition"], user=request.user))
        if batch is not None:
            messages.success(request, f"Batch prediction #{batch.pk} is queued; this page lists its progress.")
            return redirect(f"{reverse('model-detail', args=[model.pk])}#batches-panel")
    context = _model_context(request, model)
    context.update(batch_errors=form.page_errors(), batch_values=request.POST)
    return render(request, "hosting/model_detail.html", context, status=400)


def example_instances(version: ModelVersion) -> list[Any]:
    """What the try-it textarea starts with: one valid instance of the model's kind."""
    schema = version.input_schema or {}
    if version.kind == ModelKind.TABULAR:
        return [schema.get("example") or {column: "" for column in schema.get("columns", [])}]
    if version.kind == ModelKind.TEXT:
        return ["Type a sentence to classify."]
    if version.kind == ModelKind.IMAGE:
        return [{"b64": "<base64 of a PNG or JPEG>"}]
    return [{"prompt": "The old train", "max_new_tokens": 80, "temperature": 0.8}]


def _endpoint_context(request: HttpRequest, endpoint: Endpoint) -> dict[str, Any]:
    version = endpoint.model_version
    if version.model.project_id != endpoint.project_id:  # cannot happen through the actions
        raise Http404("Not found.")
    can_write = can_write_in(request, endpoint.project_id)
    return {
        "endpoint": endpoint, "version": version, "model": version.model,
        "example": json.dumps(example_instances(version), indent=2),
        "invoke_url": reverse("api-endpoint-invocations", args=[endpoint.name]),
        "versions": list(version.model.versions.order_by("-version").only("id", "version", "created_at", "metrics",
                                                                           "job_id", "model_id")),
        "can_write": can_write,
        "flows": list(flows_of_project(endpoint.project_id)) if can_write else [],
    }


@page
def endpoint_detail(request: HttpRequest, name: str) -> HttpResponse:
    flush_invocation_counts()  # this process's pending counts, so the page's figure includes them
    endpoint = get_endpoint_for_user(request.user, name)
    return render(request, "hosting/endpoint_detail.html", _endpoint_context(request, endpoint))


@page
@require_http_methods(["POST"])
def endpoint_update(request: HttpRequest, name: str) -> HttpResponse:
    """The settings form on an endpoint's page: the served version and the review flow,
    through the same action as PATCH /api/v1/endpoints/<name>/ (one UPDATE of the row;
    requests in flight finish on the version they read)."""
    endpoint = get_endpoint_for_user(request.user, name)
    if not can_write_in(request, endpoint.project_id):
        raise Forbidden("Changing an endpoint needs the scientist or admin role in this project.")
    before = (endpoint.model_version.version, endpoint.flow_definition.name if endpoint.flow_definition else None)
    form = EndpointSettingsForm(request.POST, endpoint=endpoint)
    updated = form.run_action(lambda: actions.update_endpoint(
        endpoint, model_version=form.cleaned_data["model_version"],
        flow_definition=form.cleaned_data["flow_definition"])) if form.is_valid() else None
    if updated is not None:
        endpoint = get_endpoint_for_user(request.user, name)
        after = (endpoint.model_version.version, endpoint.flow_definition.name if endpoint.flow_definition else None)
        changes = []
        if after[0] != before[0]:
            changes.append(f"now serves version {after[0]} (was {before[0]})")
        if after[1] != before[1]:
            changes.append(f"sends to the review flow {after[1]}" if after[1] else "sends nothing to review")
        messages.success(request, f"Endpoint {endpoint.name} {' and '.join(changes)}." if changes
                         else f"Endpoint {endpoint.name} is unchanged.")
        return redirect("endpoint-detail", name=endpoint.name)
    context = _endpoint_context(request, get_endpoint_for_user(request.user, name))
    context.update(settings_errors=form.page_errors(), settings_values=request.POST)
    return render(request, "hosting/endpoint_detail.html", context, status=400)
