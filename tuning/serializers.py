"""Validation of tuning job submissions at the edge (shapes, ranges, counts) and their
JSON. Checks that need the database or the algorithm's schema are in tuning.actions."""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import FINISHED_STATUSES, PRUNED_STOP_REASONS, RULE_TRIGGERED, JobStatus, TrainingJob
from jobs.serializers import JobCreateSerializer
from studio.api import KnownFieldsOnly
from studio.validators import clean_name
from tuning import ranges
from tuning.models import EarlyStopping, Strategy, TuningJob

MAX_TRIALS = 1000
MAX_PARALLEL = 100
MAX_WARM_START_JOBS = 5
MAX_RUNTIME_LIMIT = 30 * 24 * 3600
# Trials are named "<tuning name>-<number>": the name leaves room for "-1000" in 200 characters.
NAME_MAX_LENGTH = 190
GOALS = ("maximize", "minimize")


class BaseJobSerializer(JobCreateSerializer):
    """A job spec as POST /api/v1/jobs/ takes it; project and name come from the tuning job."""

    project = serializers.CharField(max_length=63, required=False, allow_blank=True, default="")
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")

    def validate_name(self, value: str) -> str:
        return value.strip()


class ObjectiveSerializer(KnownFieldsOnly):
    metric = serializers.RegexField(r"^[A-Za-z_][A-Za-z0-9_./:-]{0,199}$", error_messages={
        "invalid": "Metric names start with a letter and use letters, digits, _ . / : -"})
    goal = serializers.ChoiceField(choices=GOALS)


@extend_schema_field({
    "type": "object",
    "description": "hyperparameter name → range: {\"type\": \"continuous\", \"min\", \"max\", \"scale\": "
                   "\"linear\"|\"log\", \"step\"?} | {\"type\": \"integer\", \"min\", \"max\", \"scale\"?, \"step\"?} | "
                   "{\"type\": \"categorical\", \"values\": [...]}",
    "additionalProperties": {"type": "object", "additionalProperties": {}},
})
class ParameterRangesField(serializers.DictField):
    pass


class TuningJobCreateSerializer(KnownFieldsOnly):
    project = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=NAME_MAX_LENGTH)
    base_job = BaseJobSerializer()
    parameter_ranges = ParameterRangesField()
    # Optional for a built-in algorithm: its default objective.
    objective = ObjectiveSerializer(required=False, allow_null=True, default=None)
    strategy = serializers.ChoiceField(choices=Strategy.choices, required=False, default=Strategy.BAYESIAN)
    max_trials = serializers.IntegerField(min_value=1, max_value=MAX_TRIALS)
    max_parallel = serializers.IntegerField(min_value=1, max_value=MAX_PARALLEL, required=False, default=1)
    # Default "off"; "hyperband" for strategy "hyperband".
    early_stopping = serializers.ChoiceField(choices=EarlyStopping.choices, required=False, allow_null=True,
                                             default=None)
    target_value = serializers.FloatField(required=False, allow_null=True, default=None)
    max_runtime_seconds = serializers.IntegerField(min_value=1, max_value=MAX_RUNTIME_LIMIT, required=False,
                                                   allow_null=True, default=None)
    # Omitted: a random seed, stored with the job (the search is reproducible from it).
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False, allow_null=True, default=None)
    warm_start_from = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False, default=list,
                                            max_length=MAX_WARM_START_JOBS)

    def validate_name(self, value: str) -> str:
        return clean_name(value)

    def validate_parameter_ranges(self, value: dict) -> dict:
        clean, errors = ranges.check_ranges(value)
        if "" in errors:
            raise serializers.ValidationError(errors[""])
        if errors:
            raise serializers.ValidationError(errors)
        return clean

    def validate_target_value(self, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise serializers.ValidationError("Give a finite number.")
        return value

    def validate_warm_start_from(self, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("A tuning job is listed twice.")
        return value

    def validate(self, attrs: dict) -> dict:
        if attrs["max_parallel"] > attrs["max_trials"]:
            raise serializers.ValidationError({"max_parallel": (
                f"max_parallel ({attrs['max_parallel']}) is more than max_trials ({attrs['max_trials']}); at most "
                "max_trials trials ever run.")})
        strategy, early_stopping = attrs["strategy"], attrs.get("early_stopping")
        if strategy == Strategy.HYPERBAND:
            if early_stopping not in (None, EarlyStopping.HYPERBAND):
                raise serializers.ValidationError({"early_stopping": (
                    f"Strategy 'hyperband' stops trials with its own Hyperband pruner; leave early_stopping out "
                    f"(or set it to 'hyperband'), not '{early_stopping}'.")})
            attrs["early_stopping"] = EarlyStopping.HYPERBAND
        elif early_stopping is None:
            attrs["early_stopping"] = EarlyStopping.OFF
        if strategy == Strategy.GRID:
            continuous = [name for name, spec in sorted(attrs["parameter_ranges"].items()) if not ranges.is_discrete(spec)]
            if continuous:
                raise serializers.ValidationError({"parameter_ranges": {name: {"type": (
                    "A grid search needs discrete ranges: give this continuous range a step, or list the values to "
                    'try as {"type": "categorical", "values": [...]}.')} for name in continuous}})
        if attrs.get("objective") is None and not attrs["base_job"].get("algorithm"):
            raise serializers.ValidationError({"objective": (
                'A script\'s search needs an objective: {"metric": "<a metric it logs>", "goal": "minimize"}.')})
        return attrs


# --- responses --------------------------------------------------------------------------------
class TrialSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrainingJob
        fields = ["id", "name", "trial_number", "status", "stop_reason", "stop_rule", "failure_reason",
                  "objective_value", "trial_params", "started_at", "finished_at"]


class BestTrialSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrainingJob
        fields = ["id", "name", "trial_number", "objective_value", "trial_params"]


class TrialCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    pending = serializers.IntegerField()
    running = serializers.IntegerField(help_text="Starting, Training, Uploading or Stopping")
    completed = serializers.IntegerField()
    stopped = serializers.IntegerField(help_text="Including early stopped")
    early_stopped = serializers.IntegerField(help_text="Pruned: stopped by the search's early stopping or by one of "
                                                       "their rules (also counted in stopped)")
    rule_stopped = serializers.IntegerField(help_text="Of early_stopped, those one of their rules stopped (RuleTriggered)")
    failed = serializers.IntegerField()


def trial_counts(rows: list[tuple[str, str, int]]) -> dict[str, int]:
    """Counts by status from (status, stop_reason, count) rows of one tuning job's trials."""
    counts = dict.fromkeys(TrialCountsSerializer().fields, 0)
    for status, stop_reason, count in rows:
        counts["total"] += count
        if status == JobStatus.PENDING:
            counts["pending"] += count
        elif status not in FINISHED_STATUSES:
            counts["running"] += count
        elif status == JobStatus.COMPLETED:
            counts["completed"] += count
        elif status == JobStatus.FAILED:
            counts["failed"] += count
        else:
            counts["stopped"] += count
            if stop_reason in PRUNED_STOP_REASONS:  # the pruner's or a rule's stop
                counts["early_stopped"] += count
            if stop_reason == RULE_TRIGGERED:
                counts["rule_stopped"] += count
    return counts


class TuningJobSummarySerializer(serializers.ModelSerializer):
    """A row of the list. `trial_counts` come from the view's context ({tuning id: counts})."""

    project = serializers.CharField(source="project.slug")
    best_trial = BestTrialSerializer(allow_null=True)
    trial_counts = serializers.SerializerMethodField()
    elapsed_seconds = serializers.SerializerMethodField()

    class Meta:
        model = TuningJob
        fields = ["id", "project", "name", "status", "strategy", "objective", "max_trials", "max_parallel",
                  "early_stopping", "best_value", "best_trial", "end_reason", "failure_reason", "trial_counts",
                  "created_at", "started_at", "finished_at", "elapsed_seconds", "archived_at"]

    @extend_schema_field(TrialCountsSerializer)
    def get_trial_counts(self, tuning: TuningJob) -> dict[str, int]:
        return self.context["trial_counts"].get(tuning.pk) or trial_counts([])

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_elapsed_seconds(self, tuning: TuningJob) -> float | None:
        return tuning.elapsed_seconds()


class TuningCostSerializer(serializers.Serializer):
    """The search's cost: the sum over its trials, each over its attempts and nodes, at the
    prices each launch snapshotted (jobs.cost.tuning_cost)."""

    trials = serializers.IntegerField()
    training_time_seconds = serializers.FloatField()
    billable_time_seconds = serializers.FloatField()
    warm_pool_seconds = serializers.FloatField()
    cost = serializers.DecimalField(max_digits=20, decimal_places=6)
    cost_display = serializers.DecimalField(max_digits=20, decimal_places=2)
    currency = serializers.CharField()


class TuningJobSerializer(TuningJobSummarySerializer):
    """One tuning job with its trials (ordered by number). Context: "trials" (the trials)."""

    created_by = serializers.CharField(source="created_by.username", default=None)
    warm_start_from = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    trials = serializers.SerializerMethodField()
    cost = serializers.SerializerMethodField()

    class Meta(TuningJobSummarySerializer.Meta):
        fields = [*TuningJobSummarySerializer.Meta.fields, "base_job", "parameter_ranges", "target_value",
                  "max_runtime_seconds", "seed", "warm_start_from", "created_by", "trials", "cost"]

    @extend_schema_field(TuningCostSerializer)
    def get_cost(self, tuning: TuningJob) -> dict[str, Any]:
        from jobs.cost import tuning_cost

        # Its own read of the trials: the context's have only the fields the trial rows show.
        return tuning_cost(tuning)

    @extend_schema_field(TrialCountsSerializer)
    def get_trial_counts(self, tuning: TuningJob) -> dict[str, int]:
        rows: dict[tuple[str, str], int] = {}
        for trial in self.context["trials"]:
            key = (trial.status, trial.stop_reason)
            rows[key] = rows.get(key, 0) + 1
        return trial_counts([(status, reason, count) for (status, reason), count in rows.items()])

    @extend_schema_field(TrialSerializer(many=True))
    def get_trials(self, tuning: TuningJob) -> list[dict[str, Any]]:
        return TrialSerializer(self.context["trials"], many=True).data
