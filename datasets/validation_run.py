"""Runs the validation engine over a stored DatasetVersion and records the outcome."""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.utils import timezone

from datasets.models import DatasetVersion, VersionStatus
from datasets.storage import store_for
from datasets.validation import DataFile, assign_file_channels, validate_files

log = logging.getLogger(__name__)
PROGRESS_EVERY_SECONDS = 1.0


def run_validation(version_id: int) -> str | None:
    """1. Load the version if it still awaits validation (a redelivered task finds it done).
    2. Stream every file through the format's validator, reporting progress.
    3. Record ready or invalid with one targeted update, so nothing half-written shows."""
    version = DatasetVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).first()
    if version is None:
        return None
    DatasetVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(validation_heartbeat=timezone.now())
    files = assign_file_channels([DataFile(path=f["path"], uri=f["uri"], size=f["size"]) for f in version.files])
    last_report = [0.0]

    def progress(fraction: float) -> None:
        now = time.monotonic()
        if now - last_report[0] >= PROGRESS_EVERY_SECONDS:
            last_report[0] = now
            DatasetVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(
                progress=round(fraction, 4), validation_heartbeat=timezone.now()
            )

    def open_read(uri: str):
        return store_for(uri).open_read(uri)

    try:
        report = validate_files(
            files, format=version.format or None, open_read=open_read, label_column=version.label_column,
            text_column=version.text_column, delimiter=version.delimiter, split=version.split or None, progress=progress,
        )
    except Exception as exc:  # a bug must still end the version, with a reason, not leave it validating
        log.exception("validation of dataset version %s crashed", version_id)
        DatasetVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(
            status=VersionStatus.INVALID, validated_at=timezone.now(),
            errors=[{"file": None, "line": None, "message": f"Validation failed unexpectedly: {type(exc).__name__}: {exc}"}],
        )
        return str(VersionStatus.INVALID)

    by_path = {f["path"]: f for f in report.files}
    merged = [{**f, **{k: v for k, v in by_path.get(f["path"], {}).items() if k in ("sha256", "channel", "records")}}
              for f in version.files]
    new_status = str(VersionStatus.READY if report.ok else VersionStatus.INVALID)
    with transaction.atomic():
        DatasetVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(
            status=new_status,
            format=report.format or version.format,
            errors=report.errors,
            num_records=report.num_records,
            schema=report.schema,
            label_column=(report.schema or {}).get("label_column") or version.label_column or "",
            preview=report.preview,
            content_hash=report.content_hash or version.content_hash,
            channel_counts=report.channel_counts,
            files=merged,
            progress=1.0,
            validated_at=timezone.now(),
        )
    return new_status


STALLED_AFTER_SECONDS = 300


def requeue_stalled_validations(older_than_seconds: int = STALLED_AFTER_SECONDS) -> list[int]:
    """Hand validations whose worker died (no heartbeat for a while) to a live worker.
    Running one twice is harmless: the outcome is written only while still validating."""
    from datasets.tasks import validate_version_task

    stalled = list(DatasetVersion.objects.stalled(older_than_seconds).values_list("pk", flat=True))
    for version_id in stalled:
        # Touch first so the next sweep does not enqueue it again before a worker starts.
        DatasetVersion.objects.filter(pk=version_id, status=VersionStatus.VALIDATING).update(validation_heartbeat=timezone.now())
        validate_version_task.delay(version_id)
    if stalled:
        log.warning("re-enqueued stalled dataset validations: %s", stalled)
    return stalled
