"""Back into training (issue 6 item 7): a flow's consolidated labels become a new dataset
version, and a job can be retrained on it.

The file format follows the loops' content: table rows → CSV (the row's columns plus the
label column the model was trained with), texts → JSON Lines {"text", "label"}, images →
an image folder <label>/<loop>.<ext>. Loops without consensus are left out."""

from __future__ import annotations

import base64
import binascii
import csv
import json
import re
import tempfile
from collections import Counter
from pathlib import Path

from datasets.actions import DatasetError, VersionOptions, register_local_files
from datasets.models import DatasetVersion, SourceKind
from review.actions import ReviewError
from review.models import NO_CONSENSUS, FlowDefinition, HumanLoop, LoopStatus, TaskType

SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")
IMAGE_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/jpg": "jpg"}


def source_uri_of(flow: FlowDefinition) -> str:
    return f"review://flows/{flow.pk}"


def exportable_loops(flow: FlowDefinition):
    """Completed loops of the flow with a consolidated label (no-consensus ones left out)."""
    return (HumanLoop.objects.filter(flow_definition=flow, status=LoopStatus.COMPLETED)
            .exclude(consolidated_label__in=["", NO_CONSENSUS]).order_by("created_at", "id"))


def content_kind(content: dict) -> str:
    if isinstance(content.get("row"), dict):
        return "rows"
    if isinstance(content.get("text"), str):
        return "texts"
    if isinstance(content.get("image"), str):
        return "images"
    return "objects"


def _label_column(loops: list[HumanLoop]) -> str:
    """The label column of the model most loops came from, else "label"."""
    from hosting.models import ModelVersion

    counts = Counter(loop.model_version_id for loop in loops if loop.model_version_id)
    if counts:
        schema = ModelVersion.objects.filter(pk=counts.most_common(1)[0][0]).values_list("input_schema", flat=True).first()
        if isinstance(schema, dict) and isinstance(schema.get("label_column"), str) and schema["label_column"]:
            return schema["label_column"]
    return "label"


def _write_rows(loops: list[HumanLoop], folder: Path) -> tuple[dict[str, Path], VersionOptions]:
    label_column = _label_column(loops)
    columns: list[str] = []
    for loop in loops:
        for name in loop.input_content["row"]:
            if name != label_column and name not in columns:
                columns.append(name)
    path = folder / "reviewed.csv"
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow([*columns, label_column])
        for loop in loops:
            row = loop.input_content["row"]
            writer.writerow([_cell(row.get(name)) for name in columns] + [loop.consolidated_label])
    return {"reviewed.csv": path}, VersionOptions(format="csv", label_column=label_column)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _write_json_lines(loops: list[HumanLoop], folder: Path, kind: str) -> tuple[dict[str, Path], VersionOptions]:
    path = folder / "reviewed.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for loop in loops:
            content = loop.input_content
            record = ({"text": content["text"]} if kind == "texts"
                      else {k: v for k, v in content.items() if k != "label"})
            record["label"] = loop.consolidated_label
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    options = VersionOptions(format="jsonl", label_column="label", text_column="text" if kind == "texts" else "")
    return {"reviewed.jsonl": path}, options


def _write_images(loops: list[HumanLoop], folder: Path) -> tuple[dict[str, Path], VersionOptions]:
    files: dict[str, Path] = {}
    for loop in loops:
        label = loop.consolidated_label
        if "/" in label or label in (".", "..") or "\x00" in label:
            raise ReviewError("flow_definition", f"Label {label!r} cannot name an image folder.")
        try:
            data = base64.b64decode(loop.input_content["image"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ReviewError("flow_definition", f"Human loop {loop.name}: the image is not valid base64.") from exc
        extension = IMAGE_EXTENSIONS.get(str(loop.input_content.get("media_type", "image/png")).lower(), "png")
        relative = f"{label}/{SAFE_NAME.sub('_', loop.name)}.{extension}"
        local = folder / f"{len(files)}.{extension}"
        local.write_bytes(data)
        files[relative] = local
    return files, VersionOptions(format="image_folder")


def export_flow(flow: FlowDefinition, user, dataset_name: str | None = None) -> DatasetVersion:
    """A new version of `dataset_name` (default "<flow>-reviewed") holding one record per
    completed loop with a consolidated label. Validation runs as for any upload."""
    if flow.task_type == TaskType.FREE_TEXT:
        raise ReviewError("flow_definition", "free_text flows have no labels to export")
    loops = list(exportable_loops(flow))
    if not loops:
        raise ReviewError("flow_definition", "Nothing to export: no completed loop of this flow has a consensus label.")
    kinds = Counter(content_kind(loop.input_content) for loop in loops)
    if len(kinds) > 1:
        mix = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        raise ReviewError("flow_definition", f"The loops mix kinds of content ({mix}); they cannot form one dataset.")
    kind = next(iter(kinds))
    name = (dataset_name or f"{flow.name}-reviewed")[:200]
    with tempfile.TemporaryDirectory(prefix="review-export-") as tmp:
        folder = Path(tmp)
        if kind == "rows":
            files, options = _write_rows(loops, folder)
        elif kind == "images":
            files, options = _write_images(loops, folder)
        else:
            files, options = _write_json_lines(loops, folder, kind)
        try:
            version, _created = register_local_files(
                project=flow.project, name=name, user=user, files=files, options=options,
                description=f"Labels consolidated by reviewers in flow '{flow.name}'.",
                kind=str(SourceKind.REVIEW), source_uri=source_uri_of(flow))
        except DatasetError as exc:
            raise ReviewError("dataset", exc.message, status=exc.status) from exc
    return version


def source_job_of(version: DatasetVersion):
    """The training job of the model version most of the exported flow's loops came from."""
    from hosting.models import ModelVersion

    match = re.fullmatch(r"review://flows/(\d+)", version.source_uri or "")
    if version.source_kind != SourceKind.REVIEW or match is None:
        raise ReviewError("dataset_version", "This version was not exported from a review flow.")
    counts = Counter(HumanLoop.objects.filter(flow_definition_id=int(match.group(1)), status=LoopStatus.COMPLETED,
                                              model_version__isnull=False)
                     .exclude(consolidated_label__in=["", NO_CONSENSUS]).values_list("model_version_id", flat=True))
    for model_version_id, _count in counts.most_common():
        job = ModelVersion.objects.filter(pk=model_version_id, job__isnull=False).select_related("job").first()
        if job is not None:
            return job.job
    raise ReviewError("dataset_version", "No source job: the exported loops did not come from a registered model's job.")


def retrain_from_export(version: DatasetVersion, user):
    """Clone the source job with its "train" channel on the reviewed version."""
    from jobs.actions import JobError, submit_job
    from jobs.serializers import JobCreateSerializer

    job = source_job_of(version)
    if job.project_id != version.dataset.project_id:
        raise ReviewError("dataset_version", "The source job belongs to another project.")
    inputs = {i.channel: {"dataset_version": i.dataset_version_id, "mode": i.mode} for i in job.inputs.all()}
    inputs["train"] = {"dataset_version": version.pk, "mode": inputs.get("train", {}).get("mode", "file")}
    checkpoint = {k: v for k, v in (job.checkpoint or {}).items()
                  if not (k == "uri" and job.output_uri and str(v).startswith(job.output_uri))}
    data = {
        "project": job.project.slug,
        "name": f"{job.name}-reviewed-v{version.version}"[:200],
        "algorithm": job.algorithm,
        "script": {"uri": job.script_uri, "entry_point": job.entry_point} if job.script_uri else None,
        "hyperparameters": job.hyperparameters,
        "inputs": inputs,
        "resources": {k: v for k, v in (job.resources or {}).items()
                      if k in ("instance_type", "instance_count", "processes_per_node", "memory_limit_mb")},
        "distribution": job.distribution,
        "pipeline": job.pipeline or None,
        "priority": job.priority,
        "stopping": job.stopping or {},
        "checkpoint": checkpoint or None,
        "keep_alive_seconds": job.keep_alive_seconds,
        "retries": job.retries,
        "metric_definitions": job.metric_definitions or [],
        "environment": job.environment or {},
        "tags": [*(job.tags or []), "reviewed"][:50],
    }
    serializer = JobCreateSerializer(data=data)
    if not serializer.is_valid():
        field, messages = next(iter(serializer.errors.items()))
        raise ReviewError("dataset_version", f"The source job cannot be cloned ({field}: {messages}).")
    try:
        return submit_job(project=job.project, user=user, data=serializer.validated_data)
    except JobError as exc:
        field, message = next(iter(exc.fields.items()))
        raise ReviewError("dataset_version", f"{field}: {message}") from exc
