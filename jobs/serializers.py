"""Validation of job submissions at the edge: one clear message per bad field, with the
nested path (`hyperparameters.epochs`, `inputs.train`) so forms and clients can point at it."""

from __future__ import annotations

import re

from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from jobs.models import AlarmTransition, Distribution, JobRule, JobStatus, TrainingJob
from jobs.patterns import compile_pattern
from jobs.patterns import error as PatternError
from jobs.rules.common import RULE_TYPES
from jobs.sagemaker_distribution import DistributionField, SageMakerDistribution
from studio.api import KnownFieldsOnly
from studio.validators import clean_name

RESERVED_ENV_PREFIXES = ("SM_", "TRAINYARD_")
RESERVED_ENV_NAMES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                "GROUP_RANK", "ROLE_RANK", "PYTHONPATH"})
MAX_RUNTIME_LIMIT = 14 * 24 * 3600
AVAILABLE_DISTRIBUTIONS = (Distribution.NONE, Distribution.DDP, Distribution.FSDP, Distribution.PIPELINE)
PIPELINE_SCHEDULES = ("gpipe", "1f1b")


class ScriptSerializer(KnownFieldsOnly):
    uri = serializers.CharField(max_length=1024)
    entry_point = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")


class ResourcesSerializer(KnownFieldsOnly):
    instance_type = serializers.RegexField(r"^[a-z0-9][a-z0-9_-]{0,31}$", required=False, default="cpu",
                                           error_messages={"invalid": "Use a node queue name such as 'cpu' or 'gpu'."})
    instance_count = serializers.IntegerField(min_value=1, max_value=256, required=False, default=1)
    processes_per_node = serializers.IntegerField(min_value=1, max_value=256, required=False, default=None, allow_null=True)
    memory_limit_mb = serializers.IntegerField(min_value=64, required=False, allow_null=True, default=None)


class StoppingSerializer(KnownFieldsOnly):
    max_runtime_seconds = serializers.IntegerField(min_value=1, max_value=MAX_RUNTIME_LIMIT, required=False, allow_null=True)


class CheckpointSerializer(KnownFieldsOnly):
    uri = serializers.CharField(max_length=1024, required=False, allow_blank=True, default="")
    every_steps = serializers.IntegerField(min_value=0, required=False, default=0)


class MetricDefinitionSerializer(KnownFieldsOnly):
    name = serializers.RegexField(r"^[A-Za-z_][A-Za-z0-9_./:-]{0,199}$",
                                  error_messages={"invalid": "Metric names start with a letter and use letters, digits, _ . / : -"})
    regex = serializers.CharField(max_length=1000)

    def validate_regex(self, value: str) -> str:
        try:
            compiled = compile_pattern(value)  # the syntax the node agent matches with (jobs.patterns)
        except PatternError as exc:
            raise serializers.ValidationError(f"Not a valid regular expression: {exc}") from exc
        if compiled.groups < 1:
            raise serializers.ValidationError("Needs a capture group for the value, e.g. loss=([0-9.eE+-]+)")
        return value


class PipelineSerializer(KnownFieldsOnly):
    """`distribution: "pipeline"`: the model's layers cut into `stages` contiguous stages,
    one per process; each batch split into `microbatches`. With `ddp`, a world larger than
    the stages holds several pipeline replicas, data parallel across them."""

    stages = serializers.IntegerField(min_value=2, max_value=64)
    microbatches = serializers.IntegerField(min_value=1, max_value=1024, required=False, default=4)
    schedule = serializers.ChoiceField(choices=PIPELINE_SCHEDULES, required=False, default="gpipe")
    partition = serializers.JSONField(required=False, default="auto")
    memory_cap_mb = serializers.IntegerField(min_value=1, required=False, allow_null=True, default=None)
    ddp = serializers.BooleanField(required=False, default=False)

    def validate_partition(self, value):
        if value in ("auto", "even"):
            return value
        if (isinstance(value, list) and value
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
            return value
        raise serializers.ValidationError('Use "auto", "even", or a list of layer counts per stage, e.g. [3, 2].')

    def validate(self, attrs: dict) -> dict:
        partition = attrs.get("partition")
        if isinstance(partition, list) and len(partition) != attrs["stages"]:
            raise serializers.ValidationError(
                {"partition": f"Gives {len(partition)} stage(s) but stages is {attrs['stages']}; give one count per stage."})
        if not attrs.get("ddp"):
            # Stored only when true: a job's settings read as they did before the option.
            attrs.pop("ddp", None)
        return attrs


class RuleSpecSerializer(KnownFieldsOnly):
    """One rule as a submission or POST /jobs/<id>/rules/ gives it (the schema's view of it;
    jobs.rules.engine.check_rule does the checking)."""

    name = serializers.CharField(max_length=100, required=False, help_text="Unique within the job; defaults to the type.")
    type = serializers.CharField(max_length=32, help_text=(
        "non_finite, loss_not_decreasing, overfit, overtraining, stalled, max_init_time, low_gpu_utilization, "
        "step_outlier, budget, or custom (jobs.rules.engine.RULE_TYPES)."))
    parameters = serializers.DictField(required=False, help_text="The type's parameters; missing ones take their defaults.")
    actions = serializers.ListField(child=serializers.JSONField(), required=False,
                                    help_text=(
        '"stop", "notify", "tag", or objects such as {"type": "notify", "channels": ["ops"], "on": ["ALARM", "OK"]}. '
        'stop and tag act on entering ALARM; notify on every transition, or on entering the states in "on".'))
    enabled = serializers.BooleanField(required=False, default=True)


class RulePatchSerializer(RuleSpecSerializer):
    """PATCH /jobs/<id>/rules/<rule id>/: what changes; every key may be left out and keeps
    its value (no default: a generated client that sends its model whole must not turn a
    rule that was turned off back on)."""

    name = serializers.CharField(max_length=100, required=False, help_text="A new name for the rule.")
    type = serializers.CharField(max_length=32, required=False, help_text=(
        "The rule's type, which does not change: given, it must be the rule's own."))
    enabled = serializers.BooleanField(required=False, help_text="Turn the rule off (false) or on; left out, unchanged.")


class RuleChangeSerializer(RuleSpecSerializer):
    """PATCH /jobs/<id>/rules/: the rule to change, by "id" or by "name", and what changes."""

    id = serializers.IntegerField(required=False, help_text=(
        'The rule to change, by id. With an id, "name" is the rule\'s new name.'))
    name = serializers.CharField(max_length=100, required=False, help_text=(
        'The rule to change, by name, when no "id" is given.'))
    new_name = serializers.CharField(max_length=100, required=False, help_text='A new name for the rule named by "name".')
    type = serializers.CharField(max_length=32, required=False, help_text=RuleSpecSerializer().fields["type"].help_text)
    enabled = serializers.BooleanField(required=False, help_text="Turn the rule off (false) or on; left out, unchanged.")


class RuleSpecField(serializers.JSONField):
    """A rule, passed through as given: check_rules checks it whole (unknown keys included).
    An object (RuleSpecSerializer), or a bare type name: that rule with its defaults."""


class RuleSpecFieldScheme(OpenApiSerializerFieldExtension):
    """The schema of a RuleSpecField: a rule type's name or a rule object, as check_rule takes."""

    target_class = RuleSpecField

    def map_serializer_field(self, auto_schema, direction):
        rule = auto_schema.resolve_serializer(RuleSpecSerializer, direction).ref
        return {"oneOf": [{"type": "string", "enum": list(RULE_TYPES),
                           "description": "A rule of this type with its default parameters and actions."}, rule]}


class RuleSerializer(serializers.ModelSerializer):
    """A rule of a job with its state: OK, ALARM or INSUFFICIENT_DATA, why, since when, and
    the values its latest transition saw."""

    class Meta:
        model = JobRule
        fields = ["id", "name", "type", "parameters", "actions", "enabled", "state", "state_reason", "state_changed_at",
                  "state_values", "last_evaluated_at", "created_at", "updated_at"]
        read_only_fields = fields


class AlarmTransitionSerializer(serializers.ModelSerializer):
    rule = serializers.CharField(source="rule.name")
    rule_id = serializers.IntegerField()

    class Meta:
        model = AlarmTransition
        fields = ["id", "rule", "rule_id", "from_state", "to_state", "at", "step", "reason", "values", "actions_taken"]
        read_only_fields = fields


class JobCreateSerializer(KnownFieldsOnly):
    project = serializers.CharField(max_length=63)
    name = serializers.CharField(max_length=200)
    algorithm = serializers.CharField(max_length=64, required=False, allow_blank=True, default="")
    script = ScriptSerializer(required=False, allow_null=True, default=None)
    hyperparameters = serializers.DictField(required=False, default=dict)
    # channel → {"dataset_version": id, "mode": "file"|"stream"} or channel → id
    inputs = serializers.DictField(required=False, default=dict)
    resources = ResourcesSerializer(required=False, default=dict)
    # Our word, or a SageMaker estimator's `distribution` object (jobs.sagemaker_distribution).
    distribution = DistributionField(choices=Distribution.choices, required=False, default=Distribution.NONE)
    pipeline = PipelineSerializer(required=False, allow_null=True, default=None)
    priority = serializers.IntegerField(min_value=-100, max_value=100, required=False, default=0)
    stopping = StoppingSerializer(required=False, default=dict)
    checkpoint = CheckpointSerializer(required=False, allow_null=True, default=None)
    keep_alive_seconds = serializers.IntegerField(min_value=0, max_value=3600, required=False, default=0)
    retries = serializers.IntegerField(min_value=0, max_value=10, required=False, default=0)
    metric_definitions = MetricDefinitionSerializer(many=True, required=False, default=list)
    environment = serializers.DictField(child=serializers.CharField(allow_blank=True, max_length=10_000), required=False, default=dict)
    tags = serializers.ListField(child=serializers.CharField(max_length=100), required=False, default=list, max_length=50)
    # Rules on the job's metric stream (jobs.rules): checked by jobs.rules.engine.check_rules in
    # check_submission, which names the bad field (`rules[1].parameters.window`). `non_finite`
    # is added unless given (turn it off with {"type": "non_finite", "enabled": false}).
    rules = serializers.ListField(child=RuleSpecField(), required=False, default=list, max_length=100)

    def validate_name(self, value: str) -> str:
        return clean_name(value)

    def validate_distribution(self, value: str | SageMakerDistribution) -> str | SageMakerDistribution:
        if isinstance(value, str) and value not in AVAILABLE_DISTRIBUTIONS:
            raise serializers.ValidationError(
                f"'{value}' is not available in this build yet; use 'none' or 'ddp' (multi-process data parallel)."
            )
        return value

    def validate_environment(self, value: dict) -> dict:
        for name in value:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
                raise serializers.ValidationError(f"'{name}' is not a valid environment variable name.")
            if name.startswith(RESERVED_ENV_PREFIXES) or name in RESERVED_ENV_NAMES:
                raise serializers.ValidationError(f"'{name}' is set by Trainyard for every job and cannot be overridden.")
        return value

    def validate_hyperparameters(self, value: dict) -> dict:
        for name, item in value.items():
            if not isinstance(item, (str, int, float, bool)) or item is None:
                raise serializers.ValidationError({name: "Hyperparameters are strings, numbers or booleans."})
        return value

    def validate(self, attrs: dict) -> dict:
        has_algorithm = bool(attrs.get("algorithm"))
        has_script = bool(attrs.get("script"))
        if has_algorithm == has_script:
            raise serializers.ValidationError({"algorithm": "Give either an algorithm (a built-in) or a script, not both or neither."})
        if isinstance(attrs.get("distribution"), SageMakerDistribution):
            attrs = self.apply_sagemaker_distribution(attrs, attrs["distribution"])
        if attrs.get("distribution") == Distribution.PIPELINE and not attrs.get("pipeline"):
            raise serializers.ValidationError({"pipeline": 'distribution "pipeline" needs pipeline: {"stages": K, ...}.'})
        if attrs.get("pipeline") and attrs.get("distribution") != Distribution.PIPELINE:
            raise serializers.ValidationError({"pipeline": 'pipeline settings apply only with distribution "pipeline".'})
        return attrs

    @staticmethod
    def apply_sagemaker_distribution(attrs: dict, mapped: SageMakerDistribution) -> dict:
        """The submission as if it had said the same in our own words: the distribution's
        word, its `pipeline` settings and `resources.processes_per_node` (from mpi)."""
        if attrs.get("pipeline"):
            raise serializers.ValidationError({"pipeline": (
                "A SageMaker distribution object sets the pipeline itself (smdistributed.modelparallel.parameters); "
                'drop pipeline, or give distribution "pipeline" with it.')})
        attrs = {**attrs, "distribution": mapped.kind, "pipeline": mapped.pipeline}
        if mapped.processes_per_node is not None:
            given = (attrs.get("resources") or {}).get("processes_per_node")
            if given is not None and given != mapped.processes_per_node:
                raise serializers.ValidationError({"distribution": (
                    f"mpi.processes_per_host is {mapped.processes_per_node} but resources.processes_per_node is "
                    f"{given}; give one of them.")})
            # As if `resources` had said it: the other resources at their defaults when not given.
            resources = ResourcesSerializer(data={**(attrs.get("resources") or {}),
                                                  "processes_per_node": mapped.processes_per_node})
            resources.is_valid(raise_exception=True)
            attrs["resources"] = dict(resources.validated_data)
        return attrs


class JobCostListSerializer(serializers.ListSerializer):
    """A page of jobs with their cost figures computed for the whole page at once
    (jobs.cost.job_costs: three queries, however many jobs)."""

    def to_representation(self, data):
        from django.db.models.manager import BaseManager

        from jobs.cost import job_costs

        jobs = list(data.all() if isinstance(data, BaseManager) else data)
        self.child._costs = job_costs(jobs)  # type: ignore[union-attr]
        return [self.child.to_representation(job) for job in jobs]  # type: ignore[union-attr]


COST_FIELDS = ["training_time_seconds", "billable_time_seconds", "warm_pool_seconds", "cost", "currency",
               "projected_cost"]
COST_DECIMAL = serializers.DecimalField(max_digits=20, decimal_places=6, help_text=(
    "Summed over the attempts and their nodes: (billable + warm-pool seconds) × the price per node-hour snapshotted "
    "when each launch was placed. A finished job's cost is fixed: changing a price later never changes it."))


class JobCostFields(serializers.Serializer):
    """Read-only cost figures of a job (jobs.cost.job_cost), summed over its attempts —
    retries after a lost node included — and over each attempt's nodes."""

    training_time_seconds = serializers.SerializerMethodField(help_text=(
        "Seconds from the job turning Training to each launch's end, summed over attempts and nodes."))
    billable_time_seconds = serializers.SerializerMethodField(help_text=(
        "Seconds from each launch's start (Starting) to its end, summed over attempts and nodes; warm-pool time apart."))
    warm_pool_seconds = serializers.SerializerMethodField(help_text=(
        "Seconds its nodes were then held in a warm pool for it (keep_alive_seconds); billed, shown apart."))
    cost = serializers.SerializerMethodField()
    currency = serializers.SerializerMethodField()
    projected_cost = serializers.SerializerMethodField(help_text=(
        "While it runs: the cost at the end of its planned max_steps (or epochs) at its step rate so far; null "
        "when finished or when its length or rate cannot be known yet."))

    def _figures(self, job: TrainingJob) -> dict:
        from jobs.cost import job_costs

        costs = getattr(self, "_costs", None)
        if costs is None or job.pk not in costs:
            costs = {**(costs or {}), **job_costs([job])}
            self._costs = costs
        return costs[job.pk]

    @extend_schema_field(serializers.FloatField())
    def get_training_time_seconds(self, job: TrainingJob) -> float:
        return self._figures(job)["training_time_seconds"]

    @extend_schema_field(serializers.FloatField())
    def get_billable_time_seconds(self, job: TrainingJob) -> float:
        return self._figures(job)["billable_time_seconds"]

    @extend_schema_field(serializers.FloatField())
    def get_warm_pool_seconds(self, job: TrainingJob) -> float:
        return self._figures(job)["warm_pool_seconds"]

    @extend_schema_field(COST_DECIMAL)
    def get_cost(self, job: TrainingJob) -> str:
        return self._figures(job)["cost"]

    @extend_schema_field(serializers.CharField(help_text="ISO 4217, as the prices say (STUDIO_CURRENCY by default)."))
    def get_currency(self, job: TrainingJob) -> str:
        return self._figures(job)["currency"]

    @extend_schema_field(serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True))
    def get_projected_cost(self, job: TrainingJob) -> str | None:
        return self._figures(job)["projected_cost"]


class AttemptCostSerializer(serializers.Serializer):
    attempt = serializers.IntegerField()
    nodes = serializers.IntegerField()
    billable_seconds = serializers.FloatField()
    training_seconds = serializers.FloatField()
    warm_seconds = serializers.FloatField()
    price_per_hour = serializers.DecimalField(max_digits=20, decimal_places=6, allow_null=True,
                                              help_text="Per node-hour, snapshotted when the attempt was placed.")
    currency = serializers.CharField()
    cost = serializers.DecimalField(max_digits=20, decimal_places=6)
    running = serializers.BooleanField()


class JobSerializer(JobCostFields, serializers.ModelSerializer):
    project = serializers.CharField(source="project.slug")
    inputs = serializers.SerializerMethodField()
    timeline = serializers.SerializerMethodField()
    script = serializers.SerializerMethodField()
    created_by = serializers.CharField(source="created_by.username", default=None)
    # {"count", "source": "channel"|"held_out", "few": count < 30} or null (jobs.validation_size).
    validation_records = serializers.SerializerMethodField()
    rules = RuleSerializer(many=True, read_only=True)
    cost_attempts = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = [
            "validation_records",
            "id", "project", "name", "status", "failure_reason", "stop_reason", "waiting_reason", "algorithm", "script",
            "hyperparameters", "inputs", "resources", "distribution", "pipeline", "priority", "stopping", "checkpoint",
            "keep_alive_seconds", "retries", "metric_definitions", "environment", "tags", "attempt", "output_uri",
            "model_uri", "final_metrics", "created_by", "created_at", "started_at", "training_started_at", "finished_at",
            "warm_pool", "details", "tuning_job", "trial_number", "trial_params", "objective_value", "timeline",
            "archived_at", "stop_rule", "rules", *COST_FIELDS, "cost_attempts",
        ]

    @extend_schema_field(AttemptCostSerializer(many=True))
    def get_cost_attempts(self, job: TrainingJob) -> list[dict]:
        """Per attempt: its nodes, seconds, snapshotted price and cost."""
        return self._figures(job)["attempts"]

    def get_inputs(self, job: TrainingJob) -> dict:
        return {
            i.channel: {"dataset_version": i.dataset_version_id, "dataset": i.dataset_version.dataset.name,
                        "version": i.dataset_version.version, "mode": i.mode}
            for i in job.inputs.all()
        }

    def get_timeline(self, job: TrainingJob) -> list[dict]:
        return [{"status": e.status, "at": e.at, "message": e.message, "attempt": e.attempt} for e in job.events.all()]

    def get_script(self, job: TrainingJob) -> dict | None:
        return {"uri": job.script_uri, "entry_point": job.entry_point} if job.script_uri else None

    def get_validation_records(self, job: TrainingJob) -> dict | None:
        from jobs.validation_size import validation_records

        return dict(validation_records(job) or {}) or None


class JobSummarySerializer(JobCostFields, serializers.ModelSerializer):
    project = serializers.CharField(source="project.slug")

    class Meta:
        model = TrainingJob
        fields = ["id", "project", "name", "status", "algorithm", "tags", "attempt", "priority", "final_metrics",
                  "failure_reason", "warm_pool", "created_at", "started_at", "finished_at", "archived_at", *COST_FIELDS]
        list_serializer_class = JobCostListSerializer


STOPPABLE = (JobStatus.PENDING, JobStatus.STARTING, JobStatus.TRAINING)
