"""Models and endpoints (docs/SPEC.md §2): a Model is a name in a project whose numbered versions
are finished training jobs' artifacts; an Endpoint serves one model version (and may send
uncertain predictions to a review flow); a BatchPrediction runs a model version over a
dataset version and writes JSONL predictions to the object store."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from studio.models import Project

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class ModelKind(models.TextChoices):
    TABULAR = "tabular"  # instances are objects of feature values (a CSV row)
    TEXT = "text"  # instances are strings
    IMAGE = "image"  # instances are base64 images (or {"b64": ...})
    GENERATIVE = "generative"  # char-lm: instances are prompts


class ModelQuerySet(models.QuerySet["Model"]):
    def readable_by(self, user: User | AnonymousUser) -> ModelQuerySet:
        return self.filter(project__in=Project.objects.readable_by(user))


class Model(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="models")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[ModelQuerySet] = ModelQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="model_name_unique_in_project")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"

    def latest_version(self) -> ModelVersion | None:
        return self.versions.order_by("-version").first()


class ModelVersion(models.Model):
    """A finished job's artifact, frozen at registration: what it was trained on and how
    (copied, so the job's later deletion does not change what the version says)."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    job = models.ForeignKey("jobs.TrainingJob", null=True, on_delete=models.SET_NULL, related_name="model_versions")
    artifact_uri = models.CharField(max_length=1024)  # the job's model.tar.gz
    algorithm = models.CharField(max_length=64, blank=True)
    kind = models.CharField(max_length=16, choices=ModelKind.choices)
    labels = models.JSONField(default=list, blank=True)  # classifier labels in output order
    input_schema = models.JSONField(default=dict, blank=True)  # e.g. {"columns": [...], "label_column": ...}
    metrics = models.JSONField(default=dict, blank=True)  # the job's final metrics
    hyperparameters = models.JSONField(default=dict, blank=True)
    dataset_versions = models.JSONField(default=dict, blank=True)  # channel → dataset version id
    # How served confidences are calibrated, set from an evaluation (evaluations.actions):
    # {} (the model's own softmax), {"method": "temperature", "temperature": T, "evaluation": id,
    # "set_at": iso} or {"method": "isotonic", "x": [...], "y": [...], "evaluation": id, "set_at": iso}.
    calibration = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["model", "-version"]
        constraints = [models.UniqueConstraint(fields=["model", "version"], name="one_number_per_model_version")]

    def __str__(self) -> str:
        return f"{self.model}:v{self.version}"


class EndpointQuerySet(models.QuerySet["Endpoint"]):
    def readable_by(self, user: User | AnonymousUser) -> EndpointQuerySet:
        return self.filter(project__in=Project.objects.readable_by(user))


class Endpoint(models.Model):
    """A deployed model version. Names are unique across the studio because invocations
    address an endpoint by name alone (POST /api/v1/endpoints/<name>/invocations).
    Switching versions is one UPDATE of model_version: every request reads the row once
    and serves from the version it read, so none fails mid-switch."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="endpoints")
    name = models.CharField(max_length=63, unique=True)
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="endpoints")
    flow_definition = models.ForeignKey("review.FlowDefinition", null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="endpoints")
    invocations = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[EndpointQuerySet] = EndpointQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["project", "name"]

    def __str__(self) -> str:
        return self.name


class BatchStatus(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"


class BatchPrediction(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="batch_predictions")
    model_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="batch_predictions")
    dataset_version = models.ForeignKey("datasets.DatasetVersion", on_delete=models.PROTECT, related_name="batch_predictions")
    flow_definition = models.ForeignKey("review.FlowDefinition", null=True, blank=True, on_delete=models.SET_NULL,
                                        related_name="batch_predictions")
    status = models.CharField(max_length=16, choices=BatchStatus.choices, default=BatchStatus.PENDING)
    failure_reason = models.TextField(blank=True)
    output_uri = models.CharField(max_length=1024, blank=True)  # predictions.jsonl
    records_total = models.BigIntegerField(null=True, blank=True)
    records_done = models.BigIntegerField(default=0)
    human_loops_started = models.BigIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"batch prediction {self.pk} with model version {self.model_version_id}: {self.status}"
