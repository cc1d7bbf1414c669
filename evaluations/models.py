"""Evaluations (docs/SPEC.md §9): a model version run over a held-out dataset version. The
report (metrics, curves, calibration before and after a temperature, the threshold
proposal) is stored on the row as JSON, the per-record scores as an artifact in the object
store, so a new proposal (another target, other costs) needs no second pass over the data.

The app sits above hosting and review (pyproject's layers): it reads model versions and
dataset versions, sets a model version's calibration (hosting owns the field) and a flow's
threshold (review owns the action); neither of those imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from studio.models import Project

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class EvaluationStatus(models.TextChoices):
    PENDING = "Pending"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"


FINISHED_EVALUATION_STATUSES = frozenset({EvaluationStatus.COMPLETED, EvaluationStatus.FAILED})


class EvaluationQuerySet(models.QuerySet["Evaluation"]):
    def readable_by(self, user: User | AnonymousUser) -> EvaluationQuerySet:
        return self.filter(project__in=Project.objects.readable_by(user))

    def unfinished(self) -> EvaluationQuerySet:
        return self.filter(status__in=[EvaluationStatus.PENDING, EvaluationStatus.RUNNING])


class Evaluation(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="evaluations")
    # A report on a version goes with it; the data it read is kept while a report cites it.
    model_version = models.ForeignKey("hosting.ModelVersion", on_delete=models.CASCADE, related_name="evaluations")
    dataset_version = models.ForeignKey("datasets.DatasetVersion", on_delete=models.PROTECT, related_name="evaluations")
    channel = models.CharField(max_length=32, blank=True)  # "" = every record of the version
    status = models.CharField(max_length=16, choices=EvaluationStatus.choices, default=EvaluationStatus.PENDING)
    failure_reason = models.TextField(blank=True)
    # How the records are split into the calibration part (temperature, threshold) and the
    # test part (the figures before and after calibration, the threshold measured).
    calibration_fraction = models.FloatField(default=0.5)
    seed = models.IntegerField(default=0)
    # The proposal's inputs: {"target_error", "delta", "flow_definition", "sample_rate", "task_count",
    # "review_cost", "error_cost"} (evaluations.actions.check_proposal_options).
    options = models.JSONField(default=dict, blank=True)
    kind = models.CharField(max_length=16, blank=True)  # the model version's kind when it ran
    labels = models.JSONField(default=list, blank=True)  # the model's labels in output order
    records_total = models.BigIntegerField(null=True, blank=True)
    records_done = models.BigIntegerField(default=0)
    report = models.JSONField(default=dict, blank=True)  # trainyard.evaluation.classification_report (all records)
    calibration = models.JSONField(default=dict, blank=True)  # temperature, before/after on the test part, isotonic
    proposal = models.JSONField(default=dict, blank=True)  # trainyard.evaluation.propose_threshold + "measured"
    artifacts = models.JSONField(default=dict, blank=True)  # {"scores": uri (npz), "per_class_csv": uri}
    duration_seconds = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[EvaluationQuerySet] = EvaluationQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # The model page's list of its evaluations, newest first.
            models.Index(fields=["model_version", "-created_at"], name="evaluation_of_version"),
            # requeue_stalled_evaluations: the unfinished ones.
            models.Index(fields=["status", "heartbeat_at"], name="evaluation_unfinished",
                         condition=models.Q(status__in=["Pending", "Running"])),
        ]

    def __str__(self) -> str:
        return f"evaluation {self.pk} of model version {self.model_version_id}: {self.status}"

    def is_finished(self) -> bool:
        return self.status in FINISHED_EVALUATION_STATUSES

    def is_classifier(self) -> bool:
        return self.kind != "generative"
