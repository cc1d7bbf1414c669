from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from studio.models import Project


class JobStatus(models.TextChoices):
    PENDING = "Pending"
    STARTING = "Starting"
    TRAINING = "Training"
    UPLOADING = "Uploading"
    COMPLETED = "Completed"
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    FAILED = "Failed"


FINISHED_STATUSES = frozenset({JobStatus.COMPLETED, JobStatus.STOPPED, JobStatus.FAILED})


class TrainingJobQuerySet(models.QuerySet["TrainingJob"]):
    def unfinished(self) -> TrainingJobQuerySet:
        return self.exclude(status__in=FINISHED_STATUSES)

    def running(self) -> TrainingJobQuerySet:
        return self.filter(status__in=[JobStatus.STARTING, JobStatus.TRAINING, JobStatus.UPLOADING, JobStatus.STOPPING])


class TrainingJob(models.Model):
    """One run of an algorithm on dataset versions (SPEC §3). The runner arrives with the
    training-jobs work; this row is what the rest of the studio refers to."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="training_jobs")
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING, db_index=True)
    failure_reason = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[TrainingJobQuerySet] = TrainingJobQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES


class JobInput(models.Model):
    """A channel of a job bound to a dataset version. PROTECT: a version that any job
    read keeps its row, so a job's lineage never dangles."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="inputs")
    channel = models.CharField(max_length=64)
    dataset_version = models.ForeignKey("datasets.DatasetVersion", on_delete=models.PROTECT, related_name="job_inputs")
    mode = models.CharField(max_length=8, default="file")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "channel"], name="one_version_per_channel")]


def job_uses_dataset_version(version_id: int) -> bool:
    return JobInput.objects.filter(dataset_version_id=version_id).exists()


class NodeState(models.TextChoices):
    IDLE = "idle"
    BUSY = "busy"
    WARM = "warm"
    LOST = "lost"
    STOPPED = "stopped"


class NodeQuerySet(models.QuerySet["Node"]):
    def live(self) -> NodeQuerySet:
        cutoff = timezone.now() - timedelta(seconds=settings.STUDIO_NODE_LOST_SECONDS)
        return self.filter(last_heartbeat__gte=cutoff).exclude(state__in=[NodeState.LOST, NodeState.STOPPED])

    def overdue(self) -> NodeQuerySet:
        """Nodes whose heartbeats stopped: the lost-node sweep marks them lost."""
        cutoff = timezone.now() - timedelta(seconds=settings.STUDIO_NODE_LOST_SECONDS)
        return self.filter(last_heartbeat__lt=cutoff).exclude(state__in=[NodeState.LOST, NodeState.STOPPED])


class Node(models.Model):
    """A worker machine (or a simulated one) that runs job processes."""

    name = models.CharField(max_length=200, unique=True)
    hostname = models.CharField(max_length=200)
    instance_type = models.CharField(max_length=64, default="cpu", db_index=True)
    queue = models.CharField(max_length=255, help_text="The node's own Celery queue.")
    cpus = models.PositiveIntegerField(default=1)
    memory_bytes = models.BigIntegerField(default=0)
    gpus = models.PositiveIntegerField(default=0)
    version = models.CharField(max_length=64, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.IDLE, db_index=True)
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now)

    objects: ClassVar[NodeQuerySet] = NodeQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["instance_type", "name"]

    def __str__(self) -> str:
        return self.name

    def seconds_since_heartbeat(self) -> float:
        return (timezone.now() - self.last_heartbeat).total_seconds()
