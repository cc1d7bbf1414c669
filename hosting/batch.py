"""A batch prediction, run by a control worker (hosting.tasks.run_batch_prediction_task):

1. Claim the row (Pending → Running, compare-and-set: a duplicate delivery does nothing).
2. Read every record of the dataset version in file order (csv, jsonl, text lines, or
   image files), predict in chunks and write one JSON line per record to
   object_uri("batch-predictions/<id>/predictions.jsonl").
3. After each chunk, in one transaction: start the flow's human loops for the chunk and
   move records_done and the heartbeat. A rerun after a worker died (the beat task puts a
   stale Running batch back to Pending) rewrites the file from the start but starts loops
   only for records past records_done, so no record is sent to people twice.
4. End Completed, or Failed with a reason a person can act on.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
from collections.abc import Iterator
from itertools import islice
from pathlib import PurePosixPath
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from datasets.storage import StorageError, object_uri, store_for
from hosting.flows import send_predictions
from hosting.invocation import calibration_fields
from hosting.models import BatchPrediction, BatchStatus, ModelKind, ModelVersion
from hosting.serving import InvalidInstances, parse_instances, predictor_for
from trainyard.records import json_objects

log = logging.getLogger(__name__)

CHUNK = 512
IMAGE_SUFFIXES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg"}


class BatchFailure(Exception):
    """Why the batch cannot finish, in words for the person who submitted it."""


def _text_stream(uri: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(store_for(uri).open_read(uri), encoding="utf-8-sig", newline="")


def _csv_rows(path: str, uri: str, delimiter: str, columns: list[str] | None) -> Iterator[dict[str, Any]]:
    delimiter = delimiter or ("\t" if path.lower().endswith(".tsv") else ",")
    with _text_stream(uri) as stream:
        reader = csv.DictReader(stream, delimiter=delimiter)
        header = reader.fieldnames or []
        if columns is not None:
            missing = [column for column in columns if column not in header]
            if missing:
                raise BatchFailure(f"the dataset's columns do not match the model's features: missing "
                                   f"{', '.join(missing)} in {path} (its columns are {', '.join(header)})")
        yield from reader


def _jsonl_rows(path: str, uri: str) -> Iterator[dict[str, Any]]:
    with _text_stream(uri) as stream:
        try:
            yield from json_objects(stream, path)
        except ValueError as exc:
            raise BatchFailure(str(exc)) from None


def records_of(version: ModelVersion, dataset_version) -> Iterator[tuple[Any, Any]]:
    """(instance for parse_instances, what the JSONL line shows as input) per record."""
    files = sorted(dataset_version.files, key=lambda item: item["path"])
    fmt = dataset_version.format
    columns = version.input_schema.get("columns") if version.kind == ModelKind.TABULAR else None
    text_column = version.input_schema.get("text_column") or dataset_version.text_column or "text"
    for item in files:
        path, uri = item["path"], item["uri"]
        if fmt == "image_folder":
            suffix = PurePosixPath(path).suffix.lower()
            if suffix not in IMAGE_SUFFIXES:
                continue
            with store_for(uri).open_read(uri) as stream:
                data = stream.read()
            yield base64.b64encode(data).decode("ascii"), {"path": path}
            continue
        if fmt == "text":
            with _text_stream(uri) as stream:
                for line in stream:
                    if line.strip():
                        text = line.rstrip("\r\n")
                        yield text, {"input": text}
            continue
        rows = _csv_rows(path, uri, dataset_version.delimiter, columns) if fmt == "csv" else _jsonl_rows(path, uri)
        for row in rows:
            if version.kind == ModelKind.TEXT:
                if text_column not in row:
                    raise BatchFailure(f"the dataset has no text column {text_column!r} (the model reads that column)")
                yield row[text_column], {"input": row[text_column]}
            else:
                yield row, None  # the row's features, filled in after parsing


def _chunks(iterator: Iterator[Any], size: int) -> Iterator[list[Any]]:
    while chunk := list(islice(iterator, size)):
        yield chunk


def _explain(exc: InvalidInstances, start: int) -> str:
    """'instances[3]: missing feature 'x'' → words about the dataset's record."""
    message = str(exc)
    if message.startswith("instances["):
        index, _, rest = message[len("instances["):].partition("]: ")
        if index.isdigit():
            record = start + int(index)
            if rest.startswith("missing feature"):
                return f"the dataset's columns do not match the model's features: record {record} is {rest}"
            return f"record {record}: {rest}"
    return message


def run_batch_prediction(batch_id: int) -> str:
    """The batch's final status ("skipped" when another worker has it or it is finished)."""
    now = timezone.now()
    claimed = BatchPrediction.objects.filter(pk=batch_id, status=BatchStatus.PENDING).update(
        status=BatchStatus.RUNNING, heartbeat_at=now)
    if not claimed:
        return "skipped"
    batch = BatchPrediction.objects.select_related("model_version", "dataset_version", "flow_definition").get(pk=batch_id)
    if batch.started_at is None:
        BatchPrediction.objects.filter(pk=batch_id).update(started_at=now)
    try:
        total = _predict_all(batch)
    except (BatchFailure, StorageError, OSError, ValueError) as exc:
        reason = _explain(exc, 0) if isinstance(exc, InvalidInstances) else str(exc)
        _finish(batch_id, BatchStatus.FAILED, failure_reason=reason)
        return BatchStatus.FAILED
    except Exception as exc:  # noqa: BLE001 - the row must not stay Running forever
        log.exception("batch prediction %s failed", batch_id)
        _finish(batch_id, BatchStatus.FAILED, failure_reason=f"internal error ({type(exc).__name__}: {exc}); "
                                                             "the control worker's log has the details")
        return BatchStatus.FAILED
    _finish(batch_id, BatchStatus.COMPLETED, records_total=total, records_done=total)
    return BatchStatus.COMPLETED


def _finish(batch_id: int, status: str, **fields: Any) -> None:
    BatchPrediction.objects.filter(pk=batch_id).update(status=status, finished_at=timezone.now(),
                                                       heartbeat_at=timezone.now(), **fields)


def _predict_all(batch: BatchPrediction) -> int:
    version = batch.model_version
    resume_from = batch.records_done  # loops for records before this were started by an earlier run
    predictor = predictor_for(version)
    uri = object_uri(f"batch-predictions/{batch.pk}/predictions.jsonl")
    BatchPrediction.objects.filter(pk=batch.pk).update(output_uri=uri, records_total=batch.dataset_version.num_records)
    done = 0
    with store_for(uri).open_write(uri) as out:
        for chunk in _chunks(records_of(version, batch.dataset_version), CHUNK):
            start = done
            instances = [instance for instance, _ in chunk]
            try:
                parsed, contents = parse_instances(version, instances)
                predictions = (predictor.predict(parsed, version.calibration) if version.calibration
                               else predictor.predict(parsed))
            except InvalidInstances as exc:
                raise BatchFailure(_explain(exc, start)) from None
            lines = []
            calibrated = calibration_fields(version)
            for offset, ((_, shown), row, prediction) in enumerate(zip(chunk, parsed, predictions, strict=True)):
                line = {"record": start + offset, **(shown if shown is not None else {"input": row}), **prediction,
                        **calibrated}
                lines.append(json.dumps(line, ensure_ascii=False))
            out.write(("\n".join(lines) + "\n").encode("utf-8"))
            done += len(chunk)
            _after_chunk(batch, version, start, contents, predictions, resume_from, done)
    return done


def _after_chunk(batch: BatchPrediction, version: ModelVersion, start: int, contents: list[dict],
                 predictions: list[dict], resume_from: int, done: int) -> None:
    skip = max(0, resume_from - start)  # records an earlier run already sent to people
    with transaction.atomic():
        started: list[str] = []
        if batch.flow_definition is not None and skip < len(contents):
            started = send_predictions(
                BatchPrediction, batch.flow_definition, list(zip(contents[skip:], predictions[skip:], strict=True)),
                source={"batch": batch.pk}, model_version=version, first_record=start + skip)
        fields: dict[str, Any] = {"heartbeat_at": timezone.now(), "human_loops_started": F("human_loops_started") + len(started)}
        if done > resume_from:
            fields["records_done"] = done
        BatchPrediction.objects.filter(pk=batch.pk).update(**fields)
