"""The labelled records an evaluation reads: a dataset version's channel staged exactly as a
job's channel is (jobs.runner.staging: the same files, the same seeded split), then each
record as (instance for hosting.serving.parse_instances, its label text).

Where the label is:
  - tabular and text models: the model's label column (input_schema["label_column"]);
  - image models: the class folder (cat/1.png, test/cat/1.png);
  - char-lm: none; the records are the text lines.
"""

from __future__ import annotations

import base64
import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from algorithms.channels import label_text
from algorithms.image import class_of
from datasets.models import DatasetVersion
from hosting.models import ModelKind, ModelVersion
from jobs.runner.staging import DataCache, VersionFacts, stage_channel
from trainyard.records import csv_delimiter, json_objects, open_text

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


class RecordsError(Exception):
    """The data cannot be evaluated with this model; the message is the failure reason."""


@dataclass
class Labelled:
    instances: list[Any]
    labels: list[str]  # "" where a record has no label (left out of the metrics, counted)
    unlabelled: int = 0


def cache() -> DataCache:
    return DataCache(Path(settings.DATA_DIR) / "evaluation-cache")


def stage(dataset_version: DatasetVersion, channel: str, target: Path) -> None:
    """The channel's files under `target` (the whole version when channel is "")."""
    stage_channel(channel or "all", "file", VersionFacts.of(dataset_version), target, cache())


def _files(folder: Path) -> list[Path]:
    return sorted(path for path in folder.rglob("*") if path.is_file() and not path.name.startswith("."))


def _rows(path: Path, dataset_version: DatasetVersion) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as binary:
        text = open_text(binary)
        if dataset_version.format == "csv":
            reader = csv.DictReader(text, delimiter=csv_delimiter(path.name, dataset_version.delimiter))
            yield from reader
            return
        try:
            yield from json_objects(text, path.name)
        except ValueError as exc:
            raise RecordsError(str(exc)) from None


def labelled_records(version: ModelVersion, dataset_version: DatasetVersion, folder: Path) -> Labelled:
    """Every record under the staged `folder`, in path then file order."""
    out = Labelled([], [])
    fmt = dataset_version.format
    name = f"{dataset_version.dataset.name} v{dataset_version.version}"
    model = f"{version.model.name} v{version.version}"
    if version.kind == ModelKind.IMAGE:
        if fmt != "image_folder":
            raise RecordsError(f"an image model reads an image folder; {name} is {fmt}")
        for path in _files(folder):
            if path.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            label = class_of(path.relative_to(folder)) or ""
            out.instances.append(base64.b64encode(path.read_bytes()).decode("ascii"))
            out.labels.append(label)
        return _counted(out)
    if version.kind == ModelKind.GENERATIVE:
        if fmt != "text":
            raise RecordsError(f"a char-lm model reads text; {name} is {fmt}")
        for path in _files(folder):
            with open(path, "rb") as binary:
                out.instances.extend(line.rstrip("\n") for line in open_text(binary) if line.strip())
        out.labels = [""] * len(out.instances)
        return out
    if fmt not in ("csv", "jsonl"):
        raise RecordsError(f"a {version.kind} model reads CSV or JSON Lines rows; {name} is {fmt}")
    label_column = (version.input_schema or {}).get("label_column") or dataset_version.label_column
    if not label_column:
        raise RecordsError(f"model {model} names no label column, and {name} has none: the evaluation cannot tell "
                           "which column holds the truth")
    text_column = (version.input_schema or {}).get("text_column") or "text"
    for path in _files(folder):
        for index, row in enumerate(_rows(path, dataset_version)):
            if index == 0 and label_column not in row:
                columns = ", ".join(map(str, row)) or "none"
                raise RecordsError(f"{name} has no column '{label_column}', the label model {model} predicts "
                                   f"(its columns: {columns})")
            label = label_text(row.get(label_column))
            if version.kind == ModelKind.TEXT:
                if text_column not in row:
                    raise RecordsError(f"{name} has no text column '{text_column}' (model {model} reads that column)")
                out.instances.append(row[text_column])
            else:
                out.instances.append({key: value for key, value in row.items() if key != label_column})
            out.labels.append(label)
    return _counted(out)


def _counted(out: Labelled) -> Labelled:
    out.unlabelled = sum(1 for label in out.labels if not label)
    return out
