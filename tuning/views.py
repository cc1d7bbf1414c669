"""Tuning job pages: the list, the create form (blank, or "Tune this" from a finished job),
the detail page with its trials table and charts, and the JSON that page polls while the
search runs.

Reads and permissions go through the same helpers as the API (get_tuning_job_for_user,
readable projects); the form and the Stop button post to the API (tuning/api.py), so the
page and automation share one validation and one write path."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from django.core.exceptions import PermissionDenied
from django.db.models import Count, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from datasets.models import DatasetVersion
from datasets.pickers import ready_versions
from jobs.access import get_job_for_user
from jobs.models import EARLY_STOPPED, FINISHED_STATUSES, RULE_TRIGGERED, Node, TrainingJob
from studio.models import Project
from studio.pages import can_write_in, duration_text, shown_value
from studio.views import current_project, page, project_roles, readable_projects
from tuning import analysis
from tuning.access import get_tuning_job_for_user
from tuning.forms import (
    DEFAULT_MAX_PARALLEL,
    DEFAULT_MAX_TRIALS,
    EARLY_STOPPING_HELP,
    STRATEGIES,
    STRATEGY_HELP,
    TuningForm,
    from_job_initial,
    from_job_prefill,
)
from tuning.models import TuningJob, TuningStatus

LIST_LIMIT = 500
WARM_START_CHOICES = 200  # the newest tuning jobs offered for warm start
POLL_SECONDS = 4
END_REASONS = {
    "MaxTrialsReached": "it ran its {max_trials} trials",
    "TargetValueReached": "a trial reached the target value {target}",
    "MaxRuntimeExceeded": "it reached its max runtime of {runtime} s",
    "StopRequested": "someone asked it to stop",
    "AllTrialsFailed": "every trial failed",
    "GridExhausted": "every point of the grid ran",
}
STRATEGY_LABELS = dict(STRATEGIES)


def run_seconds(started: datetime | None, finished: datetime | None, now: datetime | None = None) -> float | None:
    if started is None:
        return None
    return ((finished or now or timezone.now()) - started).total_seconds()


# --- list -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TuningFilters:
    status: str = ""
    strategy: str = ""
    search: str = ""

    @classmethod
    def from_query(cls, params: QueryDict) -> TuningFilters:
        return cls(
            status=params.get("status", "") if params.get("status") in TuningStatus.values else "",
            strategy=params.get("strategy", "") if params.get("strategy") in STRATEGY_LABELS else "",
            search=params.get("q", "").strip()[:200],
        )

    def active(self) -> bool:
        return bool(self.status or self.strategy or self.search)

    def apply(self, jobs: QuerySet[TuningJob]) -> QuerySet[TuningJob]:
        if self.status:
            jobs = jobs.filter(status=self.status)
        if self.strategy:
            jobs = jobs.filter(strategy=self.strategy)
        if self.search:
            jobs = jobs.filter(name__icontains=self.search)
        return jobs


class TrialCounts(TypedDict):
    trials_done: int
    trials_total: int


if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    CountedTuningJob: TypeAlias = WithAnnotations[TuningJob, TrialCounts]


@dataclass
class TuningListRow:
    """A row of the tuning list: the search, how long it has run and its trials."""

    job: CountedTuningJob
    duration: str
    run_seconds: float  # what the Duration column sorts by
    strategy_label: str
    trials_running: int

    @classmethod
    def of(cls, job: CountedTuningJob, now: datetime) -> TuningListRow:
        seconds = run_seconds(job.started_at, job.finished_at, now)
        return cls(job, duration_text(seconds), seconds or 0, STRATEGY_LABELS.get(job.strategy, job.strategy),
                   job.trials_total - job.trials_done)


def with_trial_counts(jobs: QuerySet[TuningJob]) -> QuerySet[CountedTuningJob]:
    """Finished and running trials per tuning job, counted in the list's one query."""
    return jobs.annotate(
        trials_done=Count("trials", filter=Q(trials__status__in=FINISHED_STATUSES)),
        trials_total=Count("trials"),
    )


@page
def tuning_list(request: HttpRequest) -> HttpResponse:
    projects = readable_projects(request)
    visible = TuningJob.objects.filter(project__in=projects)
    if request.GET.get("archived") != "true":  # archived searches (tuning.deletion) only when asked
        visible = visible.filter(archived_at__isnull=True)
    filters = TuningFilters.from_query(request.GET)
    matching = filters.apply(visible)
    jobs = list(with_trial_counts(matching.select_related("project")).order_by("-created_at")[:LIST_LIMIT])
    total = len(jobs) if len(jobs) < LIST_LIMIT else matching.count()
    now = timezone.now()
    rows = [TuningListRow.of(job, now) for job in jobs]
    writable = [entry.project for entry in project_roles(request) if entry.can_write]
    return render(request, "tuning/list.html", {
        "jobs": rows,
        "total": total,
        "limited": total > len(jobs),
        "filters": filters,
        "statuses": TuningStatus.choices,
        "strategies": STRATEGIES,
        "can_create": bool(writable),
        "example_project": current_project(request) or (writable[0] if writable else None),
        "show_project": len(project_roles(request)) > 1 and current_project(request) is None,
    })


# --- create -----------------------------------------------------------------------------------
def _algorithm_json(spec: Any) -> dict:
    data = spec.as_json()
    data["metric_names"] = [name for name in spec.metric_names() if name != "epoch"]
    return data


def _warm_start_choices(projects: list) -> list[dict]:
    rows = (TuningJob.objects.filter(project__in=projects).select_related("project")
            .only("id", "name", "status", "project__slug", "created_at", "objective", "parameter_ranges")
            .order_by("-created_at")[:WARM_START_CHOICES])
    return [{"id": job.pk, "name": job.name, "project": job.project.slug, "status": job.status,
             "metric": (job.objective or {}).get("metric", ""), "parameters": sorted(job.parameter_ranges or {})}
            for job in rows]


@page
def tuning_create(request: HttpRequest) -> HttpResponse:
    """The form; the browser sends it as JSON to POST /api/v1/tuning-jobs/ (static/js/tuning_form.js).
    ?from_job=<id> pre-fills everything from that job ("Tune this")."""
    from algorithms import ALGORITHMS

    writable = [entry.project for entry in project_roles(request) if entry.can_write]
    if not writable:
        raise PermissionDenied("Starting a tuning job needs the scientist or admin role in a project; "
                               "ask a project admin to change your role.")
    source = None
    from_job = request.GET.get("from_job", "")
    if from_job:
        if not from_job.isdigit():
            raise Http404("from_job must be a job id, e.g. ?from_job=12.")
        get_job_for_user(request.user, int(from_job))
        source = TrainingJob.objects.prefetch_related("inputs").select_related("project").get(pk=int(from_job))
    nodes = list(Node.objects.exclude(state="stopped").values_list("instance_type", flat=True))
    instance_types = sorted({"cpu", *nodes})
    chosen = current_project(request)
    default_project = chosen.slug if chosen and chosen in writable else writable[0].slug
    slugs = [p.slug for p in writable]
    initial = from_job_initial(source, slugs) if source else {
        "project": default_project, "strategy": "bayesian", "max_trials": DEFAULT_MAX_TRIALS,
        "max_parallel": DEFAULT_MAX_PARALLEL, "early_stopping": "off"}
    form = TuningForm(initial=initial, projects=writable, algorithms=ALGORITHMS, instance_types=instance_types)
    return render(request, "tuning/form.html", {
        "form": form,
        "source": source,
        "form_data": {
            "algorithms": [_algorithm_json(spec) for spec in ALGORITHMS.values()],
            "versions": ready_versions(writable),
            "warm_start": _warm_start_choices(writable),
            "prefill": from_job_prefill(source) if source else None,
            "strategy_help": STRATEGY_HELP,
            "early_stopping_help": EARLY_STOPPING_HELP,
            "detail_url_base": reverse("tuning-detail", args=[0]).removesuffix("0/"),
        },
    })


# --- detail -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRow:
    job: TrainingJob
    status: str  # "Pruned" for an early-stopped trial
    pruned_by: str  # a pruned trial's "why": the tuning job's early stopping, or which of its rules
    objective: float | None
    reported: float | None  # the last intermediate value, for a trial without a final objective
    params: list[tuple[Any, Any, bool]]  # (value, sort value, numeric) in the ranges' order; shown with |sig
    duration: str
    seconds: float


def _sort_value(value: Any) -> Any:
    if isinstance(value, bool):
        return str(value).lower()
    return value if isinstance(value, (int, float, str)) else json.dumps(value, sort_keys=True)


def pruned_by(trial: TrainingJob, early_stopping: str) -> str:
    if trial.stop_reason == RULE_TRIGGERED:
        return f"Stopped by its rule {trial.stop_rule or '(unnamed)'} (RuleTriggered)"
    if trial.stop_reason == EARLY_STOPPED:
        return f"Stopped early by the search's early stopping ({early_stopping}): its intermediate values were not promising"
    return ""


def trial_rows(trials: list[TrainingJob], ranges: dict[str, Any], now: datetime, early_stopping: str) -> list[TrialRow]:
    numeric = {name: not (isinstance(spec, dict) and spec.get("type") == "categorical") for name, spec in ranges.items()}
    rows = []
    for trial in trials:
        params = trial.trial_params or {}
        seconds = run_seconds(trial.started_at, trial.finished_at, now)
        objective = trial.objective_value if analysis._finite(trial.objective_value) else None
        rows.append(TrialRow(
            job=trial,
            status=analysis.shown_status(trial),
            pruned_by=pruned_by(trial, early_stopping),
            objective=objective,
            reported=analysis.last_reported(trial.intermediate_values) if objective is None else None,
            params=[(params.get(name), _sort_value(params.get(name, "")), numeric[name]) for name in ranges],
            duration=duration_text(seconds),
            seconds=seconds or 0,
        ))
    return rows


def base_rules(base: dict) -> list[tuple[str, str, str]]:
    """(name, type, actions) of the rules every trial gets: the base job's, with the defaults
    (non_finite) as submit_job adds them."""
    from jobs.rules.engine import RuleError, check_rules
    from jobs.templatetags.job_rules import action_words

    try:
        rules = check_rules(base.get("rules") or [])
    except RuleError:  # checked when the search was created; a row written by hand shows none
        return []
    return [(rule["name"], rule["type"], action_words(rule["actions"])) for rule in rules if rule["enabled"]]


def range_text(spec: dict) -> str:
    """{"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"} → "0.0001 … 0.1, log"."""
    kind = spec.get("type")
    if kind == "categorical":
        return ", ".join(shown_value(v) for v in spec.get("values") or [])
    low, high = shown_value(spec.get("min")), shown_value(spec.get("max"))
    scale = spec.get("scale") or "linear"
    step = f", step {shown_value(spec['step'])}" if spec.get("step") else ""
    return f"{low} … {high}" + (f", {scale}" if kind == "continuous" or scale == "log" else "") + step


def base_inputs(job: TuningJob) -> list[tuple[str, DatasetVersion | None, Any]]:
    """(channel, its dataset version of the search's project or None, the raw value) per
    channel of the base job, for "Every trial runs"."""
    inputs = (job.base_job or {}).get("inputs") or {}
    ids = {}
    for channel, spec in inputs.items():
        raw = spec.get("dataset_version") if isinstance(spec, dict) else spec
        ids[channel] = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    versions = DatasetVersion.objects.filter(pk__in=[v for v in ids.values() if v], dataset__project_id=job.project_id)
    found = {v.pk: v for v in versions.select_related("dataset")}
    rows = []
    for channel in sorted(inputs):
        version_id = ids[channel]
        rows.append((channel, found.get(version_id) if version_id else None, version_id or inputs[channel]))
    return rows


def end_text(job: TuningJob) -> str:
    template = END_REASONS.get(job.end_reason or "")
    if not template:
        return ""
    return template.format(max_trials=job.max_trials, target=shown_value(job.target_value),
                           runtime=job.max_runtime_seconds)


def _trials_of(job: TuningJob) -> list[TrainingJob]:
    return list(job.trials.only(*analysis.TRIAL_FIELDS).order_by("trial_number", "pk"))


def _live_signature(job: TuningJob, data: analysis.ChartData) -> str:
    """Changes whenever anything the page shows about the search changes."""
    state = [job.status, job.end_reason, job.best_trial_id, job.best_value,
             [(t["id"], t["status"], t["value"]) for t in data["trials"]]]
    return hashlib.sha1(json.dumps(state, default=str).encode()).hexdigest()[:16]


@page
def tuning_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_tuning_job_for_user(request.user, pk)
    job = TuningJob.objects.select_related("project", "created_by", "best_trial").get(pk=job.pk)
    trials = _trials_of(job)
    # By name: PostgreSQL's jsonb does not keep the order the ranges were written in.
    ranges = dict(sorted((job.parameter_ranges or {}).items()))
    names = list(ranges)
    now = timezone.now()
    rows = trial_rows(trials, ranges, now, job.early_stopping)
    can_write = can_write_in(request, job.project_id)
    finished = job.is_finished()
    done = sum(1 for t in trials if t.is_finished())
    # Warm start may name another project's search; only readable ones are shown.
    warm = list(job.warm_start_from.filter(project__in=Project.objects.readable_by(request.user))
                .select_related("project").order_by("pk"))
    best = job.best_trial
    base = job.base_job or {}
    data = analysis.chart_data(job, trials)
    completed_count = len(analysis._completed(trials))
    return render(request, "tuning/detail.html", {
        "completed_count": completed_count,
        # Below this many completed trials the importances swing from one trial to the next.
        "importance_caveat": bool(data["importances"]) and completed_count < analysis.STEADY_IMPORTANCE_TRIALS,
        "importance_trials_min": analysis.STEADY_IMPORTANCE_TRIALS,
        "job": job,
        "rows": rows,
        "ranges": [(name, spec.get("type", ""), range_text(spec)) if isinstance(spec, dict) else (name, "", "")
                   for name, spec in ranges.items()],
        "best": best,
        "best_params": [(name, (best.trial_params or {}).get(name)) for name in names] if best else [],
        "can_write": can_write,
        "can_stop": can_write and job.status == TuningStatus.IN_PROGRESS,
        "finished": finished,
        "done": done,
        "running": len(trials) - done,
        "pruned": sum(1 for row in rows if row.status == "Pruned"),
        "pruned_by_rules": sum(1 for row in rows if row.status == "Pruned" and row.job.stop_reason == RULE_TRIGGERED),
        "failed": sum(1 for row in rows if row.status == "Failed"),
        "progress": min(100, round(100 * done / job.max_trials)) if job.max_trials else 0,
        "duration": duration_text(run_seconds(job.started_at, job.finished_at, now)),
        "end_text": end_text(job),
        "strategy_label": STRATEGY_LABELS.get(job.strategy, job.strategy),
        "warm_start": warm,
        "base": {
            "runs": base.get("algorithm") or (base.get("script") or {}).get("entry_point") or "script",
            "is_script": not base.get("algorithm"),
            "hyperparameters": sorted((base.get("hyperparameters") or {}).items()),
            "inputs": base_inputs(job),
            "instance_type": (base.get("resources") or {}).get("instance_type", "cpu"),
            "max_runtime_seconds": (base.get("stopping") or {}).get("max_runtime_seconds"),
            "rules": base_rules(base),
        },
        "live": {
            "status": job.status,
            "finished": finished,
            "poll_seconds": POLL_SECONDS,
            "signature": _live_signature(job, data),
            "charts": data,
            "urls": {
                "data": reverse("tuning-data", args=[job.pk]),
                "page": reverse("tuning-detail", args=[job.pk]),
                "stop": reverse("api-tuning-job-stop", args=[job.pk]),
                "job_base": reverse("job-detail", args=[0]).removesuffix("0/"),
            },
        },
    })


@page
def tuning_data(request: HttpRequest, pk: int) -> JsonResponse:
    """The charts' data and a signature of the search's state: the detail page polls it
    while the search runs and re-reads its regions only when the signature changes."""
    job = get_tuning_job_for_user(request.user, pk)
    data = analysis.chart_data(job, _trials_of(job))
    response = JsonResponse({"status": job.status, "finished": job.is_finished(),
                             "signature": _live_signature(job, data), "charts": data})
    response["Cache-Control"] = "private, no-store"
    return response
