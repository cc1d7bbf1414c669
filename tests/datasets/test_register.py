"""Registering datasets through the API: uploads, server paths, and every bad input
getting a clear 4xx or an `invalid` version, never a 500 or a half-written version."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from datasets.models import Dataset, DatasetVersion
from datasets.validation_run import run_validation
from jobs.models import JobInput, TrainingJob

GOOD_CSV = b"x,y,label\n1,2.5,a\n2,3.5,b\n3,4.5,a\n"


def upload(client, name="iris", files=None, **fields):
    files = files if files is not None else [("train.csv", GOOD_CSV)]
    data = {"project": "acme", "name": name, **fields}
    data["file"] = [SimpleUploadedFile(fname, content, content_type="text/csv") for fname, content in files]
    return client.post("/api/v1/datasets/", data, format="multipart")


def uploaded_objects(isolated_storage) -> set[Path]:
    root = isolated_storage["objects"] / "uploads"
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def test_upload_creates_a_validating_version_then_ready(owner, client_for, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = upload(client_for(owner), description="Flowers")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "validating"
    assert body["version"] == 1
    assert body["name"] == "iris"
    assert len(callbacks) == 1  # validation is enqueued once the row is committed
    assert run_validation(body["id"]) == "ready"
    detail = client_for(owner).get(f"/api/v1/dataset-versions/{body['id']}/").json()
    assert detail["status"] == "ready"
    assert detail["num_records"] == 3
    assert detail["format"] == "csv"
    assert [c["name"] for c in detail["schema"]["columns"]] == ["x", "y", "label"]
    assert detail["schema"]["classes"] == {"a": 2, "b": 1}
    assert len(detail["preview"]) == 3
    assert len(detail["content_hash"]) == 64
    assert detail["errors"] == []


def test_same_content_returns_the_existing_version(owner, client_for, isolated_storage):
    client = client_for(owner)
    first = upload(client).json()
    before = len(uploaded_objects(isolated_storage))
    again = upload(client)
    assert again.status_code == 200
    assert again.json()["id"] == first["id"]
    assert again.json()["created"] is False
    assert len(uploaded_objects(isolated_storage)) == before  # the duplicate upload was removed
    changed = upload(client, files=[("train.csv", GOOD_CSV + b"4,5.5,b\n")])
    assert changed.status_code == 201
    assert changed.json()["version"] == 2


def test_channels_from_separate_parts(owner, client_for):
    client = client_for(owner)
    data = {
        "project": "acme", "name": "split-by-files",
        "train": SimpleUploadedFile("data.csv", GOOD_CSV), "validation": SimpleUploadedFile("data.csv", GOOD_CSV[:-8] + b"\n"),
    }
    response = client.post("/api/v1/datasets/", data, format="multipart")
    assert response.status_code == 201, response.content
    assert sorted(f["path"] for f in response.json()["files"]) == ["train/data.csv", "validation/data.csv"]


def test_folder_upload_keeps_relative_paths(owner, client_for):
    client = client_for(owner)
    data = {
        "project": "acme", "name": "folder", "paths": ["cats/001.txt", "dogs/001.txt"],
        "file": [SimpleUploadedFile("001.txt", b"meow\n"), SimpleUploadedFile("001.txt", b"woof\n")],
    }
    response = client.post("/api/v1/datasets/", data, format="multipart")
    assert response.status_code == 201, response.content
    assert sorted(f["path"] for f in response.json()["files"]) == ["cats/001.txt", "dogs/001.txt"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"a,b,c\n1,2,3\n4,5\n", "line 3: expected 3 fields, found 2"),
        (b"a;b;c\n1;2;3\n4;5;6\n", "';'"),
        (b"a,b\n1,2\n\xff\xfe,3\n", "UTF-8"),
        (b"a,b,c\n", "no records"),
    ],
    ids=["ragged", "wrong-delimiter", "non-utf8", "header-only"],
)
def test_bad_content_makes_an_invalid_version_with_reasons(owner, client_for, content, message):
    body = upload(client_for(owner), files=[("train.csv", content)]).json()
    assert run_validation(body["id"]) == "invalid"
    version = DatasetVersion.objects.get(pk=body["id"])
    assert version.status == "invalid"
    assert version.errors, "an invalid version must say why"
    rendered = "; ".join(f"{e['file']} line {e['line']}: {e['message']}" for e in version.errors)
    assert message in rendered
    assert all(e["file"] == "train.csv" for e in version.errors)


def test_zero_byte_upload_is_refused_and_leaves_nothing(owner, client_for, isolated_storage):
    before = uploaded_objects(isolated_storage)
    response = upload(client_for(owner), files=[("train.csv", b"")])
    assert response.status_code == 400
    error = response.json()["error"]
    assert "file" in error["fields"]
    assert "empty" in error["message"]
    assert not Dataset.objects.exists()
    assert uploaded_objects(isolated_storage) == before


def test_over_limit_upload_is_413_and_leaves_nothing(owner, client_for, settings, isolated_storage):
    settings.STUDIO_MAX_UPLOAD_BYTES = 1000
    before = uploaded_objects(isolated_storage)
    response = upload(client_for(owner), files=[("train.csv", b"a,b\n" + b"1,2\n" * 600)])
    assert response.status_code == 413
    assert "STUDIO_MAX_UPLOAD_BYTES" in response.json()["error"]["message"]
    assert not DatasetVersion.objects.exists()
    assert uploaded_objects(isolated_storage) == before


def test_over_limit_by_declared_length_is_refused_before_reading(owner, client_for, settings):
    settings.STUDIO_MAX_UPLOAD_BYTES = 10
    response = client_for(owner).post("/api/v1/datasets/", b"x" * 10, content_type="multipart/form-data; boundary=zzz",
                                      CONTENT_LENGTH=str(50 * 1024 * 1024))
    assert response.status_code == 413


def test_duplicate_file_names_are_refused(owner, client_for, isolated_storage):
    before = uploaded_objects(isolated_storage)
    response = upload(client_for(owner), files=[("train.csv", GOOD_CSV), ("train.csv", GOOD_CSV)])
    assert response.status_code == 400
    assert "Two files are named train.csv" in response.json()["error"]["message"]
    assert uploaded_objects(isolated_storage) == before


def test_missing_name_and_source_are_field_errors(owner, client_for):
    response = client_for(owner).post("/api/v1/datasets/", {"project": "acme"}, format="json")
    assert response.status_code == 400
    assert "name" in response.json()["error"]["fields"]
    response = client_for(owner).post("/api/v1/datasets/", {"project": "acme", "name": "x"}, format="json")
    assert response.status_code == 400
    assert "source_uri" in response.json()["error"]["fields"]


def test_script_in_name_and_description_is_stored_verbatim(owner, client_for):
    response = upload(client_for(owner), name="<script>alert(1)</script>", description="<img src=x onerror=alert(1)>")
    assert response.status_code == 201
    assert Dataset.objects.get().name == "<script>alert(1)</script>"
    assert response["Content-Type"] == "application/json"


# --- server paths ---------------------------------------------------------------------------
def test_server_path_under_allowed_root_registers_in_place(owner, client_for, data_root):
    folder = data_root / "iris"
    folder.mkdir()
    (folder / "train.csv").write_bytes(GOOD_CSV)
    client = client_for(owner)
    response = client.post("/api/v1/datasets/", {"project": "acme", "name": "iris", "source_uri": folder.as_uri()}, format="json")
    assert response.status_code == 201, response.content
    assert run_validation(response.json()["id"]) == "ready"
    again = client.post("/api/v1/datasets/", {"project": "acme", "name": "iris", "source_uri": folder.as_uri()}, format="json")
    assert again.status_code == 200
    assert again.json()["id"] == response.json()["id"]


@pytest.mark.parametrize("uri_suffix", ["/../../etc/passwd", "/../../../../../../etc/passwd"])
def test_path_traversal_out_of_the_root_is_refused(owner, client_for, data_root, uri_suffix):
    uri = data_root.as_uri() + uri_suffix
    response = client_for(owner).post("/api/v1/datasets/", {"project": "acme", "name": "pw", "source_uri": uri}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "source_uri" in error["fields"]
    assert "allowed data root" in error["message"]
    assert not Dataset.objects.exists()


def test_symlink_leading_out_of_the_root_is_refused(owner, client_for, data_root, tmp_path):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwords.csv").write_text("user,password\nroot,hunter2\n")
    os.symlink(secret, data_root / "innocent")
    response = client_for(owner).post(
        "/api/v1/datasets/", {"project": "acme", "name": "leak", "source_uri": (data_root / "innocent").as_uri()}, format="json"
    )
    assert response.status_code == 400
    assert "allowed data root" in response.json()["error"]["message"]


def test_symlinked_file_inside_a_folder_pointing_out_is_refused(owner, client_for, data_root, tmp_path):
    (tmp_path / "outside.csv").write_text("a\n1\n")
    folder = data_root / "mixed"
    folder.mkdir()
    (folder / "ok.csv").write_text("a\n2\n")
    os.symlink(tmp_path / "outside.csv", folder / "sneaky.csv")
    response = client_for(owner).post("/api/v1/datasets/", {"project": "acme", "name": "mixed", "source_uri": folder.as_uri()}, format="json")
    assert response.status_code == 400
    assert "outside the allowed root" in response.json()["error"]["message"]


def test_plain_path_and_unknown_scheme_are_field_errors(owner, client_for):
    client = client_for(owner)
    for uri, hint in (("/data/x.csv", "file:///data/x.csv"), ("http://example.com/x.csv", "s3://")):
        response = client.post("/api/v1/datasets/", {"project": "acme", "name": "x", "source_uri": uri}, format="json")
        assert response.status_code == 400
        assert hint in response.json()["error"]["fields"]["source_uri"][0]


def test_empty_server_folder_is_refused(owner, client_for, data_root):
    (data_root / "empty").mkdir()
    response = client_for(owner).post("/api/v1/datasets/", {"project": "acme", "name": "e", "source_uri": (data_root / "empty").as_uri()}, format="json")
    assert response.status_code == 400
    assert "no files found" in response.json()["error"]["message"]


# --- roles ----------------------------------------------------------------------------------
def test_viewer_cannot_register(viewer, client_for):
    response = upload(client_for(viewer))
    assert response.status_code == 403
    assert not Dataset.objects.exists()


def test_outsider_cannot_register_into_or_read_another_project(owner, outsider, client_for):
    response = upload(client_for(outsider))
    assert response.status_code == 400
    assert "project" in response.json()["error"]["fields"]
    version_id = upload(client_for(owner)).json()["id"]
    assert client_for(outsider).get(f"/api/v1/dataset-versions/{version_id}/").status_code == 404
    assert client_for(outsider).get("/api/v1/datasets/?project=acme").status_code == 404
    assert client_for(outsider).get("/api/v1/datasets/").json()["count"] == 0


def test_reviewer_cannot_read_datasets(owner, reviewer, client_for):
    version_id = upload(client_for(owner)).json()["id"]
    assert client_for(reviewer).get(f"/api/v1/dataset-versions/{version_id}/").status_code == 404


def test_delete_is_refused_while_a_job_uses_the_version(owner, client_for, project):
    client = client_for(owner)
    version_id = upload(client).json()["id"]
    job = TrainingJob.objects.create(project=project, name="j", status="Training")
    JobInput.objects.create(job=job, channel="train", dataset_version_id=version_id)
    response = client.delete(f"/api/v1/dataset-versions/{version_id}/")
    assert response.status_code == 409
    assert "used by a training job" in response.json()["error"]["message"]
    assert DatasetVersion.objects.filter(pk=version_id).exists()


def test_delete_removes_version_and_uploaded_files(owner, client_for, isolated_storage, django_capture_on_commit_callbacks):
    client = client_for(owner)
    before = uploaded_objects(isolated_storage)
    version_id = upload(client).json()["id"]
    assert uploaded_objects(isolated_storage) - before
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"/api/v1/dataset-versions/{version_id}/").status_code == 204
    assert not DatasetVersion.objects.exists()
    assert not Dataset.objects.exists()
    # The files go in the background (studio.deletion): run what the control worker runs.
    from studio.deletion import run_deletion
    from studio.models import PendingDeletion

    for pending_id in PendingDeletion.objects.values_list("pk", flat=True):
        run_deletion(pending_id)
    assert uploaded_objects(isolated_storage) == before


def test_dataset_list_query_count_is_bounded(owner, client_for, django_assert_max_num_queries):
    client = client_for(owner)
    for i in range(5):
        upload(client, name=f"set-{i}", files=[("train.csv", GOOD_CSV + f"{i},1,a\n".encode())])
    with django_assert_max_num_queries(8):
        body = client.get("/api/v1/datasets/?project=acme").json()
    assert body["count"] == 5
    assert all(d["latest_version"]["status"] == "validating" for d in body["results"])


def test_stalled_validation_is_requeued_and_finished(owner, client_for, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from django.utils import timezone

    from datasets.validation_run import requeue_stalled_validations

    version_id = upload(client_for(owner)).json()["id"]
    assert requeue_stalled_validations() == []  # fresh: its worker may still be starting
    long_ago = timezone.now() - timedelta(minutes=10)
    DatasetVersion.objects.filter(pk=version_id).update(created_at=long_ago, validation_heartbeat=long_ago)
    assert requeue_stalled_validations() == [version_id]
    assert requeue_stalled_validations() == []  # touched: not enqueued twice
    assert run_validation(version_id) == "ready"
    assert run_validation(version_id) is None  # a redelivered task finds it done
