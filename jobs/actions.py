"""Writes for training jobs: submit and stop. Pages and the API call these; each runs in
one transaction, with scheduling sent on commit."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from datasets.models import DatasetVersion, VersionStatus
from datasets.storage import StorageError, object_uri, split_uri, store_for
from jobs.models import STOP_REQUESTED, JobEvent, JobInput, JobRule, JobStatus, Node, TrainingJob
from jobs.transitions import transition
from studio.errors import ActionError
from studio.models import Project

log = logging.getLogger(__name__)

MODES = ("file", "stream")


class JobError(ActionError):
    """Bad input for a job: {field path: message}."""

    def __init__(self, fields: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()), fields=fields)


def tags_for_clone(tags: list) -> list[str]:
    """A clone's tags: the source's, less `tuning:<id>` (a clone is no trial of that
    tuning job, and the tag is how its trials are listed)."""
    return [str(tag) for tag in tags if not str(tag).startswith("tuning:")]


@dataclass(frozen=True)
class ResolvedInput:
    channel: str
    version: DatasetVersion
    mode: str


def resolve_inputs(project: Project, raw: dict) -> list[ResolvedInput]:
    """channel → version id or {"dataset_version": id, "mode": ...}; each version must be
    ready and belong to the job's project."""
    errors: dict[str, str] = {}
    resolved: list[ResolvedInput] = []
    for channel, spec in raw.items():
        field = f"inputs.{channel}"
        if not isinstance(channel, str) or not channel.replace("_", "").replace("-", "").isalnum() or len(channel) > 64:
            errors[field] = "Channel names use letters, digits, '-' and '_' (e.g. train, validation)."
            continue
        if isinstance(spec, dict):
            version_id, mode = spec.get("dataset_version"), spec.get("mode", "file")
        else:
            version_id, mode = spec, "file"
        if mode not in MODES:
            errors[field] = f"mode must be 'file' or 'stream', not {mode!r}."
            continue
        if isinstance(version_id, bool) or not isinstance(version_id, (int, str)) or not str(version_id).isdigit():
            errors[field] = "Give a dataset version id, e.g. {\"dataset_version\": 12}."
            continue
        version = DatasetVersion.objects.select_related("dataset").filter(pk=int(version_id), dataset__project=project).first()
        if version is None:
            errors[field] = f"No dataset version {version_id} in project '{project.slug}'."
        elif version.status != VersionStatus.READY:
            errors[field] = f"{version.dataset.name} v{version.version} is {version.status}, not ready" + (
                "; wait for validation to finish." if version.status == VersionStatus.VALIDATING else "; fix its errors and upload a new version."
            )
        else:
            resolved.append(ResolvedInput(channel, version, mode))
    if errors:
        raise JobError(errors)
    return resolved


def check_algorithm(name: str, hyperparameters: dict, inputs: list[ResolvedInput]) -> dict:
    from algorithms import ALGORITHMS, get_algorithm
    from algorithms.base import DataFacts, data_problem, validate_hyperparameters

    spec = get_algorithm(name)
    if spec is None:
        raise JobError({"algorithm": f"Unknown algorithm '{name}'; choose one of: {', '.join(sorted(ALGORITHMS))}."})
    channels = {i.channel for i in inputs}
    train = next((i.version for i in inputs if i.channel == "train"), None)
    inferred_label = (train.schema or {}).get("label_column") if train is not None else None
    if inferred_label and spec.hyperparameter("label_column") is not None and not hyperparameters.get("label_column"):
        # The label the dataset's validation found is what the user means unless they say otherwise.
        hyperparameters = {**hyperparameters, "label_column": inferred_label}
    if train is not None and train.text_column and spec.hyperparameter("text_column") is not None \
            and not hyperparameters.get("text_column"):
        hyperparameters = {**hyperparameters, "text_column": train.text_column}  # as given at upload
    clean, errors = validate_hyperparameters(spec, hyperparameters)
    # The path names the hyperparameter; its message's own "<name>: " would say it twice
    # ("hyperparameters.epochs: epochs: must be ≥ 1").
    fields = {f"hyperparameters.{k}": v.removeprefix(f"{k}: ") for k, v in errors.items()}
    # Each channel the algorithm reads must hold data it can use (format, labels, columns):
    # refused here, naming the channel, rather than failing seconds after the job starts.
    read = (*spec.required_channels, *spec.optional_channels)
    # Without train (refused below) the label and text columns are not known yet.
    checkable = not {"label_column", "text_column"} & set(errors) and all(c in channels for c in spec.required_channels)
    for item in inputs:
        problem = data_problem(spec, item.channel, DataFacts.of(item.version), clean, item.mode) \
            if checkable and item.channel in read else None
        if problem:
            fields[f"inputs.{item.channel}"] = problem
    missing = [c for c in spec.required_channels if c not in channels]
    if missing:
        fields["inputs"] = f"{name} needs the channel{'s' if len(missing) > 1 else ''} {', '.join(missing)}."
    if fields:
        raise JobError(fields)
    return clean


def check_distribution(algorithm: str, distribution: str, pipeline: dict, hyperparameters: dict,
                       resources: dict) -> None:
    """The algorithm must support the distribution; a pipeline must have one process per
    stage (per replica, with `ddp`) and, for a built-in, a partition that fits the model's layers."""
    spec = None
    if algorithm:
        from algorithms import get_algorithm

        spec = get_algorithm(algorithm)
        if spec is not None and distribution not in spec.distributions:
            raise JobError({"distribution": (f"{algorithm} does not support distribution '{distribution}'; it supports "
                                             f"{', '.join(spec.distributions)}.")})
    if not pipeline:
        return
    stages = int(pipeline["stages"])
    processes = int(resources.get("instance_count") or 1) * int(resources.get("processes_per_node") or 1)
    if pipeline.get("ddp") and spec is not None:
        raise JobError({"pipeline.ddp": (f"{algorithm} trains one pipeline (one process per stage); replicas of it "
                                         "(ddp) are for scripts through trainyard.parallel.wrap: drop ddp.")})
    if pipeline.get("ddp"):
        if processes % stages:
            raise JobError({"pipeline.stages": (
                f"{stages} stages with ddp need a multiple of {stages} processes (one per stage in each replica), but "
                f"the job has instance_count × processes_per_node = {processes}; set resources.processes_per_node so "
                "they match.")})
    elif processes != stages:
        raise JobError({"pipeline.stages": (
            f"{stages} stages need {stages} processes (one per stage), but the job has instance_count × "
            f"processes_per_node = {processes}; set resources.processes_per_node so they match.")})
    batch_size = hyperparameters.get("batch_size")
    if isinstance(batch_size, int) and batch_size < int(pipeline.get("microbatches") or 1):
        raise JobError({"pipeline.microbatches": (
            f"{pipeline['microbatches']} microbatches do not fit a batch of {batch_size}; use at most {batch_size} "
            "or raise hyperparameters.batch_size.")})
    if spec is not None and spec.layer_count is not None:
        layers = spec.layer_count(hyperparameters)
        if stages > layers:
            raise JobError({"pipeline.stages": f"The model has {layers} layers: it cannot be cut into {stages} stages."})
        partition = pipeline.get("partition")
        if isinstance(partition, list) and sum(partition) != layers:
            raise JobError({"pipeline.partition": (
                f"The counts add up to {sum(partition)} but the model has {layers} layers "
                f"(for {algorithm} with these hyperparameters).")})


def check_script(project: Project, uri: str) -> None:
    """A script must be one uploaded to this project (POST /api/v1/scripts/)."""
    prefix = object_uri(f"scripts/{project.slug}/")
    if not uri.startswith(prefix):
        raise JobError({"script.uri": "Upload the script with POST /api/v1/scripts/ and use the uri it returns."})
    try:
        split_uri(uri)
        if not store_for(uri).exists(uri):
            raise JobError({"script.uri": f"{uri} does not exist."})
    except StorageError as exc:
        raise JobError({"script.uri": str(exc)}) from exc


def check_resources(resources: dict) -> dict:
    instance_type = resources.get("instance_type") or "cpu"
    nodes = Node.objects.filter(instance_type=instance_type).exclude(state="stopped")
    largest = nodes.aggregate(cpus=Max("cpus"), gpus=Max("gpus"))
    per_node = resources.get("processes_per_node")
    if per_node is None:
        # Like SageMaker: one process per GPU on GPU nodes, one process otherwise.
        per_node = max(1, largest["gpus"] or 0) if (largest["gpus"] or 0) > 0 else 1
    if largest["cpus"] is not None and per_node > largest["cpus"]:
        raise JobError({"resources.processes_per_node": (
            f"{per_node} processes per node is more than the {largest['cpus']} CPUs of the largest "
            f"'{instance_type}' node; use at most {largest['cpus']}."
        )})
    gpus = largest["gpus"] or 0
    if gpus and per_node > gpus:
        # On a CUDA node each rank takes its own GPU (NCCL refuses two ranks on one device).
        raise JobError({"resources.processes_per_node": (
            f"{per_node} processes per node on '{instance_type}' nodes with {gpus} GPU(s): NCCL runs one process per "
            f"GPU; use at most {gpus} (or more nodes)."
        )})
    return {**resources, "instance_type": instance_type, "processes_per_node": per_node}


def check_checkpoint_uri(uri: str) -> None:
    if not uri:
        return
    try:
        scheme, _, _ = split_uri(uri)
        if scheme == "file":
            store_for(uri)
    except StorageError as exc:
        raise JobError({"checkpoint.uri": str(exc)}) from exc


@dataclass(frozen=True)
class CheckedSubmission:
    """A submission that passed every check: what submit_job writes."""

    inputs: list[ResolvedInput]
    hyperparameters: dict
    script: dict | None
    distribution: str
    pipeline: dict
    resources: dict
    checkpoint: dict
    rules: list[dict]


def check_submission(project: Project, data: dict) -> CheckedSubmission:
    """Every check of a submission that needs the database (inputs, the algorithm's schema
    or the script, resources, distribution, checkpoint URI); JobError names the bad field.
    Writes nothing, so a tuning job can check its base job before creating any trial."""
    inputs = resolve_inputs(project, data.get("inputs") or {})
    hyperparameters = data.get("hyperparameters") or {}
    script = data.get("script") or None
    if data.get("algorithm"):
        hyperparameters = check_algorithm(data["algorithm"], hyperparameters, inputs)
    elif script is not None:
        check_script(project, script["uri"])
    distribution = data.get("distribution") or "none"
    pipeline = dict(data.get("pipeline") or {})
    raw_resources = dict(data.get("resources") or {})
    if pipeline and raw_resources.get("processes_per_node") is None:
        # One process per stage, spread over the job's nodes.
        count = int(raw_resources.get("instance_count") or 1)
        raw_resources["processes_per_node"] = max(1, -(-int(pipeline["stages"]) // count))
    resources = check_resources(raw_resources)
    check_distribution(data.get("algorithm") or "", distribution, pipeline, hyperparameters, resources)
    checkpoint = data.get("checkpoint") or {}
    check_checkpoint_uri(checkpoint.get("uri", ""))
    from jobs.rules.engine import RuleError, check_rules
    from jobs.rules.store import check_channels_exist

    try:
        rules = check_rules(data.get("rules") or [])
        check_channels_exist(project.pk, rules)
    except RuleError as exc:
        raise JobError({exc.field: exc.message}) from exc
    return CheckedSubmission(inputs=inputs, hyperparameters=hyperparameters, script=script, distribution=distribution,
                             pipeline=pipeline, resources=resources, checkpoint=checkpoint, rules=rules)


def submit_job(*, project: Project, user: User | None, data: dict) -> TrainingJob:
    """1. Resolve and check everything (check_submission).
    2. Create the job (Pending) with its inputs and first timeline entry, in one transaction.
    3. On commit, ask the scheduler to look at the queue."""
    checked = check_submission(project, data)
    script, pipeline, checkpoint = checked.script, checked.pipeline, checked.checkpoint
    with transaction.atomic():
        job = TrainingJob.objects.create(
            project=project, name=data["name"], algorithm=data.get("algorithm") or "",
            script_uri=script["uri"] if script else "", entry_point=(script or {}).get("entry_point") or "",
            hyperparameters=checked.hyperparameters, resources=checked.resources, distribution=checked.distribution,
            pipeline={k: v for k, v in pipeline.items() if v is not None}, priority=data.get("priority") or 0,
            stopping={k: v for k, v in (data.get("stopping") or {}).items() if v is not None},
            checkpoint={k: v for k, v in checkpoint.items() if v not in (None, "")},
            keep_alive_seconds=data.get("keep_alive_seconds") or 0, retries=data.get("retries") or 0,
            metric_definitions=list(data.get("metric_definitions") or []), environment=data.get("environment") or {},
            tags=data.get("tags") or [], created_by=user,
        )
        job.output_uri = object_uri(f"jobs/{job.pk}")
        if job.retries and not job.checkpoint.get("uri"):
            # A retry resumes from the last checkpoint: keep them beside the job's outputs.
            job.checkpoint = {**job.checkpoint, "uri": f"{job.output_uri}/checkpoints"}
        job.save(update_fields=["output_uri", "checkpoint"])
        JobInput.objects.bulk_create([JobInput(job=job, channel=i.channel, dataset_version=i.version, mode=i.mode)
                                      for i in checked.inputs])
        from jobs.rules.store import waiting_reason

        JobRule.objects.bulk_create([JobRule(job=job, name=r["name"], type=r["type"], parameters=r["parameters"],
                                             actions=r["actions"], enabled=r["enabled"], state_reason=waiting_reason(r))
                                     for r in checked.rules])
        JobEvent.objects.create(job=job, status=JobStatus.PENDING, message="Submitted")
        _clear_live_streams(job.pk)
        transaction.on_commit(_schedule_soon)
    return job


def _clear_live_streams(job_id: int) -> None:
    """A new job has no live events yet. Streams under its id can only be left over from a
    database that was reset while Redis kept its data; a page would replay them as this
    job's (e.g. an old "Completed" that closes the live view)."""
    from studio.redis_conn import redis_client
    from trainyard.protocol import EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM, key

    try:
        redis_client().delete(*(key(t, job_id) for t in (EVENTS_STREAM, LOGS_STREAM, METRICS_STREAM, SYSTEM_STREAM)))
    except Exception:  # noqa: BLE001 - Redis down must not refuse a submission; streams only make pages live
        log.warning("could not clear live streams of new job %s", job_id, exc_info=True)


def _schedule_soon() -> None:
    from jobs.tasks import schedule_jobs_task

    try:
        schedule_jobs_task.delay()
    except Exception:  # noqa: BLE001 - the periodic tick schedules it anyway
        log.warning("could not send a scheduling tick; the periodic one will pick the job up", exc_info=True)


class NotStoppable(ActionError):
    """The job (or tuning job) is past stopping: a state conflict (409)."""

    def __init__(self, message: str):
        super().__init__(message, status=409)


def stop_job(job: TrainingJob, *, reason: str = STOP_REQUESTED, message: str = "", rule: str = "") -> TrainingJob:
    """A pending job stops at once; a starting or training one is asked to stop (Stopping)
    and its node agent ends it (SIGTERM, grace, SIGKILL) and records Stopped — keeping
    `reason` as the job's stop_reason (EarlyStopped when a tuning job's pruner asks,
    RuleTriggered with `rule` naming the rule when one of its rules does)."""
    extra = {"stop_rule": rule} if rule else {}
    if transition(job.pk, JobStatus.STOPPED, from_statuses=[JobStatus.PENDING],
                  message=message or "Stopped before it started", stop_reason=reason, **extra):
        job.refresh_from_db()
        return job
    if not transition(job.pk, JobStatus.STOPPING, from_statuses=[JobStatus.STARTING, JobStatus.TRAINING],
                      message=message or "Stop requested", stop_requested_at=timezone.now(), stop_reason=reason, **extra):
        job.refresh_from_db()
        if job.status == JobStatus.STOPPING:
            return job  # asked twice: the first request is still being carried out
        raise NotStoppable(f"The job is {job.status}; only Pending, Starting or Training jobs can be stopped.")
    job.refresh_from_db()
    return job
