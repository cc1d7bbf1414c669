"""The job page's rule forms: add a rule, switch one on or off, delete one. Each posts back
to the job page with the outcome as a message; a refused rule brings the form back open,
with what was typed and the error beside its field (kept in the session for one page)."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_POST

from jobs.access import get_job_for_user
from jobs.models import JobRule, TrainingJob
from jobs.rules.common import STATES
from jobs.rules.engine import ACTION_TYPES, RuleError
from jobs.rules.store import RuleConflict, add_rule, delete_rule, update_rule
from jobs.templatetags.job_rules import form_key
from studio.views import page


def _back(pk: int, anchor: str = "rules-panel") -> HttpResponse:
    return redirect(reverse("job-detail", args=[pk]) + "#" + anchor)


# The form's fields by the first part of a RuleError's path; the rest go above the form.
FORM_FIELDS = {"type": "type", "name": "name", "parameters": "parameters", "actions": "actions"}


def _refused(request: HttpRequest, pk: int, values: dict, field: str | None, message: str) -> HttpResponse:
    """Back to the form, open, with what was typed and the error beside its field."""
    head = (field or "").split(".", 1)[0].split("[", 1)[0]
    request.session[form_key(pk)] = {"values": values, "field": FORM_FIELDS.get(head, ""),
                                     "message": f"{field}: {message}" if field else message}
    return _back(pk, "rule-add")


@page
@require_POST
def rule_add(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_job_for_user(request.user, pk, write=True)
    values: dict[str, Any] = {"type": request.POST.get("type", ""), "name": request.POST.get("name") or "",
              "parameters": request.POST.get("parameters") or "", "actions": request.POST.getlist("actions"),
              "notify_on": request.POST.getlist("notify_on"), "channels": request.POST.getlist("channels")}
    raw_parameters = values["parameters"].strip() or "{}"
    try:
        parameters = json.loads(raw_parameters)
    except ValueError as exc:
        return _refused(request, pk, values, "parameters", f"must be a JSON object ({exc}).")
    actions: list[Any] = []
    for kind in ACTION_TYPES:
        if kind not in values["actions"]:
            continue
        if kind == "notify":
            if not values["notify_on"]:
                return _refused(request, pk, values, "actions", "notify: tick at least one state to notify on.")
            notify: dict[str, Any] = {"type": "notify", "channels": values["channels"] or None}
            if set(values["notify_on"]) != set(STATES):
                notify["on"] = values["notify_on"]
            actions.append(notify)
        else:
            actions.append(kind)
    spec: dict = {"type": values["type"], "parameters": parameters, "actions": actions}
    if name := values["name"].strip():
        spec["name"] = name
    try:
        rule = add_rule(job.pk, spec, job_finished=job.is_finished(), project_id=job.project_id)
    except RuleError as exc:
        return _refused(request, pk, values, exc.field, exc.message)
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
        update_rule(rule, {"enabled": not rule.enabled}, job_finished=job.is_finished(), project_id=job.project_id)
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
