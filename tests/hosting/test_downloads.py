"""A batch prediction's predictions.jsonl, downloaded through the API and linked from the
model's page: the bytes the batch wrote, streamed; readers only; 409
until the batch completes; a presigned redirect where the object store is S3."""

from __future__ import annotations

import uuid

import pytest
import requests
from django.test import Client

from datasets.storage import local_roots, store_for
from hosting import actions
from hosting.batch import run_batch_prediction
from hosting.models import BatchStatus


@pytest.fixture
def model_version(owner, demo_job):
    return actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)


def submit(client, demo_version) -> int:
    response = client.post("/api/v1/batch-predictions/", {"project": "acme", "model": "biomes",
                                                          "dataset_version": demo_version.pk}, format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


def test_a_completed_batch_downloads_its_predictions_for_a_viewer(owner, viewer, client_for, model_version,
                                                                  demo_version):
    batch_id = submit(client_for(owner), demo_version)
    client = client_for(viewer)
    pending = client.get(f"/api/v1/batch-predictions/{batch_id}/download")
    assert pending.status_code == 409 and pending.json()["error"]["code"] == "not_ready"
    assert client.get(f"/api/v1/batch-predictions/{batch_id}/").json()["download_url"] is None

    assert run_batch_prediction(batch_id) == BatchStatus.COMPLETED
    detail = client.get(f"/api/v1/batch-predictions/{batch_id}/").json()
    assert detail["download_url"] == f"/api/v1/batch-predictions/{batch_id}/download"
    response = client.get(detail["download_url"])
    assert response.status_code == 200 and response.streaming
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"] == f'attachment; filename="batch-{batch_id}-predictions.jsonl"'
    with store_for(detail["output_uri"]).open_read(detail["output_uri"]) as stream:
        assert b"".join(response.streaming_content) == stream.read()

    page = Client()
    page.force_login(viewer)
    html = page.get(f"/models/{model_version.model_id}/").content.decode()
    assert f'href="/api/v1/batch-predictions/{batch_id}/download"' in html


def test_outsiders_get_404_for_a_batch_download(owner, outsider, reviewer, client_for, model_version, demo_version):
    batch_id = submit(client_for(owner), demo_version)
    assert run_batch_prediction(batch_id) == BatchStatus.COMPLETED
    for user in (outsider, reviewer):
        response = client_for(user).get(f"/api/v1/batch-predictions/{batch_id}/download")
        assert response.status_code == 404, user.username
    assert client_for(owner).get("/api/v1/batch-predictions/999999/download").status_code == 404


def test_on_s3_the_batch_download_is_a_presigned_redirect(owner, client_for, model_version, demo_version, s3,
                                                          settings):
    bucket = f"bucket-{uuid.uuid4().hex[:10]}"
    s3.create_bucket(Bucket=bucket)
    # The dataset and the model stay where they were written (now an allowed data root);
    # the batch writes its output to the S3 store.
    settings.STUDIO_DATA_ROOTS = [*settings.STUDIO_DATA_ROOTS, *local_roots()]
    settings.STUDIO_OBJECT_STORE = f"s3://{bucket}/studio"
    batch_id = submit(client_for(owner), demo_version)
    assert run_batch_prediction(batch_id) == BatchStatus.COMPLETED
    detail = client_for(owner).get(f"/api/v1/batch-predictions/{batch_id}/").json()
    assert detail["output_uri"] == f"s3://{bucket}/studio/batch-predictions/{batch_id}/predictions.jsonl"
    response = client_for(owner).get(detail["download_url"])
    assert response.status_code == 302
    fetched = requests.get(response["Location"], timeout=10)
    assert fetched.status_code == 200
    lines = fetched.text.splitlines()
    assert len(lines) == detail["records_total"] and '"label"' in lines[0]


def test_a_failed_batch_says_why_it_has_nothing_to_download(owner, client_for, project, model_version, tmp_path):
    from datasets.actions import VersionOptions, register_local_files
    from datasets.validation_run import run_validation

    wrong = tmp_path / "wrong.csv"
    wrong.write_text("a,label\n1,x\n2,y\n")
    version, _ = register_local_files(project=project, name="wrong-columns", description="", user=owner,
                                      files={"wrong.csv": wrong}, options=VersionOptions(format="csv", label_column="label"))
    assert run_validation(version.pk) == "ready"
    batch_id = submit(client_for(owner), version)
    assert run_batch_prediction(batch_id) == BatchStatus.FAILED
    response = client_for(owner).get(f"/api/v1/batch-predictions/{batch_id}/download")
    assert response.status_code == 409
    message = response.json()["error"]["message"]
    assert message.startswith(f"Batch prediction {batch_id} failed, so it wrote no predictions.jsonl: ")
    assert "the dataset's columns do not match the model's features" in message
