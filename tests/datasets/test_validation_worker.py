"""Validation runs in a real Celery worker process, enqueued when the upload commits."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from datasets.models import DatasetVersion
from tests.conftest import wait_for

pytestmark = pytest.mark.slow


def test_uploaded_csv_turns_ready_through_the_worker(celery_worker, owner, client_for):
    rows = "".join(f"{i},{i * 0.5},{'ab'[i % 2]}\n" for i in range(500))
    data = {"project": "acme", "name": "worker-csv", "file": SimpleUploadedFile("train.csv", ("a,b,label\n" + rows).encode())}
    response = client_for(owner).post("/api/v1/datasets/", data, format="multipart")
    assert response.status_code == 201, response.content
    version_id = response.json()["id"]

    def finished():
        version = DatasetVersion.objects.get(pk=version_id)
        return version if version.status != "validating" else None

    version = wait_for(finished, timeout=60, message="validation by the worker")
    assert version.status == "ready", version.errors
    assert version.num_records == 500
    assert version.schema["classes"] == {"a": 250, "b": 250}
    assert version.progress == 1.0


def test_ragged_upload_turns_invalid_through_the_worker(celery_worker, owner, client_for):
    data = {"project": "acme", "name": "ragged", "file": SimpleUploadedFile("train.csv", b"a,b,c\n1,2,3\n1,2\n")}
    version_id = client_for(owner).post("/api/v1/datasets/", data, format="multipart").json()["id"]
    version = wait_for(lambda: DatasetVersion.objects.filter(pk=version_id).exclude(status="validating").first(), timeout=60)
    assert version.status == "invalid"
    assert version.errors[0]["line"] == 3
    assert version.errors[0]["message"] == "expected 3 fields, found 2"
