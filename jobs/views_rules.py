"""The job page's rule forms: add a rule, switch one on or off, delete one. Each posts back
to the job page, with the outcome (or the bad field, named) as a message."""

from __future__ import annotations

import json

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.access import get_job_for_user
from jobs.models import JobRule, TrainingJob
from jobs.rules.engine import ACTION_TYPES, RuleError
from jobs.rules.store import RuleConflict, add_rule, delete_rule, update_rule
from studio.views import page


def _back(pk: int) -> HttpResponse:
    return redirect(reverse("job-detail", args=[pk]) + "#rules-panel")


@page
@require_POST
def rule_add(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_job_for_user(request.user, pk, write=True)
    raw_parameters = (request.POST.get("parameters") or "").strip() or "{}"
    try:
        parameters = json.loads(raw_parameters)
    except ValueError as exc:
        messages.error(request, f"Rule not added: parameters must be a JSON object ({exc}).")
        return _back(pk)
    spec: dict = {"type": request.POST.get("type", ""), "parameters": parameters,
                  "actions": [a for a in request.POST.getlist("actions") if a in ACTION_TYPES]}
    if name := (request.POST.get("name") or "").strip():
        spec["name"] = name
    try:
        rule = add_rule(job.pk, spec, job_finished=job.is_finished(), project_id=job.project_id)
    except RuleError as exc:
        messages.error(request, f"Rule not added: {exc.field}: {exc.message}" if exc.field else f"Rule not added: {exc.message}")
    except RuleConflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Rule {rule.name} added; it is evaluated from the job's next points.")
    return _back(pk)


def _job_and_rule(request: HttpRequest, pk: int, rule_id: int) -> tuple[TrainingJob, JobRule]:
    job = get_job_for_user(request.user, pk, write=True)
    return job, get_object_or_404(JobRule, job=job, pk=rule_id)


@page
@require_POST
def rule_toggle(request: HttpRequest, pk: int, rule_id: int) -> HttpResponse:
    job, rule = _job_and_rule(request, pk, rule_id)
    try:
        update_rule(rule, {"enabled": not rule.enabled}, job_finished=job.is_finished())
    except (RuleError, RuleConflict) as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Rule {rule.name} is {'on' if rule.enabled else 'off'}.")
    return _back(pk)


@page
@require_POST
def rule_delete(request: HttpRequest, pk: int, rule_id: int) -> HttpResponse:
    job, rule = _job_and_rule(request, pk, rule_id)
    try:
        delete_rule(rule, job_finished=job.is_finished())
    except RuleConflict as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Rule {rule.name} deleted.")
    return _back(pk)
