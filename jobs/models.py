from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

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
# stop_reason values: a person (or a search that ended) asked; a tuning job's pruner stopped a
# trial that was doing worse than its peers.
STOP_REQUESTED = "StopRequested"
EARLY_STOPPED = "EarlyStopped"
# A rule on the job's metric stream (JobRule with a "stop" action) ended it; `stop_rule` names it.
RULE_TRIGGERED = "RuleTriggered"
# Stop reasons a tuning job counts as a pruned trial.
PRUNED_STOP_REASONS = frozenset({EARLY_STOPPED, RULE_TRIGGERED})


class TrainingJobQuerySet(models.QuerySet["TrainingJob"]):
    def unfinished(self) -> TrainingJobQuerySet:
        return self.exclude(status__in=FINISHED_STATUSES)

    def not_archived(self) -> TrainingJobQuerySet:
        return self.filter(archived_at__isnull=True)

    def running(self) -> TrainingJobQuerySet:
        return self.filter(status__in=[JobStatus.STARTING, JobStatus.TRAINING, JobStatus.UPLOADING, JobStatus.STOPPING])


class Distribution(models.TextChoices):
    NONE = "none"
    DDP = "ddp"
    FSDP = "fsdp"
    PIPELINE = "pipeline"


class TrainingJob(models.Model):
    """One run of an algorithm or a script on dataset versions (docs/SPEC.md §3).

    Request fields keep the API's names. `attempt` counts launches (a node loss re-queues
    the job with attempt + 1); `lease_expires_at` is the node agent's claim, renewed by its
    heartbeat, so a job whose agent died is noticed without the broker's help."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="training_jobs")
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.PENDING, db_index=True)
    failure_reason = models.TextField(blank=True)
    # What to run: a built-in algorithm by name, or a script in the object store.
    algorithm = models.CharField(max_length=64, blank=True)
    script_uri = models.CharField(max_length=1024, blank=True)
    entry_point = models.CharField(max_length=255, blank=True)
    hyperparameters = models.JSONField(default=dict, blank=True)
    # {"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1}
    resources = models.JSONField(default=dict, blank=True)
    distribution = models.CharField(max_length=16, choices=Distribution.choices, default=Distribution.NONE)
    # distribution "pipeline": {"stages", "microbatches", "schedule", "partition"} (jobs.serializers)
    pipeline = models.JSONField(default=dict, blank=True)
    # Higher first; FIFO within a priority.
    priority = models.IntegerField(default=0)
    stopping = models.JSONField(default=dict, blank=True)  # {"max_runtime_seconds": N}
    checkpoint = models.JSONField(default=dict, blank=True)  # {"uri": "...", "every_steps": N}
    keep_alive_seconds = models.PositiveIntegerField(default=0)
    retries = models.PositiveIntegerField(default=0)
    metric_definitions = models.JSONField(default=list, blank=True)  # [{"name", "regex"}]
    environment = models.JSONField(default=dict, blank=True)
    tags = models.JSONField(default=list, blank=True)
    # Outcome.
    attempt = models.PositiveIntegerField(default=0)
    output_uri = models.CharField(max_length=1024, blank=True)
    model_uri = models.CharField(max_length=1024, blank=True)
    final_metrics = models.JSONField(default=dict, blank=True)
    stop_reason = models.CharField(max_length=64, blank=True)
    stop_rule = models.CharField(max_length=100, blank=True)  # the rule that stopped it (stop_reason RuleTriggered)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    training_started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    waiting_reason = models.CharField(max_length=300, blank=True)
    # What the training processes reported about themselves (TRAINYARD_REPORT_DIR/<name>.json,
    # read by node 0's agent): e.g. "partition" for a pipeline run, "fsdp" for a sharded one.
    details = models.JSONField(default=dict, blank=True)
    # The warm pool the current attempt started in ("" = a cold start).
    warm_pool = models.CharField(max_length=64, blank=True)
    # A trial of a hyperparameter search (tuning.engine): its number within the search, the
    # tuned values only, the objective's last value once it ended, and the objective's
    # {step: value} series the pruner saw (frozen at the step where it was pruned).
    # No index of its own: the unique (tuning_job, trial_number) index serves lookups by search.
    tuning_job = models.ForeignKey("tuning.TuningJob", null=True, blank=True, on_delete=models.CASCADE,
                                   related_name="trials", db_index=False)
    trial_number = models.PositiveIntegerField(null=True, blank=True)
    trial_params = models.JSONField(default=dict, blank=True)
    objective_value = models.FloatField(null=True, blank=True)
    intermediate_values = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    # Set when a delete had to keep the job (a registered model came from it, studio.deletion):
    # lists hide it unless asked (?archived=true); its artifacts and metrics stay.
    archived_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[TrainingJobQuerySet] = TrainingJobQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The scheduler's FIFO scan of pending jobs.
            models.Index(fields=["status", "created_at"], name="job_status_created"),
            models.Index(fields=["status", "-priority", "created_at"], name="job_status_priority_created"),
        ]
        constraints = [
            # Two engine ticks racing can never create the same trial twice; also the read
            # path of a search's trials in order.
            models.UniqueConstraint(fields=["tuning_job", "trial_number"], name="one_job_per_trial_number"),
        ]

    def __str__(self) -> str:
        return self.name

    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    def was_early_stopped(self) -> bool:
        """Pruned: by the tuning job's pruner or by one of its rules (both count as pruned)."""
        return self.status == JobStatus.STOPPED and self.stop_reason in PRUNED_STOP_REASONS

    @property
    def instance_type(self) -> str:
        return self.resources.get("instance_type", "cpu")

    @property
    def instance_count(self) -> int:
        return int(self.resources.get("instance_count", 1))

    @property
    def processes_per_node(self) -> int:
        return int(self.resources.get("processes_per_node", 1))

    @property
    def max_runtime_seconds(self) -> int | None:
        value = self.stopping.get("max_runtime_seconds")
        return int(value) if value else None

    def as_submission(self) -> dict[str, Any]:
        """The job in the shape POST /api/v1/projects/<project>/training-jobs/ accepts:
        submitting it makes a job with the same settings. Clone, tune-this and retrain start
        from it and change what they change. Reads the project and the inputs (prefetch
        `inputs` when doing this for many jobs)."""
        return {
            "project": self.project.slug,
            "name": self.name,
            "algorithm": self.algorithm,
            "script": {"uri": self.script_uri, "entry_point": self.entry_point} if self.script_uri else None,
            "hyperparameters": dict(self.hyperparameters or {}),
            "inputs": {i.channel: {"dataset_version": i.dataset_version_id, "mode": i.mode} for i in self.inputs.all()},
            "resources": dict(self.resources or {}),
            "distribution": self.distribution,
            "pipeline": dict(self.pipeline) if self.pipeline else None,
            "priority": self.priority,
            "stopping": dict(self.stopping or {}),
            "checkpoint": dict(self.checkpoint) if self.checkpoint else None,
            "keep_alive_seconds": self.keep_alive_seconds,
            "retries": self.retries,
            "metric_definitions": list(self.metric_definitions or []),
            "environment": dict(self.environment or {}),
            "tags": list(self.tags or []),
            "rules": [{"name": r.name, "type": r.type, "parameters": dict(r.parameters), "actions": list(r.actions),
                       "enabled": r.enabled} for r in self.rules.all()],
        }


class JobEvent(models.Model):
    """The timeline: every status transition with its time (SageMaker's secondary status
    transitions), plus notable moments (staging done, checkpoint restored)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    status = models.CharField(max_length=16, choices=JobStatus.choices)
    at = models.DateTimeField(default=timezone.now)
    message = models.TextField(blank=True)
    attempt = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.status} at {self.at.isoformat()}"


class MetricPoint(models.Model):
    """One point of a metric series. Unique on (job, name, step, rank): a re-sent point
    replaces the stored one, so redelivery and resumed runs never duplicate."""

    # No separate index on job: the unique (job, name, step, rank) index serves lookups by job,
    # and a second index would cost one more write per point on the ingest hot path.
    # No database constraint either: PostgreSQL checked the key of every point at commit
    # (~0.37 s per 100k points, a third of the flusher's time). The flusher checks the
    # batch's job ids itself, once per batch (jobs.metrics.store.lock_existing_jobs), and
    # Django's ORM still cascades a job's delete to its points.
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metric_points", db_index=False,
                            db_constraint=False)
    name = models.CharField(max_length=200)
    step = models.BigIntegerField()
    rank = models.IntegerField(default=0)
    value = models.FloatField()
    time = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "name", "step", "rank"], name="one_point_per_step_rank")]
        # The unique index (job, name, step, rank) also serves history reads of one series in step order.

    def __str__(self) -> str:
        return f"job {self.job_id} {self.name} (rank {self.rank}) step {self.step}: {self.value}"


class MetricChunk(models.Model):
    """M4 summary of the points of one series whose step >> CHUNK_BITS is `chunk` (256
    steps; jobs.metrics.rollups): how many, the first and last point, and the points with
    the minimum and maximum value. The flusher keeps it in step with MetricPoint in the
    same transaction, so a chart of a million points reads ~4,000 of these rows instead.

    min/max are null when every value of the chunk is NaN (extremes ignore NaN)."""

    # Like MetricPoint: the flusher checks job ids per batch; the ORM cascades deletes.
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="metric_chunks", db_index=False,
                            db_constraint=False)
    name = models.CharField(max_length=200)
    rank = models.IntegerField(default=0)
    chunk = models.BigIntegerField()
    count = models.IntegerField()
    first_step = models.BigIntegerField()
    first_value = models.FloatField()
    last_step = models.BigIntegerField()
    last_value = models.FloatField()
    min_step = models.BigIntegerField(null=True)
    min_value = models.FloatField(null=True)
    max_step = models.BigIntegerField(null=True)
    max_value = models.FloatField(null=True)

    class Meta:
        # Also the read path: one series' chunks in order.
        constraints = [models.UniqueConstraint(fields=["job", "name", "rank", "chunk"], name="one_chunk_per_series_range")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.name} (rank {self.rank}) chunk {self.chunk}: {self.count} points"


class SystemMetric(models.Model):
    """Per-node samples while a job runs: CPU %, memory, GPU utilisation and memory."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="system_metrics")
    node_name = models.CharField(max_length=200)
    time = models.DateTimeField()
    cpu_percent = models.FloatField()
    memory_bytes = models.BigIntegerField()
    gpu_percent = models.FloatField(null=True, blank=True)
    gpu_memory_bytes = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["job", "time"], name="system_metric_job_time")]

    def __str__(self) -> str:
        return f"job {self.job_id} on {self.node_name} at {self.time.isoformat()}"


class JobAttempt(models.Model):
    """One launch of a job on one node (node_rank of instance_count)."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    attempt = models.PositiveIntegerField()
    node_rank = models.PositiveIntegerField(default=0)
    node = models.ForeignKey("Node", null=True, on_delete=models.SET_NULL, related_name="attempts")
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=32, blank=True)
    warm_start = models.BooleanField(default=False)
    # Cost (jobs.cost): the price per node-hour in force when this launch started (GPUs
    # priced per GPU included), frozen here so a later price change never rewrites history.
    # Billable: Starting to end; training: first step (Training) to end; warm: the time the
    # node was then held in a warm pool for this job (shown apart, billed too).
    price_per_hour = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    currency = models.CharField(max_length=8, blank=True)
    training_started_at = models.DateTimeField(null=True, blank=True)
    training_seconds = models.FloatField(null=True, blank=True)
    billable_seconds = models.FloatField(null=True, blank=True)
    warm_seconds = models.FloatField(default=0)
    cost = models.DecimalField(max_digits=16, decimal_places=6, null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "attempt", "node_rank"], name="one_launch_per_node_rank")]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} on node rank {self.node_rank}"

    @property
    def exit_text(self) -> str:
        """The exit code in words (e.g. the signal that ended the process); "" while it runs."""
        from jobs.runner.process.launch import describe_exit

        return describe_exit(self.exit_code) if self.exit_code is not None else ""


class JobInput(models.Model):
    """A channel of a job bound to a dataset version. PROTECT: a version that any job
    read keeps its row, so a job's lineage never dangles."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="inputs")
    channel = models.CharField(max_length=64)
    dataset_version = models.ForeignKey("datasets.DatasetVersion", on_delete=models.PROTECT, related_name="job_inputs")
    mode = models.CharField(max_length=8, default="file")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "channel"], name="one_version_per_channel")]

    def __str__(self) -> str:
        return f"job {self.job_id} channel {self.channel}: dataset version {self.dataset_version_id}"


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
    current_job = models.ForeignKey(TrainingJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # A warm node (state "warm") is held for the next job that matches its pool: same
    # project, instance type and instance count. `warm_pool` names the pool (all its nodes
    # share it), `warm_until` is when it expires and frees the node.
    warm_pool = models.CharField(max_length=64, blank=True, db_index=True)
    warm_project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    warm_instance_count = models.PositiveIntegerField(default=0)
    warm_until = models.DateTimeField(null=True, blank=True)
    warm_from_job = models.ForeignKey(TrainingJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now)
    # The machine's own CPU and GPU use (whole node, %), sent with each heartbeat: what an
    # idle node shows where no job's sample speaks for it (jobs.cluster.node_utilisation).
    cpu_percent = models.FloatField(null=True, blank=True)
    gpu_percent = models.FloatField(null=True, blank=True)
    utilisation_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[NodeQuerySet] = NodeQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["instance_type", "name"]

    def __str__(self) -> str:
        return self.name

    def seconds_since_heartbeat(self) -> float:
        return (timezone.now() - self.last_heartbeat).total_seconds()


class InstancePrice(models.Model):
    """What an instance type costs per node-hour (plus per GPU-hour for GPU types). A
    project's own price wins over the site's (project null, or STUDIO_INSTANCE_PRICES);
    each launch snapshots the price in force (JobAttempt.price_per_hour)."""

    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.CASCADE, related_name="instance_prices")
    instance_type = models.CharField(max_length=64)
    price_per_node_hour = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    price_per_gpu_hour = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    currency = models.CharField(max_length=8, default="USD")
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        ordering = ["instance_type"]
        constraints = [
            models.UniqueConstraint(fields=["project", "instance_type"], name="one_price_per_project_type"),
            models.UniqueConstraint(fields=["instance_type"], condition=models.Q(project__isnull=True),
                                    name="one_site_price_per_type"),
        ]

    def __str__(self) -> str:
        return f"{self.instance_type}: {self.price_per_node_hour} {self.currency}/node-hour"


class RuleState(models.TextChoices):
    OK = "OK"
    ALARM = "ALARM"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


class JobRule(models.Model):
    """A rule watching one job's metric stream (jobs.rules): a built-in (`type` names it)
    or a custom alarm on a metric, its parameters (checked and completed with defaults by
    jobs.rules.engine.check_rule), the actions it takes on ALARM, and its current state.
    Evaluated by the rule watcher beside the flusher as points arrive."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="rules")
    name = models.CharField(max_length=100)
    type = models.CharField(max_length=32)
    parameters = models.JSONField(default=dict, blank=True)
    # [{"type": "stop"} | {"type": "notify", "channels": [names]} | {"type": "tag", "tag": "..."}]
    actions = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    state = models.CharField(max_length=24, choices=RuleState.choices, default=RuleState.INSUFFICIENT_DATA)
    state_reason = models.TextField(blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    state_values = models.JSONField(default=dict, blank=True)  # what the latest transition saw
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "pk"]
        constraints = [models.UniqueConstraint(fields=["job", "name"], name="one_rule_name_per_job")]
        indexes = [models.Index(fields=["state", "job"], name="job_rule_state")]

    def __str__(self) -> str:
        return f"job {self.job_id} rule {self.name} ({self.type}): {self.state}"


class AlarmTransition(models.Model):
    """Every state change of a rule, with its time, the values that caused it, and what
    its actions did (stop requested, deliveries made, tag added)."""

    rule = models.ForeignKey(JobRule, on_delete=models.CASCADE, related_name="transitions")
    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="alarm_transitions")
    from_state = models.CharField(max_length=24, choices=RuleState.choices)
    to_state = models.CharField(max_length=24, choices=RuleState.choices)
    at = models.DateTimeField(default=timezone.now)
    step = models.BigIntegerField(null=True, blank=True)
    reason = models.TextField(blank=True)
    values = models.JSONField(default=dict, blank=True)
    actions_taken = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["at", "pk"]
        indexes = [models.Index(fields=["job", "at"], name="alarm_transition_job_at")]

    def __str__(self) -> str:
        return f"job {self.job_id} rule {self.rule_id}: {self.from_state} -> {self.to_state} at {self.at.isoformat()}"


class ClusterSample(models.Model):
    """The cluster every STUDIO_CLUSTER_SAMPLE_SECONDS (the Nodes page's charts over time):
    queue depth, the oldest pending job's wait, and per node its state and utilisation
    ({name: {"state", "cpu_percent", "gpu_percent", "job"}})."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    queue_depth = models.PositiveIntegerField(default=0)
    oldest_pending_seconds = models.FloatField(null=True, blank=True)
    nodes = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at"]

    def __str__(self) -> str:
        return f"cluster at {self.at.isoformat()}: {self.queue_depth} pending"
