"""Hyperparameter searches: a TuningJob runs TrainingJobs as its trials (jobs.models:
TrainingJob.tuning_job, trial_number, trial_params, objective_value, intermediate_values).

All of a search's state is in these rows and its trials' rows; tuning.engine rebuilds the
Optuna study from them on every tick, so a control worker that restarts loses nothing."""

from __future__ import annotations

from typing import ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from studio.models import Project


class TuningStatus(models.TextChoices):
    IN_PROGRESS = "InProgress"
    STOPPING = "Stopping"
    COMPLETED = "Completed"
    STOPPED = "Stopped"
    FAILED = "Failed"


FINISHED_TUNING_STATUSES = frozenset({TuningStatus.COMPLETED, TuningStatus.STOPPED, TuningStatus.FAILED})


class Strategy(models.TextChoices):
    RANDOM = "random"
    GRID = "grid"
    BAYESIAN = "bayesian"
    HYPERBAND = "hyperband"


class EarlyStopping(models.TextChoices):
    OFF = "off"
    MEDIAN = "median"
    HYPERBAND = "hyperband"


class EndReason(models.TextChoices):
    MAX_TRIALS_REACHED = "MaxTrialsReached"
    GRID_EXHAUSTED = "GridExhausted"  # every grid point ran (max_trials may be larger)
    TARGET_VALUE_REACHED = "TargetValueReached"
    MAX_RUNTIME_EXCEEDED = "MaxRuntimeExceeded"
    STOP_REQUESTED = "StopRequested"
    ALL_TRIALS_FAILED = "AllTrialsFailed"


class TuningJobQuerySet(models.QuerySet["TuningJob"]):
    def not_archived(self) -> TuningJobQuerySet:
        return self.filter(archived_at__isnull=True)

    def active(self) -> TuningJobQuerySet:
        """The searches the engine advances."""
        return self.filter(status__in=[TuningStatus.IN_PROGRESS, TuningStatus.STOPPING])


class TuningJob(models.Model):
    """A hyperparameter search (docs/SPEC.md §2). `base_job` is a job spec as POST /api/v1/jobs/
    takes it (validated, without project and name) minus the tuned hyperparameters;
    `parameter_ranges` says what to tune:

        {"lr": {"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"},
         "layers": {"type": "integer", "min": 1, "max": 4},
         "optimizer": {"type": "categorical", "values": ["adam", "sgd"]}}

    `objective` is {"metric": name, "goal": "maximize" | "minimize"}."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="tuning_jobs")
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=TuningStatus.choices, default=TuningStatus.IN_PROGRESS,
                              db_index=True)
    base_job = models.JSONField()
    parameter_ranges = models.JSONField()
    objective = models.JSONField()
    strategy = models.CharField(max_length=16, choices=Strategy.choices)
    max_trials = models.PositiveIntegerField()
    max_parallel = models.PositiveIntegerField()
    early_stopping = models.CharField(max_length=16, choices=EarlyStopping.choices, default=EarlyStopping.OFF)
    target_value = models.FloatField(null=True, blank=True)
    max_runtime_seconds = models.PositiveIntegerField(null=True, blank=True)
    seed = models.IntegerField(default=0)
    warm_start_from = models.ManyToManyField("self", symmetrical=False, blank=True, related_name="+")
    best_trial = models.ForeignKey("jobs.TrainingJob", null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    best_value = models.FloatField(null=True, blank=True)
    end_reason = models.CharField(max_length=64, blank=True)
    failure_reason = models.TextField(blank=True)
    # What the Hyperband pruner must remember between ticks (tuning.engine): the maximum
    # resource fixed by the first completed trial, and each trial's completed rungs.
    pruner_state = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Set when a delete had to keep the search (a registered model came from one of its
    # trials, tuning.deletion): lists hide it unless asked (?archived=true).
    archived_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[TuningJobQuerySet] = TuningJobQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The tuning list of a project, newest first.
            models.Index(fields=["project", "-created_at"], name="tuning_project_created"),
        ]

    def __str__(self) -> str:
        return self.name

    def is_finished(self) -> bool:
        return self.status in FINISHED_TUNING_STATUSES

    @property
    def metric(self) -> str:
        return str(self.objective.get("metric", ""))

    @property
    def maximize(self) -> bool:
        return self.objective.get("goal") == "maximize"

    def better(self, value: float, than: float | None) -> bool:
        """Whether `value` beats `than` (None: anything does) for this search's goal."""
        if than is None:
            return True
        return value > than if self.maximize else value < than

    def reaches_target(self, value: float) -> bool:
        if self.target_value is None:
            return False
        return value >= self.target_value if self.maximize else value <= self.target_value

    def elapsed_seconds(self) -> float | None:
        if self.started_at is None:
            return None
        end = self.finished_at or timezone.now()
        return max(0.0, (end - self.started_at).total_seconds())
