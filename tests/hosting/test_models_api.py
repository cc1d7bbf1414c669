"""Registering models from training jobs, reading and downloading them."""

from __future__ import annotations

import io
import tarfile

from jobs.models import JobStatus, TrainingJob


def register(client, job, name="biomes"):
    return client.post("/api/v1/models/", {"project": "acme", "name": name, "job": job.pk}, format="json")


def test_register_keeps_metrics_hyperparameters_dataset_versions_and_reads_the_schema(owner, client_for, demo_job,
                                                                                       demo_version):
    response = register(client_for(owner), demo_job)
    assert response.status_code == 201, response.content
    body = response.json()
    version = body["latest_version"]
    assert version["version"] == 1 and version["job"] == demo_job.pk
    assert version["metrics"] == demo_job.final_metrics and "validation_accuracy" in version["metrics"]
    assert version["hyperparameters"] == demo_job.hyperparameters
    assert version["dataset_versions"] == {"train": demo_version.pk}
    assert version["kind"] == "tabular" and version["algorithm"] == "tabular-classifier"
    assert version["labels"] == ["alpine", "coastal", "desert"]
    schema = version["input_schema"]
    assert schema["label_column"] == "label"
    assert schema["columns"] == [f"feature_{i:02d}" for i in range(1, 11)] + ["region"]
    assert set(schema["example"]) == set(schema["columns"])


def test_registering_again_increments_the_version(owner, client_for, demo_job):
    client = client_for(owner)
    register(client, demo_job)
    second = register(client, demo_job).json()
    assert [v["version"] for v in second["versions"]] == [2, 1]
    assert second["latest_version"]["version"] == 2
    assert register(client, demo_job, name="other").json()["latest_version"]["version"] == 1


def test_a_model_from_a_failed_job_is_a_400_naming_job(owner, client_for, project, demo_job):
    failed = TrainingJob.objects.create(project=project, name="broken", algorithm="tabular-classifier",
                                        status=JobStatus.FAILED, model_uri=demo_job.model_uri)
    response = register(client_for(owner), failed)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "job" in error["fields"]
    assert error["message"] == f"job: job {failed.pk} is Failed: only a Completed job's model can be registered"
    running = TrainingJob.objects.create(project=project, name="busy", status=JobStatus.TRAINING)
    assert "is Training" in register(client_for(owner), running).json()["error"]["message"]


def test_a_job_of_another_project_or_missing_fields_are_400(owner, client_for, other_project, demo_job):
    foreign = TrainingJob.objects.create(project=other_project, name="theirs", status=JobStatus.COMPLETED,
                                         model_uri=demo_job.model_uri)
    client = client_for(owner)
    assert "job" in register(client, foreign).json()["error"]["fields"]
    response = client.post("/api/v1/models/", {"project": "acme", "job": demo_job.pk}, format="json")
    assert response.status_code == 400 and "name" in response.json()["error"]["fields"]


def test_viewer_cannot_register_but_reads_and_downloads(owner, viewer, client_for, demo_job):
    model_id = register(client_for(owner), demo_job).json()["id"]
    client = client_for(viewer)
    assert register(client, demo_job).status_code == 403
    detail = client.get(f"/api/v1/models/{model_id}/").json()
    assert detail["versions"][0]["version"] == 1
    assert [m["name"] for m in client.get("/api/v1/models/?project=acme").json()["results"]] == ["biomes"]
    download = client.get(f"/api/v1/models/{model_id}/versions/1/download")
    assert download.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(b"".join(download.streaming_content)), mode="r:gz") as tar:
        assert {"config.json", "labels.json", "model.safetensors"} <= set(tar.getnames())
    assert client.get(f"/api/v1/models/{model_id}/versions/9/download").status_code == 404


def test_outsiders_and_reviewers_get_404_on_models(owner, reviewer, outsider, client_for, demo_job):
    model_id = register(client_for(owner), demo_job).json()["id"]
    for user in (reviewer, outsider):
        client = client_for(user)
        assert client.get(f"/api/v1/models/{model_id}/").status_code == 404
        assert client.get(f"/api/v1/models/{model_id}/versions/1/download").status_code == 404
        assert client.get("/api/v1/models/").json()["results"] == []
