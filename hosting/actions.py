"""Writes of the hosting app, one transaction each: register a model version, create,
switch and delete endpoints, submit a batch prediction.

Every refusal is a HostingError naming the request field at fault, so the API answers a
400 (or 409) that says what to change."""

from __future__ import annotations

import json
import logging
import re
import tarfile
from datetime import timedelta
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone

from datasets.models import DatasetVersion
from datasets.storage import StorageError, store_for
from hosting.flows import flow_model
from hosting.models import BatchPrediction, BatchStatus, Endpoint, Model, ModelKind, ModelVersion
from jobs.models import JobStatus, TrainingJob
from studio.errors import FieldError
from studio.models import Project

# SageMaker's endpoint-name rule: it becomes a URL segment, so no slashes or spaces.
ENDPOINT_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})$")
ALGORITHM_KINDS = {
    "tabular-classifier": ModelKind.TABULAR,
    "text-classifier": ModelKind.TEXT,
    "image-classifier": ModelKind.IMAGE,
    "char-lm": ModelKind.GENERATIVE,
}
# Which dataset formats a batch prediction can read records from, per model kind.
BATCH_FORMATS: dict[str, tuple[str, ...]] = {
    ModelKind.TABULAR: ("csv", "jsonl"),
    ModelKind.TEXT: ("csv", "jsonl", "text"),
    ModelKind.IMAGE: ("image_folder",),
}
UNSET: Any = object()
log = logging.getLogger(__name__)


class HostingError(FieldError):
    """A request the hosting app refuses; `field` names the input at fault."""

    def envelope_message(self) -> str:
        return f"{self.field}: {self.message}"  # a conflict names its field too ("name: An endpoint named …")


# --- models -----------------------------------------------------------------------------------
def _clean_name(name: Any, field: str = "name", limit: int = 200) -> str:
    if not isinstance(name, str) or not name.strip():
        raise HostingError(field, "Give a name.")
    name = name.strip()
    if len(name) > limit:
        raise HostingError(field, f"At most {limit} characters.")
    return name


def read_artifact_config(uri: str) -> tuple[dict[str, Any], dict[str, str] | None]:
    """config.json and labels.json from a model.tar.gz, read by streaming through the
    archive (the weights are never written anywhere)."""
    config: dict[str, Any] | None = None
    labels: dict[str, str] | None = None
    with store_for(uri).open_read(uri) as stream, tarfile.open(fileobj=stream, mode="r|gz") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if member.isfile() and name in ("config.json", "labels.json"):
                handle = tar.extractfile(member)
                assert handle is not None
                data = json.loads(handle.read().decode("utf-8"))
                if name == "config.json":
                    config = data
                else:
                    labels = data
    if config is None:
        raise ValueError("it has no config.json: only models written by a built-in algorithm can be registered")
    return config, labels


def example_row(schema: dict[str, Any]) -> dict[str, Any]:
    """A plausible instance for the try-it form: each numeric feature at its training mean,
    each categorical one at its first known value."""
    row: dict[str, Any] = {}
    for item in schema.get("numeric", []):
        row[item["name"]] = round(float(item["mean"]), 4)
    for item in schema.get("categorical", []):
        row[item["name"]] = item["vocabulary"][0] if item["vocabulary"] else ""
    return {name: row[name] for name in schema.get("feature_columns", row)}


def describe_input(kind: str, config: dict[str, Any]) -> dict[str, Any]:
    """ModelVersion.input_schema: what an instance must look like, from config.json's "input"."""
    schema = config.get("input") or {}
    if kind == ModelKind.TABULAR:
        return {
            "columns": list(schema.get("feature_columns", [])),
            "label_column": schema.get("label_column", ""),
            "numeric": [item["name"] for item in schema.get("numeric", [])],
            "categorical": {item["name"]: item["vocabulary"] for item in schema.get("categorical", [])},
            "example": example_row(schema),
        }
    if kind == ModelKind.TEXT:
        return {"text_column": schema.get("text_column", "text"), "label_column": schema.get("label_column", "")}
    if kind == ModelKind.IMAGE:
        return {"image_size": schema.get("image_size"), "channels": schema.get("channels")}
    return {"context_length": schema.get("context_length")}


def _job_in_project(project: Project, job: TrainingJob | int | None) -> TrainingJob:
    if isinstance(job, TrainingJob):
        found: TrainingJob | None = job
    else:
        try:
            found = TrainingJob.objects.filter(pk=int(job)).first() if job is not None else None  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise HostingError("job", "Give the id of a completed training job.") from None
    if found is None or found.project_id != project.pk:
        raise HostingError("job", f"No job {getattr(found, 'pk', job)} in project '{project.slug}'.")
    return found


def register_model(*, project: Project, name: str, job: TrainingJob | int, user: User | None = None,
                   description: str = "") -> ModelVersion:
    """1. Check the job: same project, Completed, with a model artifact written by a
    built-in algorithm. 2. Read config.json/labels.json from the artifact (outside the
    transaction: it is storage I/O). 3. Under the model row's lock, take the next number."""
    name = _clean_name(name)
    job = _job_in_project(project, job)
    if job.status != JobStatus.COMPLETED:
        raise HostingError("job", f"job {job.pk} is {job.status}: only a Completed job's model can be registered")
    if not job.model_uri:
        raise HostingError("job", f"job {job.pk} has no model artifact: its model/ folder was empty")
    try:
        config, label_map = read_artifact_config(job.model_uri)
    except (StorageError, OSError, tarfile.TarError, ValueError) as exc:
        raise HostingError("job", f"job {job.pk}'s model artifact cannot be registered: {exc}") from None
    algorithm = config.get("algorithm") or job.algorithm
    kind = ALGORITHM_KINDS.get(algorithm)
    if kind is None:
        raise HostingError("job", f"job {job.pk}'s model was made by {algorithm!r}, which hosting cannot serve")
    labels = [label_map[str(i)] for i in range(len(label_map))] if label_map else []
    dataset_versions = {item.channel: item.dataset_version_id for item in job.inputs.all()}
    with transaction.atomic():
        model, _ = Model.objects.get_or_create(project=project, name=name,
                                               defaults={"created_by": user, "description": description})
        # The row lock serialises concurrent registrations of one model (PostgreSQL; on
        # SQLite the IMMEDIATE transaction already does), so numbers never collide.
        Model.objects.select_for_update().filter(pk=model.pk).first()
        number = (model.versions.aggregate(top=Max("version"))["top"] or 0) + 1
        return ModelVersion.objects.create(
            model=model, version=number, job=job, artifact_uri=job.model_uri, algorithm=algorithm, kind=kind,
            labels=labels, input_schema=describe_input(kind, config), metrics=dict(job.final_metrics or {}),
            hyperparameters=dict(job.hyperparameters or {}), dataset_versions=dataset_versions, created_by=user)


def resolve_model_version(project: Project, model: Any, version: Any = None, *, field: str = "model") -> ModelVersion:
    """A model given by name or id in the project, at `version` or its latest."""
    found = None
    if isinstance(model, Model):
        found = model if model.project_id == project.pk else None
    elif isinstance(model, int) or (isinstance(model, str) and model.isdigit()):
        found = Model.objects.filter(project=project, pk=int(model)).first()
    if found is None and isinstance(model, str) and model.strip():
        found = Model.objects.filter(project=project, name=model.strip()).first()
    if found is None:
        raise HostingError(field, f"No model {model!r} in project '{project.slug}'.")
    versions = found.versions.all()
    if version in (None, ""):
        chosen = versions.order_by("-version").first()
        if chosen is None:
            raise HostingError(field, f"Model '{found.name}' has no versions yet.")
        return chosen
    try:
        number = int(version)
    except (TypeError, ValueError):
        raise HostingError("model_version", "Give a version number.") from None
    chosen = versions.filter(version=number).first()
    if chosen is None:
        raise HostingError("model_version", f"Model '{found.name}' has no version {number}.")
    return chosen


# --- endpoints ----------------------------------------------------------------------------------
def flow_in_project(project: Project, flow: Any, version: ModelVersion):
    """The project's flow definition given as one or its id (None for none), if `version`
    may send to review."""
    if flow in (None, ""):
        return None
    flows = flow_model()
    if not isinstance(flow, flows):
        try:
            flow = flows._default_manager.filter(pk=int(flow), project=project).first()
        except (TypeError, ValueError):
            raise HostingError("flow_definition", "Give the id of a flow definition.") from None
    if flow is None or flow.project_id != project.pk:
        raise HostingError("flow_definition", f"No flow definition with that id in project '{project.slug}'.")
    if version.kind == ModelKind.GENERATIVE:
        raise HostingError("flow_definition", "a generative model's outputs have no confidence to review by; "
                                              "deploy it without a flow")
    return flow


def endpoint_name(name: Any) -> str:
    """The name, stripped, if it can name an endpoint (it is part of the invocation URL)."""
    if not isinstance(name, str) or not ENDPOINT_NAME.match(name.strip()):
        raise HostingError("name", "1–63 letters, digits or hyphens, starting with a letter or digit.")
    return name.strip()


def create_endpoint(*, project: Project, name: str, model_version: ModelVersion, flow_definition: Any = None,
                    user=None) -> Endpoint:
    name = endpoint_name(name)
    if model_version.model.project_id != project.pk:
        raise HostingError("model", f"That model is not in project '{project.slug}'.")
    flow = flow_in_project(project, flow_definition, model_version)
    try:
        with transaction.atomic():
            return Endpoint.objects.create(project=project, name=name, model_version=model_version,
                                           flow_definition=flow, created_by=user)
    except IntegrityError:
        raise HostingError("name", f"An endpoint named '{name}' already exists.", status=409) from None


def update_endpoint(endpoint: Endpoint, *, model_version: ModelVersion | Any = UNSET,
                    flow_definition: Any = UNSET) -> Endpoint:
    """One UPDATE of the row: a request in flight keeps the version it read; the next one
    reads the new version. Nothing is loaded or unloaded here (the cache loads lazily)."""
    changes: dict[str, Any] = {"updated_at": timezone.now()}
    version = endpoint.model_version if model_version is UNSET else model_version
    if model_version is not UNSET:
        if model_version.model.project_id != endpoint.project_id:
            raise HostingError("model", "That model is not in the endpoint's project.")
        changes["model_version"] = model_version
    if flow_definition is not UNSET:
        changes["flow_definition"] = flow_in_project(endpoint.project, flow_definition, version)
    elif model_version is not UNSET and endpoint.flow_definition_id and version.kind == ModelKind.GENERATIVE:
        raise HostingError("model", "a generative model cannot serve an endpoint with a review flow; "
                                    "set flow_definition to null in the same request")
    Endpoint.objects.filter(pk=endpoint.pk).update(**changes)
    endpoint.refresh_from_db()
    return endpoint


def delete_endpoint(endpoint: Endpoint) -> None:
    Endpoint.objects.filter(pk=endpoint.pk).delete()


# --- batch predictions --------------------------------------------------------------------------
def submit_batch_prediction(*, project: Project, model_version: ModelVersion, dataset_version: Any,
                            flow_definition: Any = None, user=None) -> BatchPrediction:
    """A Pending row, and its task enqueued once the row is committed."""
    from datasets.models import VersionStatus

    dataset_version = dataset_version_in_project(project, dataset_version)
    if dataset_version.status != VersionStatus.READY:
        raise HostingError("dataset_version", f"dataset version {dataset_version.pk} is {dataset_version.status}, "
                                              "not ready: wait for its validation to finish")
    formats = BATCH_FORMATS.get(model_version.kind)
    if formats is None:
        raise HostingError("model", "batch prediction serves classifiers; a generative model has no batch mode")
    if dataset_version.format not in formats:
        raise HostingError("dataset_version", f"a {model_version.kind} model reads {' or '.join(formats)} datasets; "
                                              f"this version is {dataset_version.format}")
    flow = flow_in_project(project, flow_definition, model_version)
    with transaction.atomic():
        batch = BatchPrediction.objects.create(project=project, model_version=model_version,
                                               dataset_version=dataset_version, flow_definition=flow, created_by=user)
        transaction.on_commit(lambda: enqueue_batch(batch.pk))
    return batch


def dataset_version_in_project(project: Project, dataset_version: Any) -> DatasetVersion:
    """The project's dataset version given as one or its id."""
    found: DatasetVersion | None = dataset_version if isinstance(dataset_version, DatasetVersion) else None
    if found is None:
        try:
            found = (DatasetVersion.objects.select_related("dataset")
                     .filter(pk=int(dataset_version), dataset__project=project).first())
        except (TypeError, ValueError):
            raise HostingError("dataset_version", "Give the id of a dataset version.") from None
    if found is None or found.dataset.project_id != project.pk:
        raise HostingError("dataset_version", f"No dataset version with that id in project '{project.slug}'.")
    return found


def enqueue_batch(pk: int) -> None:
    """Send the batch to a control worker. A broker outage leaves the row Pending (logged);
    requeue_stalled_batches sends it again later, so submitting never fails after commit."""
    from hosting.tasks import run_batch_prediction_task

    try:
        run_batch_prediction_task.delay(pk)
    except Exception:  # noqa: BLE001 - kombu raises many kinds; the beat task retries
        log.exception("could not enqueue batch prediction %s; it stays Pending until the next requeue", pk)


def requeue_stalled_batches(stale_seconds: int = 120) -> list[int]:
    """Batches nobody is working on, enqueued again (beat runs this every 30 s):
    - Running, but the worker stopped beating: back to Pending; the rerun starts human loops
      only after the records already covered (hosting.batch);
    - Pending for a while without a worker picking it up (its message was lost).
    The Pending → Running claim is a compare-and-set, so a duplicate message does nothing."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=stale_seconds)
    stalled = BatchPrediction.objects.filter(
        Q(status=BatchStatus.RUNNING, heartbeat_at__lt=cutoff)
        | Q(status=BatchStatus.PENDING, heartbeat_at__lt=cutoff)
        | Q(status=BatchStatus.PENDING, heartbeat_at__isnull=True, created_at__lt=cutoff))
    requeued = []
    for pk, status in list(stalled.values_list("pk", "status")):
        moved = BatchPrediction.objects.filter(pk=pk, status=status).filter(
            Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True)).update(status=BatchStatus.PENDING, heartbeat_at=now)
        if moved:
            requeued.append(pk)
            enqueue_batch(pk)
    return requeued
