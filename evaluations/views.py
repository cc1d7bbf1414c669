"""Evaluation pages (docs/SPEC.md §9): a report, the form that starts one, and two side by side.

The report page shows the stored JSON (the same numbers as GET /api/v1/evaluations/<id>/);
its charts are drawn by static/js/evaluation_detail.js from a json_script block. Its three
forms post to their own URLs and call the same actions as the API: a new proposal
(actions.propose), calibrating the model version (actions.calibrate_model_version) and
routing a flow at the proposal's threshold (actions.activate_flow). A refused action
redraws the page with its message on the form, status 400."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods
from django_htmx.http import HttpResponseClientRefresh

from datasets.pickers import ready_versions
from evaluations import actions
from evaluations.access import get_evaluation_for_user
from evaluations.api import compare_json
from evaluations.forms import ActivateForm, CalibrateForm, EvaluationPageForm, NewEvaluationForm, ProposeForm
from evaluations.models import Evaluation, EvaluationStatus
from hosting.models import ModelKind, ModelVersion
from jobs.access import get_job_for_user
from review.models import FlowDefinition, TaskType
from studio.access import check_role, signed_in
from studio.pages import can_write_in
from studio.views import page

# (report key, label, interval key): the headline figures, in the order the page shows them.
HEADLINE = (("accuracy", "Accuracy", "accuracy"), ("macro_f1", "Macro F1", "macro_f1"),
            ("weighted_f1", "Weighted F1", None), ("roc_auc_macro", "ROC AUC (macro)", None),
            ("log_loss", "Log loss", "log_loss"), ("brier", "Brier score", "brier"))
CALIBRATION_HEADLINE = (("ece_width", "ECE (equal width)", "ece_width"), ("ece_mass", "ECE (equal mass)", "ece_mass"),
                        ("mce", "MCE", None))
LOWER_IS_BETTER = frozenset({"log_loss", "brier", "ece", "ece_mass", "ece_after", "perplexity", "bits_per_character"})
PROPOSAL_COLUMNS = (("risk", "Within the target (t_risk)"), ("cost", "Least cost (t_cost)"),
                    ("current", "The flow's current"), ("fixed_0.8", "Fixed 0.8"))
COMPARE_LABELS = {"accuracy": "Accuracy", "macro_f1": "Macro F1", "weighted_f1": "Weighted F1", "log_loss": "Log loss",
                  "brier": "Brier score", "roc_auc_macro": "ROC AUC (macro)", "perplexity": "Perplexity",
                  "bits_per_character": "Bits per character", "ece": "ECE (equal width)", "ece_mass": "ECE (equal mass)",
                  "temperature": "Temperature", "ece_after": "ECE after the temperature",
                  "threshold_risk": "Threshold (t_risk)", "coverage_risk": "Coverage at t_risk"}
CHANNELS = (("", "every record"), ("train", "train"), ("validation", "validation"), ("test", "test"))


def classification_flows(project_id: int) -> list[FlowDefinition]:
    """The flows a confidence threshold can route: the project's classification flows."""
    return list(FlowDefinition.objects.filter(project_id=project_id, task_type=TaskType.CLASSIFICATION).order_by("name"))


# --- the report ------------------------------------------------------------------------------
def _headline_rows(evaluation: Evaluation) -> list[dict[str, Any]]:
    report = evaluation.report or {}
    intervals = report.get("intervals") or {}
    if not evaluation.is_classifier():
        return [{"key": key, "label": label, "value": report.get(key), "interval": None}
                for key, label in (("perplexity", "Perplexity"), ("bits_per_character", "Bits per character"))]
    rows = [{"key": key, "label": label, "value": report.get(key), "interval": intervals.get(name) if name else None}
            for key, label, name in HEADLINE]
    calibration = report.get("calibration") or {}
    rows += [{"key": key, "label": label, "value": calibration.get(key), "interval": intervals.get(name) if name else None}
             for key, label, name in CALIBRATION_HEADLINE]
    return [row for row in rows if row["value"] is not None]


def _proposal_table(proposal: dict[str, Any]) -> dict[str, Any] | None:
    """The proposal's thresholds side by side: one column per threshold (t_risk, t_cost, the
    flow's current one, the fixed 0.8) that exists, with the calibration part's figures
    and the ones measured on the test part."""
    if not proposal or proposal.get("error"):
        return None
    compared = proposal.get("compared") or {}
    measured = proposal.get("measured") or {}
    columns = []
    for key, label in PROPOSAL_COLUMNS:
        row = proposal.get(key) if key in ("risk", "cost") else compared.get(key)
        reason = proposal.get("reason") if key == "risk" else proposal.get("cost_reason") if key == "cost" else None
        if row or reason:
            columns.append({"key": key, "label": label, "row": row, "measured": measured.get(key) if row else None,
                            "reason": None if row else reason})
    return {"columns": columns}


def _chart_data(evaluation: Evaluation) -> dict[str, Any]:
    """What static/js/evaluation_detail.js draws, as the stored report holds it."""
    report, calibration, proposal = evaluation.report or {}, evaluation.calibration or {}, evaluation.proposal or {}
    isotonic = calibration.get("isotonic") or {}
    markers = {}
    if not proposal.get("error"):
        for name, row in (("t_risk", proposal.get("risk")), ("t_cost", proposal.get("cost")),
                          ("current", (proposal.get("compared") or {}).get("current")),
                          ("0.8", (proposal.get("compared") or {}).get("fixed_0.8"))):
            if row:
                markers[name] = {key: row.get(key) for key in ("threshold", "coverage", "risk", "risk_upper")}
    return {
        "labels": [str(label) for label in evaluation.labels],
        "confusion_matrix": report.get("confusion_matrix") or [],
        "roc": report.get("roc") or {}, "pr": report.get("pr") or {},
        "reliability": {
            "before": ((calibration.get("before") or {}).get("bins")) or {},
            "after": ((calibration.get("after") or {}).get("bins")) or {},
            "isotonic": ((isotonic.get("after") or {}).get("bins")) or {},
            "all": ((report.get("calibration") or {}).get("bins")) or {},
        },
        "temperature": calibration.get("temperature"),
        "candidates": [] if proposal.get("error") else proposal.get("candidates") or [],
        "target_error": proposal.get("target_error"),
        "markers": markers,
    }


def _detail_context(request: HttpRequest, evaluation: Evaluation, **forms: EvaluationPageForm) -> dict[str, Any]:
    can_write = can_write_in(request, evaluation.project_id)
    proposal = evaluation.proposal or {}
    calibration = evaluation.calibration or {}
    options = evaluation.options or {}
    completed = evaluation.status == EvaluationStatus.COMPLETED
    version = evaluation.model_version
    served = version.calibration or {}
    context: dict[str, Any] = {
        "evaluation": evaluation, "version": version, "model": version.model, "can_write": can_write,
        "completed": completed, "classifier": evaluation.is_classifier(),
        "headline": _headline_rows(evaluation) if completed else [],
        "per_class": (evaluation.report or {}).get("per_class") or [],
        "proposal": proposal, "proposal_error": proposal.get("error"), "proposal_table": _proposal_table(proposal),
        "calibration": calibration, "isotonic_available": bool((calibration.get("isotonic") or {}).get("mapping")),
        "served_calibration": served, "serves_this": served.get("evaluation") == evaluation.pk,
        "options": options, "flows": classification_flows(evaluation.project_id) if can_write else [],
        "charts": _chart_data(evaluation) if completed and evaluation.is_classifier() else None,
        "progress": (evaluation.records_done / evaluation.records_total
                     if evaluation.records_total else None),
        "others": list(Evaluation.objects.filter(model_version__model_id=version.model_id, status=EvaluationStatus.COMPLETED)
                       .exclude(pk=evaluation.pk).select_related("model_version", "dataset_version__dataset")[:10])
        if completed else [],
    }
    for name in ("propose", "calibrate", "activate"):
        form = forms.get(name)
        context[f"{name}_errors"] = form.page_errors() if form is not None else {}
        context[f"{name}_values"] = form.data if form is not None else {}
    return context


@page
def evaluation_detail(request: HttpRequest, pk: int) -> HttpResponse:
    evaluation = get_evaluation_for_user(request.user, pk)
    return render(request, "evaluations/detail.html", _detail_context(request, evaluation))


@page
def evaluation_status(request: HttpRequest, pk: int) -> HttpResponse:
    """The status fragment htmx polls while the evaluation runs; once it has finished the
    whole page is stale (figures, charts, forms), so ask for a refresh."""
    evaluation = get_evaluation_for_user(request.user, pk)
    if evaluation.is_finished() and getattr(request, "htmx", False):
        return HttpResponseClientRefresh()
    return render(request, "evaluations/_status.html", {
        "evaluation": evaluation,
        "progress": evaluation.records_done / evaluation.records_total if evaluation.records_total else None})


def _refused(request: HttpRequest, evaluation: Evaluation, **forms: EvaluationPageForm) -> HttpResponse:
    return render(request, "evaluations/detail.html", _detail_context(request, evaluation, **forms), status=400)


def _writable(request: HttpRequest, pk: int) -> Evaluation:
    return get_evaluation_for_user(request.user, pk, write=True)


@page
@require_http_methods(["POST"])
def evaluation_propose(request: HttpRequest, pk: int) -> HttpResponse:
    evaluation = _writable(request, pk)
    form = ProposeForm(request.POST)
    if form.is_valid():
        proposal = form.run_action(lambda: actions.propose(evaluation, form.body()))
        if proposal is not None:
            risk = proposal.get("risk")
            if risk:
                messages.success(request, f"New proposal: auto-accept at confidence ≥ {risk['threshold']:.4g} covers "
                                          f"{risk['coverage']:.1%} within a {proposal['target_error']:.1%} target.")
            else:
                messages.warning(request, f"New proposal: {proposal.get('reason') or 'no threshold meets the target'}.")
            return redirect(f"{reverse('evaluation-detail', args=[evaluation.pk])}#proposal")
    return _refused(request, evaluation, propose=form)


@page
@require_http_methods(["POST"])
def evaluation_calibrate(request: HttpRequest, pk: int) -> HttpResponse:
    evaluation = _writable(request, pk)
    version = evaluation.model_version  # of the evaluation's project, which the user writes in
    form = CalibrateForm(request.POST)
    if form.is_valid():
        method = form.cleaned_data["method"]
        done = form.run_action(lambda: actions.calibrate_model_version(
            version, {"evaluation": evaluation.pk, "method": method}, user=signed_in(request.user)))
        if done is not None:
            if method == "none":
                messages.success(request, f"{version.model.name} v{version.version} serves its own softmax again.")
            elif method == "isotonic":
                messages.success(request, f"{version.model.name} v{version.version} now serves confidences mapped by "
                                          f"evaluation {evaluation.pk}'s isotonic fit.")
            else:
                messages.success(request, f"{version.model.name} v{version.version} now serves calibrated confidences "
                                          f"(temperature {done.calibration['temperature']:.4g}).")
            return redirect(f"{reverse('evaluation-detail', args=[evaluation.pk])}#calibration")
    return _refused(request, evaluation, calibrate=form)


@page
@require_http_methods(["POST"])
def evaluation_activate(request: HttpRequest, pk: int) -> HttpResponse:
    evaluation = _writable(request, pk)
    form = ActivateForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        flow = None
        if not data["flow_definition"]:
            form.add_error("flow_definition", "Pick a classification flow of this project.")
        else:
            flow = form.run_action(lambda: actions.flow_in_project(evaluation.project, data["flow_definition"]))
        result = None
        if flow is not None:
            result = form.run_action(lambda: actions.activate_flow(flow, {"evaluation": evaluation.pk, "choice": data["choice"]},
                                                                   user=signed_in(request.user)))
        if flow is not None and result is not None:
            messages.success(request, f"Flow {flow.name} now sends items with confidence below {result['threshold']:.4g} "
                                      f"to people (the {result['choice']} threshold of evaluation {evaluation.pk}).")
            for warning in result["warnings"]:
                messages.warning(request, f"Check: {warning}.")
            return redirect(f"{reverse('evaluation-detail', args=[evaluation.pk])}#apply")
    return _refused(request, evaluation, activate=form)


# --- a new evaluation ------------------------------------------------------------------------
def _version_to_evaluate(request: HttpRequest) -> tuple[ModelVersion | None, dict[str, Any]]:
    """The model version ?model_version= names, or the newest one registered from ?job=;
    (None, what to say) when there is none."""
    raw_version, raw_job = request.GET.get("model_version", ""), request.GET.get("job", "")
    if raw_version.isdigit():
        version = (ModelVersion.objects.select_related("model__project", "job").filter(pk=int(raw_version)).first())
        if version is None:
            return None, {"missing": "No model version with that id."}
        check_role(request.user, version.model.project, write=True)
        return version, {}
    if raw_job.isdigit():
        job = get_job_for_user(request.user, int(raw_job), write=True)
        version = (ModelVersion.objects.select_related("model__project", "job").filter(job=job)
                   .order_by("-created_at", "-pk").first())
        if version is None:
            return None, {"job": job, "missing": f"Job {job.name} (#{job.pk}) has no registered model version yet: "
                                                 "register its model first, then evaluate the version."}
        return version, {"job": job}
    return None, {"missing": "Open this page from a model version (its model's page) or a completed training job."}


def _new_context(request: HttpRequest, version: ModelVersion | None, extra: dict[str, Any],
                 form: NewEvaluationForm | None = None) -> dict[str, Any]:
    context: dict[str, Any] = {"version": version, **extra, "channels": CHANNELS,
                               "errors": form.page_errors() if form is not None else {},
                               "values": form.data if form is not None else {},
                               "default_target_error": actions.DEFAULT_TARGET_ERROR,
                               "default_calibration_fraction": actions.DEFAULT_CALIBRATION_FRACTION}
    if version is not None:
        formats = actions.FORMATS.get(ModelKind(version.kind), ())
        context.update(model=version.model, formats=formats,
                       dataset_versions=[v for v in ready_versions([version.model.project]) if v["format"] in formats],
                       flows=classification_flows(version.model.project_id) if version.kind != ModelKind.GENERATIVE else [],
                       evaluations=list(version.evaluations.select_related("dataset_version__dataset")[:10]))
    return context


@page
@require_http_methods(["GET", "POST"])
def evaluation_new(request: HttpRequest) -> HttpResponse:
    version, extra = _version_to_evaluate(request)
    if version is None:
        return render(request, "evaluations/new.html", _new_context(request, version, extra),
                      status=200 if request.method == "GET" else 400)
    if request.method == "GET":
        return render(request, "evaluations/new.html", _new_context(request, version, extra))
    form = NewEvaluationForm(request.POST)
    if form.is_valid():
        body = {**form.body(), "model_version": version.pk}
        if version.kind == ModelKind.GENERATIVE:
            body.pop("flow_definition", None)
        evaluation = form.run_action(lambda: actions.submit_evaluation(project=version.model.project, body=body,
                                                                      user=signed_in(request.user)))
        if evaluation is not None:
            messages.success(request, f"Evaluation {evaluation.pk} of {version.model.name} v{version.version} is queued; "
                                      "this page updates by itself as it runs.")
            return redirect("evaluation-detail", pk=evaluation.pk)
    return render(request, "evaluations/new.html", _new_context(request, version, extra, form), status=400)


@page
@require_http_methods(["POST"])
def evaluation_register_job(request: HttpRequest, job_pk: int) -> HttpResponse:
    """"Register and evaluate" on the new-evaluation page of a job without a model version:
    hosting's register action, then the form for the version it made."""
    from hosting.actions import HostingError, register_model

    job = get_job_for_user(request.user, job_pk, write=True)
    name = (request.POST.get("name") or "").strip()
    try:
        version = register_model(project=job.project, name=name, job=job, user=signed_in(request.user))
    except HostingError as exc:
        messages.error(request, f"{exc.field}: {exc.message}")
        return redirect(f"{reverse('evaluation-new')}?job={job.pk}")
    messages.success(request, f"Registered {version.model.name} version {version.version} from job {job.name}.")
    return redirect(f"{reverse('evaluation-new')}?model_version={version.pk}")


# --- two side by side ------------------------------------------------------------------------
def _compare_rows(comparison: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for row in comparison["figures"]:
        if row["a"] is None and row["b"] is None:
            continue
        difference = row["difference"]
        better = None
        if difference and row["figure"] not in ("temperature", "threshold_risk"):
            better = "b" if (difference < 0) == (row["figure"] in LOWER_IS_BETTER) else "a"
        rows.append({**row, "label": COMPARE_LABELS.get(row["figure"], row["figure"]), "better": better})
    return rows


@page
def evaluation_compare(request: HttpRequest) -> HttpResponse:
    ids = [request.GET.get(name, "") for name in ("a", "b")]
    if not all(value.isdigit() for value in ids):
        return render(request, "evaluations/compare.html", {"missing": True}, status=400)
    first, second = (get_evaluation_for_user(request.user, int(pk)) for pk in ids)
    comparison = compare_json(first, second)
    charts = {side: {"id": evaluation.pk, "title": f"#{evaluation.pk} · {evaluation.model_version.model.name} "
                                                   f"v{evaluation.model_version.version}",
                     "before": ((evaluation.calibration or {}).get("before") or {}).get("bins") or {},
                     "after": ((evaluation.calibration or {}).get("after") or {}).get("bins") or {},
                     "temperature": (evaluation.calibration or {}).get("temperature")}
              for side, evaluation in (("a", first), ("b", second))}
    return render(request, "evaluations/compare.html", {
        "a": first, "b": second, "comparison": comparison, "rows": _compare_rows(comparison), "charts": charts})
