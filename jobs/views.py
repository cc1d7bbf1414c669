"""Training job pages: list (server-side filters, shareable links), create/clone form,
detail with live charts and logs, model download, and compare.

Reads and permissions go through the same helpers as the API (get_job_for_user,
readable projects); the form and the Stop button post to the API (jobs/api.py), which
calls jobs.actions, so the page and automation share one validation and one write path."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import Prefetch, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.text import slugify

from datasets.models import Dataset
from datasets.pickers import ready_versions
from datasets.storage import StorageError, download_response, join_uri, store_for
from jobs.access import get_job_for_user
from jobs.forms import DISTRIBUTION_HELP, JobForm, clone_initial
from jobs.models import JobAttempt, JobEvent, JobInput, JobStatus, Node, SystemMetric, TrainingJob
from jobs.reports import fsdp_report, partition_report
from jobs.serializers import STOPPABLE
from jobs.summary import key_metric, metric_sort_key
from jobs.validation_size import validation_records
from studio.models import Project
from studio.pages import can_write_in, duration_text
from studio.views import current_project, page, project_roles, readable_projects

log = logging.getLogger(__name__)

LIST_LIMIT = 500
COMPARE_MIN, COMPARE_MAX = 2, 10
SYSTEM_SAMPLES = 720  # an hour at one sample every 5 s: enough history for the chart's first draw
MAX_RANK_OPTIONS = 64
# The live stream of a page starts this far back for metric points: points logged just
# before the page opened may not be in the database yet (the flusher writes them within a
# second or so); replaying a few seconds closes that gap, and the chart drops repeats.
METRIC_REPLAY_MS = 10_000
# Columns the list shows; hyperparameters, environment and metric definitions can be large.
LIST_FIELDS = ("id", "name", "status", "failure_reason", "stop_reason", "algorithm", "script_uri", "entry_point", "tags",
               "attempt", "final_metrics", "created_at", "started_at", "finished_at", "project__id", "project__slug",
               "project__name")
SCRIPT_FILTER = "script"  # the algorithm filter's value for "custom scripts"


# --- shared helpers -----------------------------------------------------------------------
@dataclass
class JobListRow:
    """A row of the jobs list: the job, its key metric and how long it has run."""

    job: TrainingJob
    key_metric: tuple[str, Any] | None
    duration: str
    run_seconds: float  # what the Duration column sorts by

    @classmethod
    def of(cls, job: TrainingJob, now: datetime) -> JobListRow:
        seconds = run_seconds(job, now)
        return cls(job, key_metric(job), duration_text(seconds), seconds or 0)


def run_seconds(job: TrainingJob, now: datetime | None = None) -> float | None:
    """Wall time from the first launch to the end (or to now while it runs)."""
    if job.started_at is None:
        return None
    end = job.finished_at or now or timezone.now()
    return (end - job.started_at).total_seconds()


def _with_tag(jobs: QuerySet[TrainingJob], tag: str) -> QuerySet[TrainingJob]:
    # SQLite has no JSON containment; match the tag's JSON encoding (quotes included) in the
    # stored list instead, so "a" does not match "abc".
    if connection.vendor == "postgresql":
        return jobs.filter(tags__contains=[tag])
    return jobs.filter(tags__icontains=json.dumps(tag))


# --- list ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobFilters:
    status: str = ""
    algorithm: str = ""
    dataset: int | None = None
    tag: str = ""
    search: str = ""

    @classmethod
    def from_query(cls, params: QueryDict) -> JobFilters:
        dataset = params.get("dataset", "").strip()
        return cls(
            status=params.get("status", "").strip() if params.get("status") in JobStatus.values else "",
            algorithm=params.get("algorithm", "").strip()[:64],
            dataset=int(dataset) if dataset.isdigit() else None,
            tag=params.get("tag", "").strip()[:100],
            search=params.get("q", "").strip()[:200],
        )

    def active(self) -> bool:
        return bool(self.status or self.algorithm or self.dataset or self.tag or self.search)

    def apply(self, jobs: QuerySet[TrainingJob]) -> QuerySet[TrainingJob]:
        if self.status:
            jobs = jobs.filter(status=self.status)
        if self.algorithm == SCRIPT_FILTER:
            jobs = jobs.filter(algorithm="")
        elif self.algorithm:
            jobs = jobs.filter(algorithm=self.algorithm)
        if self.dataset is not None:
            # A subquery rather than a join, so a job that reads two versions of the dataset
            # is still one row (no DISTINCT over the JSON columns).
            jobs = jobs.filter(pk__in=JobInput.objects.filter(dataset_version__dataset_id=self.dataset).values("job_id"))
        if self.tag:
            jobs = _with_tag(jobs, self.tag)
        if self.search:
            jobs = jobs.filter(name__icontains=self.search)
        return jobs


def _list_inputs() -> Prefetch:
    return Prefetch("inputs", queryset=JobInput.objects.select_related("dataset_version__dataset")
                    .only("id", "job_id", "channel", "dataset_version__id", "dataset_version__version",
                          "dataset_version__dataset__id", "dataset_version__dataset__name").order_by("channel"))


@page
def job_list(request: HttpRequest) -> HttpResponse:
    from algorithms import ALGORITHMS

    projects = readable_projects(request)
    visible = TrainingJob.objects.filter(project__in=projects)
    if request.GET.get("archived") != "true":  # archived jobs (jobs.deletion) only when asked
        visible = visible.filter(archived_at__isnull=True)
    filters = JobFilters.from_query(request.GET)
    matching = filters.apply(visible)
    jobs = list(matching.select_related("project").only(*LIST_FIELDS).prefetch_related(_list_inputs())
                .order_by("-created_at")[:LIST_LIMIT])
    total = len(jobs) if len(jobs) < LIST_LIMIT else matching.count()
    now = timezone.now()
    rows = [JobListRow.of(job, now) for job in jobs]
    used_algorithms = set(visible.exclude(algorithm="").values_list("algorithm", flat=True).distinct())
    tags = sorted({tag for tag_list in visible.order_by("-created_at").values_list("tags", flat=True)[:2000]
                   for tag in (tag_list or []) if isinstance(tag, str)})
    writable = [entry.project for entry in project_roles(request) if entry.can_write]
    return render(request, "jobs/list.html", {
        "jobs": rows,
        "total": total,
        "limited": total > len(jobs),
        "filters": filters,
        "statuses": JobStatus.values,
        "algorithms": sorted(set(ALGORITHMS) | used_algorithms),
        "script_filter": SCRIPT_FILTER,
        "datasets": list(Dataset.objects.filter(project__in=projects).select_related("project")
                         .only("id", "name", "project__slug").order_by("name", "project__slug")),
        "tags": tags,
        "can_create": bool(writable),
        "example_project": (current_project(request) or (writable[0] if writable else None)),
        "show_project": len(project_roles(request)) > 1 and current_project(request) is None,
        "compare_max": COMPARE_MAX,
    })


# --- create / clone -------------------------------------------------------------------------
def _clone_payload(job_id: int, submission: dict) -> dict:
    """What the form's script needs to pre-fill the generated fields of a clone."""
    return {
        "id": job_id,
        "name": submission["name"],
        "algorithm": submission["algorithm"],
        "script": submission["script"],
        "hyperparameters": submission["hyperparameters"],
        "inputs": submission["inputs"],
        "metric_definitions": submission["metric_definitions"],
        "rules": submission.get("rules", []),
    }


@page
def job_create(request: HttpRequest) -> HttpResponse:
    """The form; the browser sends it as JSON to POST /api/v1/jobs/ (static/js/job_form.js)."""
    from algorithms import ALGORITHMS

    writable = [entry.project for entry in project_roles(request) if entry.can_write]
    if not writable:
        raise PermissionDenied("Starting a training job needs the scientist or admin role in a project; "
                               "ask a project admin to change your role.")
    clone = None
    clone_id = request.GET.get("clone", "")
    if clone_id:
        if not clone_id.isdigit():
            raise Http404("clone must be a job id, e.g. ?clone=12.")
        get_job_for_user(request.user, int(clone_id))
        clone = TrainingJob.objects.prefetch_related("inputs").select_related("project").get(pk=int(clone_id))
    nodes = list(Node.objects.exclude(state="stopped").values("instance_type", "cpus", "gpus"))
    instance_types = sorted({"cpu", *(n["instance_type"] for n in nodes)})
    largest_cpus = {t: max((n["cpus"] for n in nodes if n["instance_type"] == t), default=None) for t in instance_types}
    chosen = current_project(request)
    default_project = chosen.slug if chosen and chosen in writable else writable[0].slug
    submission = clone.as_submission() if clone else None
    initial = clone_initial(submission, [p.slug for p in writable]) if submission else {"project": default_project}
    form = JobForm(initial=initial, projects=writable, algorithms=ALGORITHMS, instance_types=instance_types)
    return render(request, "jobs/form.html", {
        "form": form,
        "clone": clone,
        "form_data": {
            "algorithms": [spec.as_json() for spec in ALGORITHMS.values()],
            "versions": ready_versions(writable),
            "clone": _clone_payload(clone.pk, submission) if clone and submission else None,
            "largest_cpus": largest_cpus,
            "distribution_help": DISTRIBUTION_HELP,
            "job_url_base": reverse("job-detail", args=[0]).removesuffix("0/"),
        },
    })


# --- detail ---------------------------------------------------------------------------------
def _detail_queryset() -> QuerySet[TrainingJob]:
    return TrainingJob.objects.select_related("project", "created_by").prefetch_related(
        Prefetch("inputs", queryset=JobInput.objects.select_related("dataset_version__dataset").order_by("channel")),
        Prefetch("events", queryset=JobEvent.objects.order_by("at", "pk")),
    )


def declared_metric_names(job: TrainingJob) -> list[str]:
    """Series the job says it will report, so their charts exist before the first point."""
    from algorithms import get_algorithm

    spec = get_algorithm(job.algorithm) if job.algorithm else None
    definitions = list(spec.metric_definitions) if spec else []
    definitions += [d for d in (job.metric_definitions or []) if isinstance(d, dict)]
    names = {str(d.get("name")) for d in definitions if d.get("name")}
    return sorted(names, key=metric_sort_key)


def _system_samples(job: TrainingJob) -> list[dict]:
    rows = list(SystemMetric.objects.filter(job=job).order_by("-time")
                .values("node_name", "time", "cpu_percent", "memory_bytes", "gpu_percent", "gpu_memory_bytes")[:SYSTEM_SAMPLES])
    return [{"node": r["node_name"], "time": r["time"].timestamp(), "cpu": r["cpu_percent"], "mem": r["memory_bytes"],
             "gpu": r["gpu_percent"], "gpu_mem": r["gpu_memory_bytes"]} for r in reversed(rows)]


def stream_start(job_id: int) -> str | None:
    """The event id the page's stream resumes after: now for status, logs and system
    samples (the page was rendered with them), a few seconds back for metric points.
    None when Redis cannot be asked (the stream then starts at "now" by itself)."""
    from jobs.metrics.live import STREAMS, current_positions, encode_positions
    from studio.redis_conn import redis_client

    try:
        positions = current_positions(redis_client(), job_id)
    except Exception:  # noqa: BLE001 - Redis down must not break the page; its data is in the database
        log.warning("could not read the stream positions of job %s", job_id, exc_info=True)
        return None
    metric = [kind for kind, _ in STREAMS].index("metric")
    positions[metric] = f"{max(0, int(time.time() * 1000) - METRIC_REPLAY_MS)}-0"
    return encode_positions(positions)


@page
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    get_job_for_user(request.user, pk)
    job = _detail_queryset().get(pk=pk)
    can_write = can_write_in(request, job.project_id)
    world_size = job.instance_count * job.processes_per_node
    events = list(job.events.all())
    attempts = list(JobAttempt.objects.filter(job=job).select_related("node").only(
        "attempt", "node_rank", "started_at", "finished_at", "exit_code", "outcome", "warm_start", "job_id", "node__name",
    ).order_by("attempt", "node_rank"))
    partition_setting = (job.pipeline or {}).get("partition", "auto")
    return render(request, "jobs/detail.html", {
        "job": job,
        "events": events,
        "inputs": list(job.inputs.all()),
        "can_write": can_write,
        "can_stop": can_write and job.status in STOPPABLE,
        "finished": job.is_finished(),
        "duration": duration_text(run_seconds(job)),
        "final_metrics": sorted((job.final_metrics or {}).items(), key=lambda item: metric_sort_key(item[0])),
        "validation_records": validation_records(job),
        "hyperparameters": sorted((job.hyperparameters or {}).items()),  # shown with |sig
        "environment": sorted((job.environment or {}).items()),
        "ranks": list(range(min(world_size, MAX_RANK_OPTIONS))) if world_size > 1 else [],
        "attempts": attempts,
        "retries_used": max(0, job.attempt - 1),
        "partition": partition_report(job.details),
        "fsdp": fsdp_report(job.details),
        "partition_setting": (", ".join(str(count) for count in partition_setting) if isinstance(partition_setting, list)
                              else str(partition_setting)),
        "live": {
            "job": job.pk,
            "status": job.status,
            "finished": job.is_finished(),
            "metric_names": declared_metric_names(job),
            "system": _system_samples(job),
            "stream_after": None if job.is_finished() else stream_start(job.pk),
            "urls": {
                "job": reverse("api-job", args=[job.pk]),
                "stop": reverse("api-job-stop", args=[job.pk]),
                "metrics": reverse("api-job-metrics", args=[job.pk]),
                "logs": reverse("api-job-logs", args=[job.pk]),
                "stream": reverse("api-job-stream", args=[job.pk]),
                "page": reverse("job-detail", args=[job.pk]),
            },
        },
    })


@page
def job_model(request: HttpRequest, pk: int) -> HttpResponse:
    """model.tar.gz of a finished job: streamed from a file:// store, or a short-lived
    presigned link for S3 (the bytes then never pass through the web server)."""
    job = get_job_for_user(request.user, pk)
    if not job.model_uri:
        raise Http404("This job has no model artifact (yet).")
    return download_response(job.model_uri, f"{slugify(job.name) or 'job'}-{job.pk}-model.tar.gz")


def _log_chunks(files: list[tuple[str, str]], headers: bool) -> Iterator[bytes]:
    """The files one after another; with headers, each under a "==> name <==" line as
    `tail` prints several files, so the ranks stay apart in one download."""
    for name, uri in files:
        if headers:
            yield f"==> {name} <==\n".encode()
        try:
            with store_for(uri).open_read(uri) as stream:
                while chunk := stream.read(64 * 1024):
                    yield chunk
        except StorageError as exc:
            yield f"[{name} could not be read: {exc}]\n".encode()
        if headers:
            yield b"\n"


@page
def job_logs(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """The full per-rank logs the node agent syncs to <output_uri>/logs/ every few seconds
    (the live tail on the page holds only the last lines). ?rank=N for one rank."""
    job = get_job_for_user(request.user, pk)
    rank = request.GET.get("rank", "")
    if rank and not rank.isdigit():
        raise Http404("rank must be a number, e.g. ?rank=0.")
    prefix = join_uri(job.output_uri, "logs") if job.output_uri else ""
    try:
        listed = sorted(store_for(prefix).list(prefix), key=lambda info: info.relative_path) if prefix else []
    except StorageError as exc:
        raise Http404(f"The logs could not be listed: {exc}") from exc
    files = [(info.relative_path, info.uri) for info in listed if info.relative_path.endswith(".log")]
    if rank:
        files = [(name, uri) for name, uri in files if name == f"rank-{rank}.log"]
    if not files:
        raise Http404("No log has been written for this job yet; the live tail on the job's page shows new lines.")
    suffix = f"rank-{rank}" if rank else "logs"
    response = StreamingHttpResponse(_log_chunks(files, headers=not rank), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{slugify(job.name) or "job"}-{job.pk}-{suffix}.log"'
    response["Cache-Control"] = "private, no-store"
    return response


# --- compare --------------------------------------------------------------------------------
def parse_ids(values: list[str]) -> list[int] | None:
    """`ids=1,2,3` (a shareable link) or repeated `ids` (the list's checkboxes), in order,
    without repeats; None when any part is not an id."""
    ids: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit():
                return None
            if int(part) not in ids:
                ids.append(int(part))
    return ids


@dataclass(frozen=True)
class CompareRow:
    name: str
    values: list[Any]


def differing_rows(dicts: list[dict]) -> list[CompareRow]:
    """Keys whose values are not the same in every dict (a missing key counts as a value)."""
    missing = object()
    rows = []
    for name in sorted({key for d in dicts for key in d}):
        values = [d.get(name, missing) for d in dicts]
        seen = {json.dumps(v, sort_keys=True, default=str) if v is not missing else "\x00missing" for v in values}
        if len(seen) > 1:
            rows.append(CompareRow(name, [None if v is missing else v for v in values]))  # shown with |sig
    return rows


@page
def job_compare(request: HttpRequest) -> HttpResponse:
    ids = parse_ids(request.GET.getlist("ids"))
    if ids is None or not COMPARE_MIN <= len(ids) <= COMPARE_MAX:
        messages.error(request, f"Pick {COMPARE_MIN} to {COMPARE_MAX} jobs to compare (tick them in the list).")
        return redirect("job-list")
    found = {job.pk: job for job in _detail_queryset().filter(pk__in=ids, project__in=Project.objects.readable_by(request.user))}
    if len(found) != len(ids):
        raise Http404("One of those jobs does not exist or is not in your projects.")
    jobs = [found[pk] for pk in ids]
    # The flusher keeps final_metrics holding every rank-0 series by name: a DISTINCT over
    # the points themselves would walk millions of index entries for long runs.
    metric_names: set[str] = set()
    for job in jobs:
        metric_names.update(job.final_metrics or {})
        metric_names.update(declared_metric_names(job))
    final_names = sorted({name for job in jobs for name in (job.final_metrics or {})}, key=metric_sort_key)
    hyperparameter_rows = differing_rows([job.hyperparameters or {} for job in jobs])
    return render(request, "jobs/compare.html", {
        "jobs": jobs,
        "hyperparameter_rows": hyperparameter_rows,
        "same_count": len({k for job in jobs for k in (job.hyperparameters or {})}) - len(hyperparameter_rows),
        "final_rows": [CompareRow(name, [(job.final_metrics or {}).get(name) for job in jobs])
                       for name in final_names],
        "setup_rows": differing_rows([_setup(job) for job in jobs]),
        "chart": {
            "jobs": [{"id": job.pk, "name": job.name, "metrics_url": reverse("api-job-metrics", args=[job.pk])} for job in jobs],
            "metric_names": sorted(metric_names, key=metric_sort_key),
        },
    })


def _setup(job: TrainingJob) -> dict:
    """What else can differ between runs: what ran, on which data, with which resources."""
    return {
        "algorithm / script": job.algorithm or f"script {job.entry_point}",
        "inputs": ", ".join(f"{i.channel}: {i.dataset_version.dataset.name} v{i.dataset_version.version}" for i in job.inputs.all()),
        "instance_type": job.instance_type,
        "instance_count": job.instance_count,
        "processes_per_node": job.processes_per_node,
        "distribution": job.distribution,
    }
