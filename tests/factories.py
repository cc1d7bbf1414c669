"""Test factories shared by every test package: users with a project role, dataset versions
made through the real upload action, and training jobs. Fixtures in the conftests and the
test modules are thin wrappers that give these their own defaults."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path
from typing import Any

from django.utils import timezone

from datasets.actions import VersionOptions, register_local_files
from datasets.models import DatasetVersion, VersionStatus
from datasets.storage import default_store, object_uri, store_for
from datasets.validation import DataFile, ValidationReport, validate_files
from datasets.validation_run import run_validation
from jobs.actions import submit_job
from jobs.models import JobEvent, JobInput, JobStatus, TrainingJob
from jobs.runner.staging import VersionFacts
from studio import actions
from studio.models import Project


def password_of(username: str) -> str:
    """The password every test user gets, so a browser test can sign in with it."""
    return f"pw-{username}-123"


def make_member(project: Project, username: str, role: str, *, password: str = ""):
    """A user (created if new) with `role` in `project`."""
    user = actions.ensure_user(username, password=password or password_of(username))
    actions.set_membership(project=project, user=user, role=role)
    return user


def make_version(project: Project, tmp_path: Path, files: dict[str, str | bytes], *, name: str = "", user=None,
                 description: str = "", validate: bool = True, must_be_ready: bool = True,
                 **options: Any) -> DatasetVersion:
    """A dataset version made through the real upload action from `files` (relative path →
    text or bytes), with VersionOptions(**options). Unless validate=False it is validated
    in-process and, unless must_be_ready=False, must come out ready. The name defaults to
    the folder its files were written to (unique per call)."""
    folder = tmp_path / f"version-{uuid.uuid4().hex[:6]}"
    local: dict[str, Path] = {}
    for relative, content in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        local[relative] = path
    version, _ = register_local_files(project=project, name=name or folder.name, description=description, user=user,
                                      files=local, options=VersionOptions(**options))
    if validate:
        run_validation(version.pk)
    version.refresh_from_db()
    if validate and must_be_ready:
        assert version.status == VersionStatus.READY, version.errors
    return version


def make_job(project: Project, *, name: str = "run", inputs: dict | None = None, submitted: bool = False,
             **fields: Any) -> TrainingJob:
    """A TrainingJob row with `fields`. inputs: channel → version or (version, mode).
    submitted=True leaves it as submit_job would: an output URI under its id (unless one is
    given) and the first timeline entry, "Submitted"."""
    job = TrainingJob.objects.create(project=project, name=name, **fields)
    if submitted and not job.output_uri:
        job.output_uri = object_uri(f"jobs/{job.pk}")
        job.save(update_fields=["output_uri"])
    for channel, spec in (inputs or {}).items():
        version, mode = spec if isinstance(spec, tuple) else (spec, "file")
        JobInput.objects.create(job=job, channel=channel, dataset_version=version, mode=mode)
    if submitted:
        JobEvent.objects.create(job=job, status=JobStatus.PENDING, message="Submitted")
    return job


def submitted_job(project: Project, user, version: DatasetVersion, *, status: str | None = None,
                  **data: Any) -> TrainingJob:
    """A tabular-classifier job on `version` submitted through the real action (Pending),
    with `data` overriding the submission; `status=` then moves it there, started now."""
    body = {"name": "run", "algorithm": "tabular-classifier", "hyperparameters": {"epochs": 3},
            "inputs": {"train": {"dataset_version": version.pk}}, **data}
    job = submit_job(project=project, user=user, data=body)
    if status:
        TrainingJob.objects.filter(pk=job.pk).update(status=status, started_at=timezone.now())
        job.refresh_from_db()
    return job


def validated_version_facts(tmp_path: Path, files: dict[str, bytes], *, split: dict | None = None,
                            fmt: str | None = None) -> tuple[VersionFacts, ValidationReport]:
    """`files` written to the object store and validated by the real validator, as the
    facts node staging reads (validation's record numbering is what staging and the SDK
    must reproduce), with the validation report."""
    prefix = f"facts-{hashlib.sha1(str(tmp_path).encode()).hexdigest()[:8]}-{len(files)}"
    data_files = []
    for path, content in files.items():
        uri = object_uri(f"{prefix}/{path}")
        with default_store().open_write(uri) as out:
            out.write(content)
        data_files.append(DataFile(path=path, uri=uri, size=len(content)))
    report = validate_files(data_files, format=fmt, open_read=lambda uri: store_for(uri).open_read(uri), split=split)
    assert report.ok, report.errors
    by_path = {f.path: f for f in data_files}
    rows = [{**row, "uri": by_path[row["path"]].uri} for row in report.files]
    facts = VersionFacts(id=1, label="demo v1", content_hash=report.content_hash, format=report.format, files=rows,
                         split=split or {})
    return facts, report
