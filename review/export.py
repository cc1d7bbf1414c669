"""Back into training (docs/SPEC.md §5): a flow's consolidated labels
become a new dataset version, and a job can be retrained on it.

By default (mode "merged") the export is the NEXT VERSION OF THE SOURCE JOB'S TRAINING
DATASET: the records the model was trained on plus the reviewed ones, a reviewed record
already among them relabelled (review.merge says how records are matched), the other
channels carried over; Retrain keeps the source job's validation channel, so the new model
is measured on the same records as the old. Mode "reviewed_only" is the former export:

The reviewed-only file format follows the loops' content: table rows → CSV (the row's columns plus the
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
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.contrib.auth.models import User
from django.db import transaction

from datasets.actions import DatasetError, VersionOptions, register_local_files
from datasets.models import DatasetVersion, SourceKind, VersionStatus
from review.consolidation import NO_CONSENSUS
from review.errors import ReviewError
from review.merge import Columns, Merged, MergeImpossible, Reviewed, merge, summary_text, version_label
from review.models import FlowDefinition, HumanLoop, LoopStatus, TaskType

if TYPE_CHECKING:
    from hosting.models import ModelVersion
    from jobs.models import TrainingJob

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


MERGED = "merged"
REVIEWED_ONLY = "reviewed_only"
MODES = (MERGED, REVIEWED_ONLY)


@dataclass(frozen=True)
class Source:
    """The model the flow's loops came from (the one most of them came from)."""

    job: TrainingJob
    model_version: ModelVersion
    base: DatasetVersion | None  # the job's train version
    columns: Columns


def source_of_loops(flow: FlowDefinition, loops: list[HumanLoop]) -> Source | None:
    """The source job of the model version most loops came from, with a job of the flow's
    project; None when the loops came from no registered model's job."""
    return source_of_model_versions(flow, [loop.model_version_id for loop in loops])


def source_of_model_versions(flow: FlowDefinition, model_version_ids: Iterable[int | None]) -> Source | None:
    from hosting.models import ModelVersion

    counts = Counter(pk for pk in model_version_ids if pk)
    for model_version_id, _count in counts.most_common():
        model_version = (ModelVersion.objects.filter(pk=model_version_id, job__isnull=False,
                                                     job__project_id=flow.project_id)
                         .select_related("job").first())
        if model_version is None or model_version.job is None:
            continue
        job = model_version.job
        train = job.inputs.filter(channel="train").select_related("dataset_version__dataset").first()
        return Source(job=job, model_version=model_version, base=train.dataset_version if train else None,
                      columns=columns_of(model_version, job, train.dataset_version if train else None))
    return None


def columns_of(model_version, job, base: DatasetVersion | None) -> Columns:
    """The label/text columns the model was trained with: its input schema, else the job's
    hyperparameters, else what the version's validation found."""
    schema = model_version.input_schema if isinstance(model_version.input_schema, dict) else {}
    hyperparameters = job.hyperparameters if isinstance(job.hyperparameters, dict) else {}

    def pick(name: str, fallback: str) -> str:
        for value in (schema.get(name), hyperparameters.get(name), getattr(base, name, "") if base else ""):
            if isinstance(value, str) and value:
                return value
        return fallback

    return Columns(label=pick("label_column", "label"), text=pick("text_column", "text"))


def _checked_loops(flow: FlowDefinition) -> tuple[list[HumanLoop], str]:
    if flow.task_type == TaskType.FREE_TEXT:
        raise ReviewError("flow_definition", "free_text flows have no labels to export")
    loops = list(exportable_loops(flow))
    if not loops:
        raise ReviewError("flow_definition", "Nothing to export: no completed loop of this flow has a consensus label.")
    kinds = Counter(content_kind(loop.input_content) for loop in loops)
    if len(kinds) > 1:
        mix = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        raise ReviewError("flow_definition", f"The loops mix kinds of content ({mix}); they cannot form one dataset.")
    return loops, next(iter(kinds))


def resolve_mode(mode: str | None, source: Source | None) -> str:
    """The default is merged whenever the loops came from a registered model's job (its
    training data is what they merge into); without one only reviewed_only exists."""
    if mode is None or mode == "":
        return MERGED if source is not None else REVIEWED_ONLY
    if mode not in MODES:
        raise ReviewError("mode", f"Unknown mode {mode!r}; use {' or '.join(MODES)}.")
    if mode == MERGED and source is None:
        raise ReviewError("mode", "Nothing to merge into: the reviewed loops did not come from a registered model's "
                                  "job. Use mode reviewed_only.")
    return mode


def _base_of(source: Source) -> DatasetVersion:
    base = source.base
    if base is None:
        raise ReviewError("mode", f"The source job {source.job.name} has no train channel to merge into. "
                                  "Use mode reviewed_only.")
    if base.status != VersionStatus.READY:
        raise ReviewError("mode", f"{base.dataset.name} v{base.version}, the source job's training data, is "
                                  f"{base.status}; it cannot be merged into.")
    return base


def _reviewed(loops: list[HumanLoop]) -> list[Reviewed]:
    return [Reviewed(name=loop.name, content=loop.input_content, label=loop.consolidated_label) for loop in loops]


def _merge(source: Source, loops: list[HumanLoop], work: Path, *, write: bool) -> Merged:
    base = _base_of(source)
    try:
        return merge(base, _reviewed(loops), source.columns, work, write=write)
    except MergeImpossible as exc:
        raise ReviewError("mode", exc.message) from exc


def _job_json(job: TrainingJob | None) -> dict | None:
    return {"id": job.pk, "name": job.name} if job is not None else None


def _version_json(version: DatasetVersion) -> dict:
    return {"id": version.pk, "dataset": version.dataset.name, "version": version.version}


def _next_number(dataset_name: str, flow: FlowDefinition) -> int:
    from django.db.models import Max

    top = DatasetVersion.objects.filter(dataset__project_id=flow.project_id,
                                        dataset__name=dataset_name).aggregate(top=Max("version"))["top"]
    return (top or 0) + 1


def preview_export(flow: FlowDefinition, mode: str | None = None, dataset_name: str | None = None) -> dict:
    """What an export would make, without making it: the mode, the dataset and version
    number, the counts and the sentence the confirm dialog shows."""
    loops, kind = _checked_loops(flow)
    source = source_of_loops(flow, loops)
    mode = resolve_mode(mode, source)
    merge_possible = source is not None and source.base is not None
    body: dict = {
        "mode": mode,
        "modes": {MERGED: {"available": merge_possible,
                           "base_version": _version_json(source.base) if source and source.base else None},
                  REVIEWED_ONLY: {"available": True}},
        "flow": {"id": flow.pk, "name": flow.name},
        "source_job": _job_json(source.job if source else None),
        "model_version": source.model_version.pk if source else None,
    }
    if mode == MERGED:
        assert source is not None
        _check_dataset_name(dataset_name, _base_of(source))
        with tempfile.TemporaryDirectory(prefix="review-preview-") as tmp:
            merged = _merge(source, loops, Path(tmp), write=False)
        base = _base_of(source)
        name = base.dataset.name
        counts = merged.counts.as_dict()
        summary = summary_text(merged.counts, version_label(base), base.format)
        body.update(base_version=_version_json(base))
    else:
        name = (dataset_name or f"{flow.name}-reviewed")[:200]
        counts = {"reviewed": len(loops), "records": len(loops)}
        summary = reviewed_only_summary(len(loops), kind)
        body.update(base_version=None)
    number = _next_number(name, flow)
    body.update(dataset=name, next_version=number, counts=counts, summary=summary,
                confirm=confirm_text(name, number, summary, counts, mode))
    return body


def reviewed_only_summary(count: int, kind: str) -> str:
    word = {"rows": "rows", "images": "images"}.get(kind, "records")
    return f"{count:,} reviewed {word} only, not merged with the training data"


def confirm_text(name: str, number: int, summary: str, counts: dict, mode: str) -> str:
    if mode == MERGED:
        return (f"Create {name} v{number}: {summary} — {counts['records']:,} training records in all "
                f"({counts['added']:,} added){_carried_text(counts)}?")
    return f"Create {name} v{number}: {summary}?"


def _carried_text(counts: dict) -> str:
    carried = counts.get("carried") or {}
    if not carried:
        return ""
    return "; " + ", ".join(f"{channel} ({n:,}) kept as is" for channel, n in sorted(carried.items()))


def _check_dataset_name(dataset_name: str | None, base: DatasetVersion) -> None:
    if dataset_name and dataset_name != base.dataset.name:
        raise ReviewError("dataset", f"A merged export is the next version of the training dataset "
                                     f"'{base.dataset.name}'; leave dataset empty, or use mode reviewed_only to "
                                     "name a dataset of its own.")


def export_flow(flow: FlowDefinition, user: User, dataset_name: str | None = None, mode: str | None = None) -> DatasetVersion:
    """By default (mode merged) the next version of the source job's training dataset: its
    training records with the reviewed ones merged in (see review.merge), the other
    channels unchanged. mode reviewed_only: a version of `dataset_name` (default
    "<flow>-reviewed") with one record per completed loop. Either way the version records
    its provenance and is validated as any upload."""
    loops, kind = _checked_loops(flow)
    source = source_of_loops(flow, loops)
    mode = resolve_mode(mode, source)
    if mode == MERGED:
        assert source is not None
        return _export_merged(flow, user, loops, source, dataset_name)
    name = (dataset_name or f"{flow.name}-reviewed")[:200]
    with tempfile.TemporaryDirectory(prefix="review-export-") as tmp:
        folder = Path(tmp)
        if kind == "rows":
            files, options = _write_rows(loops, folder)
        elif kind == "images":
            files, options = _write_images(loops, folder)
        else:
            files, options = _write_json_lines(loops, folder, kind)
        provenance = {"mode": REVIEWED_ONLY, "flow": {"id": flow.pk, "name": flow.name},
                      "source_job": _job_json(source.job if source else None),
                      "model_version": source.model_version.pk if source else None, "base_version": None,
                      "counts": {"reviewed": len(loops), "records": len(loops)},
                      "summary": reviewed_only_summary(len(loops), kind)}
        return _register(flow, user, name, files, options, provenance,
                         description=f"Labels consolidated by reviewers in flow '{flow.name}'.")


def _export_merged(flow: FlowDefinition, user: User, loops: list[HumanLoop], source: Source,
                   dataset_name: str | None) -> DatasetVersion:
    base = _base_of(source)
    _check_dataset_name(dataset_name, base)
    with tempfile.TemporaryDirectory(prefix="review-merge-") as tmp:
        merged = _merge(source, loops, Path(tmp), write=True)
        counts = merged.counts
        if counts.added == 0 and counts.relabelled == 0:
            raise ReviewError("flow_definition", f"Nothing to change: every reviewed record is already in "
                                                 f"{version_label(base)} with the same label.")
        options = VersionOptions(format=base.format, label_column=base.label_column, text_column=base.text_column,
                                 delimiter=base.delimiter, split=merged.split)
        provenance = {"mode": MERGED, "flow": {"id": flow.pk, "name": flow.name}, "source_job": _job_json(source.job),
                      "model_version": source.model_version.pk, "base_version": _version_json(base),
                      "counts": counts.as_dict(), "summary": summary_text(counts, version_label(base), base.format),
                      "columns": {"label": source.columns.label, "text": source.columns.text}}
        return _register(flow, user, base.dataset.name, merged.files, options, provenance, description="")


def _register(flow: FlowDefinition, user: User, name: str, files: dict[str, Path], options: VersionOptions,
              provenance: dict, description: str) -> DatasetVersion:
    """Copy the files into the store and register the version with its provenance, in
    one transaction (the version is enqueued for validation when it commits). The
    provenance also records the flow's routing: its activation and, when an evaluation
    set the threshold, which evaluation, temperature, target and threshold (docs/SPEC.md §9)."""
    provenance = {**provenance, "activation": flow.activation or {}, "calibration": flow.calibration or None}
    try:
        with transaction.atomic():
            version, created = register_local_files(
                project=flow.project, name=name, user=user, files=files, options=options, description=description,
                kind=str(SourceKind.REVIEW), source_uri=source_uri_of(flow))
            if created:
                version.provenance = provenance
                version.save(update_fields=["provenance"])
    except DatasetError as exc:
        raise ReviewError("dataset", exc.message, status=exc.status) from exc
    # The same export again finds the version that already holds it (nothing new is made).
    version.export_unchanged = not created  # type: ignore[attr-defined]
    return version


def source_job_of(version: DatasetVersion):
    """The job an export was made for: the one its provenance names, else the training
    job of the model version most of the exported flow's loops came from."""
    from hosting.models import ModelVersion
    from jobs.models import TrainingJob

    match = re.fullmatch(r"review://flows/(\d+)", version.source_uri or "")
    if version.source_kind != SourceKind.REVIEW or match is None:
        raise ReviewError("dataset_version", "This version was not exported from a review flow.")
    recorded = (version.provenance or {}).get("source_job") if isinstance(version.provenance, dict) else None
    if isinstance(recorded, dict) and isinstance(recorded.get("id"), int):
        job = TrainingJob.objects.filter(pk=recorded["id"], project_id=version.dataset.project_id).first()
        if job is not None:
            return job
    counts = Counter(HumanLoop.objects.filter(flow_definition_id=int(match.group(1)), status=LoopStatus.COMPLETED,
                                              model_version__isnull=False)
                     .exclude(consolidated_label__in=["", NO_CONSENSUS]).values_list("model_version_id", flat=True))
    for model_version_id, _count in counts.most_common():
        model_version = ModelVersion.objects.filter(pk=model_version_id, job__isnull=False).select_related("job").first()
        if model_version is not None:
            return model_version.job
    raise ReviewError("dataset_version", "No source job: the exported loops did not come from a registered model's job.")


def retrain_from_export(version: DatasetVersion, user: User):
    """Clone the source job with its "train" channel on the exported version; every other
    channel (validation, test) stays as the source job had it, so the new model is
    measured on the same records. A tuning trial's `tuning:<id>` tag is not carried."""
    from jobs.actions import JobError, submit_job, tags_for_clone
    from jobs.serializers import JobCreateSerializer

    job = source_job_of(version)
    if job.project_id != version.dataset.project_id:
        raise ReviewError("dataset_version", "The source job belongs to another project.")
    data = job.as_submission()
    data["name"] = f"{job.name}-reviewed-v{version.version}"[:200]
    inputs = data["inputs"]
    inputs["train"] = {"dataset_version": version.pk, "mode": inputs.get("train", {}).get("mode", "file")}
    data["resources"] = {k: v for k, v in data["resources"].items()
                         if k in ("instance_type", "instance_count", "processes_per_node", "memory_limit_mb")}
    checkpoint = {k: v for k, v in (data["checkpoint"] or {}).items()
                  if not (k == "uri" and job.output_uri and str(v).startswith(job.output_uri))}
    data["checkpoint"] = checkpoint or None
    tags = tags_for_clone(data["tags"])
    data["tags"] = [*tags, *([] if "reviewed" in tags else ["reviewed"])][:50]
    serializer = JobCreateSerializer(data=data)
    if not serializer.is_valid():
        field, messages = next(iter(serializer.errors.items()))
        raise ReviewError("dataset_version", f"The source job cannot be cloned ({field}: {messages}).")
    try:
        return submit_job(project=job.project, user=user, data=serializer.validated_data)
    except JobError as exc:
        field, message = next(iter(exc.fields.items()))
        raise ReviewError("dataset_version", f"{field}: {message}") from exc


# --- what the flow page says --------------------------------------------------------------------
def page_source(flow: FlowDefinition) -> Source | None:
    """The source the page's export would merge into (one query over the loops' model
    versions; the merge itself is previewed on demand)."""
    ids = exportable_loops(flow).values_list("model_version_id", flat=True)
    return source_of_model_versions(flow, ids)


def retrain_confirm_text(version: DatasetVersion) -> str:
    """The Retrain button's question: which job is cloned, what it trains on, and what it
    is validated on."""
    provenance = version.provenance if isinstance(version.provenance, dict) else {}
    holds = provenance.get("summary") or f"{version.num_records or 0:,} records"
    try:
        job = source_job_of(version)
    except ReviewError:
        return f"Start a training job on {version.dataset.name} v{version.version} ({holds})?"
    from jobs.validation_size import VALIDATION_CHANNELS, channel_records

    validation = next((i for i in job.inputs.select_related("dataset_version__dataset")
                       if i.channel.lower() in VALIDATION_CHANNELS), None)
    if validation is not None:
        kept = validation.dataset_version
        checked = (f"validated on {kept.dataset.name} v{kept.version} as before "
                   f"({channel_records(validation.channel, kept):,} records)")
    else:
        checked = "validated on a 10 % holdout of the training records, as before"
    return (f"Start a training job: a clone of {job.name}, trained on {version.dataset.name} v{version.version} "
            f"({holds}), {checked}?")
