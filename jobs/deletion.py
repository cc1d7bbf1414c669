"""Deleting a training job (studio.deletion has the shared machinery).

Rules:
- a job that is not finished (Pending, Starting, Training, Uploading, Stopping) is
  refused: stop it first;
- a trial of a tuning job is refused: it is part of its search's history (delete the
  tuning job, which takes its trials with it);
- a finished job that a registered model version came from is archived, not erased: the
  row, its metrics and its artifacts stay (the version's model.tar.gz is the job's), and
  lists hide it unless asked;
- otherwise the row goes with its timeline, metric points, system samples and launches in
  one transaction, and its outputs (artifacts, logs, checkpoints) in the background.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from datasets.actions import VersionUse
from datasets.models import DatasetVersion
from jobs.models import JobEvent, JobInput, MetricPoint, SystemMetric, TrainingJob
from studio.deletion import Blocker, DeletionBlocked, DeletionPlan, count_objects, owned_uri, plural, record_objects


def job_url(job: TrainingJob) -> str:
    return reverse("job-detail", args=[job.pk])


@dataclass(frozen=True)
class KeptBy:
    """A model version that came from a job, which keeps the job (archived, never erased)."""

    job_id: int
    model: str
    version: int
    url: str  # the model's page

    @property
    def label(self) -> str:
        return f"{self.model} v{self.version}"


# hosting registers the finder of model versions made from jobs in its AppConfig.ready(), so
# jobs imports nothing of hosting. A finder takes job ids and returns their keepers, ordered
# by model name and version.
KeeperFinder = Callable[[list[int]], list[KeptBy]]
_keeper_finders: list[KeeperFinder] = []


def register_job_keepers(finder: KeeperFinder) -> None:
    if finder not in _keeper_finders:
        _keeper_finders.append(finder)


def kept_by(job_ids: list[int]) -> list[KeptBy]:
    return [keeper for finder in _keeper_finders for keeper in finder(job_ids)]


def training_job_uses(version: DatasetVersion) -> list[VersionUse]:
    """The jobs that read a dataset version (first five), each saying which model versions
    keep it; registered with datasets.actions by JobsConfig.ready()."""
    jobs = list(JobInput.objects.filter(dataset_version=version).order_by("job_id")
                .values_list("job_id", "job__name")[:5])
    models: dict[int, list[str]] = {}
    for keeper in kept_by([pk for pk, _ in jobs]):
        models.setdefault(keeper.job_id, []).append(f"model '{keeper.model}' v{keeper.version}")
    return [VersionUse("training job", name, reverse("job-detail", args=[pk]),
                       f"kept because {', '.join(models[pk])} came from it" if pk in models else "")
            for pk, name in jobs]


def _checkpoint_uri(job: TrainingJob) -> str:
    """The job's checkpoint location when the job alone owns it (another job that resumes
    from the same location keeps it) and it is not already below the job's outputs."""
    uri = ((job.checkpoint or {}).get("uri") or "").rstrip("/")
    if not uri or not owned_uri(uri):
        return ""
    if job.output_uri and (uri + "/").startswith(job.output_uri.rstrip("/") + "/"):
        return ""
    shared = TrainingJob.objects.exclude(pk=job.pk).filter(checkpoint__uri__in=[uri, uri + "/"]).exists()
    return "" if shared else uri


def job_outputs(job: TrainingJob) -> tuple[dict[str, int], list[str]]:
    """Counts of the job's stored files by kind, and the URIs that remove them."""
    from datasets.storage import StorageError, store_for

    counts = {"artifacts": 0, "logs": 0, "checkpoints": 0, "bytes": 0}
    uris: list[str] = []
    output = (job.output_uri or "").rstrip("/")
    if output and owned_uri(output):
        uris.append(output)
        try:
            for obj in store_for(output).list(output):
                top = obj.relative_path.split("/", 1)[0]
                kind = "logs" if top == "logs" else "checkpoints" if top == "checkpoints" else "artifacts"
                counts[kind] += 1
                counts["bytes"] += obj.size
        except StorageError:
            pass
    checkpoint = _checkpoint_uri(job)
    if checkpoint:
        uris.append(checkpoint)
        files, size = count_objects(checkpoint)
        counts["checkpoints"] += files
        counts["bytes"] += size
    return counts, uris


def _size(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def job_deletion_plan(job: TrainingJob) -> DeletionPlan:
    plan = DeletionPlan(what=f"job {job.pk} '{job.name}'")
    if not job.is_finished():
        plan.blockers.append(Blocker(f"Job '{job.name}' is {job.status}: stop it first, then delete it.",
                                     name=job.name, url=job_url(job)))
    tuning = job.tuning_job  # None without a query when the job is no trial
    if tuning is not None:
        plan.blockers.append(Blocker(
            f"Job '{job.name}' is trial {job.trial_number} of tuning job '{tuning.name}': delete the tuning job "
            "instead (its trials go with it).", name=tuning.name, url=reverse("tuning-detail", args=[tuning.pk])))
    keepers = kept_by([job.pk])
    if keepers:
        plan.archive = True
        names = ", ".join(k.label for k in keepers)
        plan.archive_reason = (f"Model {names} came from this job, so it is archived instead: it leaves the jobs list, "
                               "and its artifacts, logs and metrics stay for the model's history.")
        plan.archive_links = [Blocker(k.label, name=k.model, url=k.url) for k in keepers]
        return plan
    counts, plan.uris = job_outputs(job)
    points = MetricPoint.objects.filter(job=job).count()
    plan.goes = [
        plural(counts["artifacts"], "artifact") + (f" ({_size(counts['bytes'])} in all)" if counts["bytes"] else ""),
        plural(counts["checkpoints"], "checkpoint file"),
        plural(counts["logs"], "log file"),
        plural(points, "metric point"),
        plural(SystemMetric.objects.filter(job=job).count(), "system sample"),
        plural(JobEvent.objects.filter(job=job).count(), "timeline event"),
    ]
    return plan


def delete_job(job: TrainingJob) -> tuple[str, TrainingJob | None]:
    """Delete or archive a job. Returns ("deleted", None) or ("archived", job); raises
    DeletionBlocked when the job may not go (the message names what is in the way)."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update(of=("self",)).select_related("tuning_job").get(pk=job.pk)
        plan = job_deletion_plan(job)
        if plan.blocked:
            raise DeletionBlocked(plan)
        if plan.archive:
            if job.archived_at is None:
                job.archived_at = timezone.now()
                TrainingJob.objects.filter(pk=job.pk).update(archived_at=job.archived_at)
            return "archived", job
        erase_jobs([job], plan.uris, plan.what)
    return "deleted", None


def erase_jobs(jobs: list[TrainingJob], uris: list[str], what: str) -> None:
    """Delete job rows (their points, chunks, samples, events cascade) and record their
    store objects, inside the caller's transaction. Metric points and chunks have no
    database constraint (jobs.models), so they are deleted explicitly first."""
    from jobs.models import MetricChunk

    ids = [j.pk for j in jobs]
    MetricPoint.objects.filter(job_id__in=ids).delete()
    MetricChunk.objects.filter(job_id__in=ids).delete()
    TrainingJob.objects.filter(pk__in=ids).delete()
    record_objects(what, uris)
    transaction.on_commit(lambda: _drop_live_streams(ids))


def _drop_live_streams(job_ids: list[int]) -> None:
    from studio.redis_conn import redis_client
    from trainyard.protocol import EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM, key

    try:
        names = [key(t, pk) for pk in job_ids for t in (EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM)]
        if names:
            redis_client().delete(*names)
    except Exception:  # noqa: BLE001 - streams expire anyway; the rows are gone
        pass
