"""Submitting jobs through the API: every bad input is a field error, nothing is created."""

from __future__ import annotations

import io
import tarfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.models import JobStatus, Node, TrainingJob
from tests.factories import make_version


@pytest.fixture
def ready_version(project, owner, tmp_path):
    table = "a,b,label\n" + "".join(f"{i},{i % 7},{'xy'[i % 2]}\n" for i in range(60))
    return make_version(project, tmp_path, {"train.csv": table}, name="tiny", user=owner)


@pytest.fixture
def text_version(project, owner, tmp_path):
    """Plain text: what char-lm reads (a table is refused at submit)."""
    prose = "".join(f"The quick brown fox {i} jumps over the lazy dog.\n" for i in range(50))
    return make_version(project, tmp_path, {"train.txt": prose}, name="prose", user=owner)


@pytest.fixture
def validating_version(project, owner, tmp_path):
    return make_version(project, tmp_path, {"train.csv": "a,label\n1,x\n"}, name="pending", user=owner, validate=False)


def job_body(version_id: int, **overrides) -> dict:
    return {"project": "acme", "name": "first", "algorithm": "tabular-classifier",
            "hyperparameters": {"epochs": 2}, "inputs": {"train": {"dataset_version": version_id}}, **overrides}


def _dotted(fields: dict, prefix: str = ""):
    for key, value in fields.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{key}.")


def submit(client, body):
    return client.post("/api/v1/jobs/", body, format="json")


def test_submit_creates_a_pending_job_with_timeline(owner, client_for, ready_version, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = submit(client_for(owner), job_body(ready_version.pk, tags=["baseline"]))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "Pending"
    assert body["hyperparameters"]["epochs"] == 2
    assert body["hyperparameters"]["learning_rate"] is not None  # defaults filled from the schema
    assert body["hyperparameters"]["label_column"] == "label"  # the label validation found
    assert body["inputs"]["train"]["dataset_version"] == ready_version.pk
    assert body["timeline"][0]["status"] == "Pending"
    assert body["output_uri"].endswith(f"/jobs/{body['id']}")
    assert len(callbacks) == 1  # a scheduling tick is sent on commit
    detail = client_for(owner).get(f"/api/v1/jobs/{body['id']}/").json()
    assert detail["attempt"] == 0 and detail["failure_reason"] == "" and detail["model_uri"] == ""
    assert (detail["tuning_job"], detail["trial_number"], detail["objective_value"]) == (None, None, None)


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        ({"algorithm": "no-such-algo"}, "algorithm", "Unknown algorithm 'no-such-algo'"),
        ({"hyperparameters": {"epochs": "many"}}, "hyperparameters.epochs", "integer"),
        ({"hyperparameters": {"learning_rate": 50}}, "hyperparameters.learning_rate", "≤"),
        ({"hyperparameters": {"made_up": 1}}, "hyperparameters.made_up", ""),
        ({"inputs": {}}, "inputs", "train"),
        ({"inputs": {"train": {"dataset_version": 999999}}}, "inputs.train", "No dataset version 999999"),
        ({"inputs": {"train": {"dataset_version": 1, "mode": "teleport"}}}, "inputs.train", "mode"),
        ({"resources": {"processes_per_node": 64}}, "resources.processes_per_node", "more than the 2 CPUs"),
        ({"distribution": "pipeline"}, "pipeline", "needs pipeline"),
        ({"distribution": "fsdp"}, "distribution", "tabular-classifier does not support distribution 'fsdp'"),
        ({"pipeline": {"stages": 2}}, "pipeline", "only with distribution"),
        ({"distribution": "pipeline", "pipeline": {"stages": 1}}, "pipeline.stages", "2"),
        ({"distribution": "pipeline", "pipeline": {"stages": 2, "partition": [1]}}, "pipeline.partition",
         "one count per stage"),
        ({"distribution": "pipeline", "pipeline": {"stages": 2, "partition": "balanced"}}, "pipeline.partition",
         "auto"),
        ({"distribution": "pipeline", "pipeline": {"stages": 2, "schedule": "zigzag"}}, "pipeline.schedule", ""),
        ({"priority": 1000}, "priority", "100"),
        ({"stopping": {"max_runtime_seconds": 0}}, "stopping", ""),
        ({"metric_definitions": [{"name": "loss", "regex": "loss=("}]}, "metric_definitions", "regular expression"),
        ({"metric_definitions": [{"name": "loss", "regex": "loss=[0-9.]+"}]}, "metric_definitions", "capture group"),
        ({"environment": {"SM_MODEL_DIR": "/tmp"}}, "environment", "cannot be overridden"),
        ({"name": "   "}, "name", "blank"),
        ({"algorithm": "", "script": None}, "algorithm", "either an algorithm"),
        ({"keep_alive_seconds": 7200}, "keep_alive_seconds", "3600"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_submissions_are_field_errors(owner, client_for, ready_version, overrides, field, text):
    Node.objects.create(name="n1", hostname="h", queue="node.n1", cpus=2)
    response = submit(client_for(owner), job_body(ready_version.pk, **overrides))
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    # Nested serializers answer nested ({"pipeline": {"stages": [...]}}); checks in
    # submit_job answer dotted ({"pipeline.partition": "..."}): both name the field.
    keys = list(_dotted(error["fields"]))
    assert any(key == field or key.startswith(field + ".") or key.startswith(field) for key in keys), error
    assert text in str(error), error
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize(
    ("pipeline", "resources", "field", "text"),
    [
        ({"stages": 2, "partition": [2, 3]}, {}, "pipeline.partition", "add up to 5 but the model has 4 layers"),
        ({"stages": 5}, {"processes_per_node": 5}, "pipeline.stages", "cannot be cut into 5 stages"),
        ({"stages": 2}, {"processes_per_node": 1}, "pipeline.stages", "instance_count × processes_per_node = 1"),
        ({"stages": 2, "microbatches": 64}, {}, "pipeline.microbatches", "do not fit a batch of 32"),
    ],
)
def test_bad_pipelines_for_char_lm_are_field_errors(owner, client_for, text_version, pipeline, resources, field,
                                                    text):
    Node.objects.create(name="n1", hostname="h", queue="node.n1", cpus=8)
    body = job_body(text_version.pk, algorithm="char-lm", hyperparameters={"layers": 2}, distribution="pipeline",
                    pipeline=pipeline, resources=resources)
    response = submit(client_for(owner), body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in error["fields"], error
    assert text in error["fields"][field][0], error
    assert not TrainingJob.objects.exists()


def test_a_pipeline_job_gets_one_process_per_stage(owner, client_for, text_version):
    Node.objects.create(name="n1", hostname="h", queue="node.n1", cpus=8)
    body = job_body(text_version.pk, algorithm="char-lm", hyperparameters={"layers": 2}, distribution="pipeline",
                    pipeline={"stages": 2, "schedule": "1f1b", "partition": [1, 3]}, priority=5)
    response = submit(client_for(owner), body)
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["resources"]["processes_per_node"] == 2
    assert job["pipeline"] == {"stages": 2, "microbatches": 4, "schedule": "1f1b", "partition": [1, 3]}
    assert job["priority"] == 5


def test_version_that_is_not_ready_is_refused(owner, client_for, validating_version):
    response = submit(client_for(owner), job_body(validating_version.pk))
    assert response.status_code == 400
    assert "validating, not ready" in response.json()["error"]["fields"]["inputs.train"][0]


def test_version_of_another_project_is_not_found(owner, outsider, client_for, other_project, tmp_path):
    theirs = make_version(other_project, tmp_path, {"train.csv": "a,label\n1,x\n2,y\n"}, name="theirs", user=outsider,
                          must_be_ready=False)
    response = submit(client_for(owner), job_body(theirs.pk))
    assert response.status_code == 400
    assert "No dataset version" in response.json()["error"]["message"]


def test_viewer_cannot_submit_and_outsider_cannot_see(owner, viewer, outsider, client_for, ready_version):
    assert submit(client_for(viewer), job_body(ready_version.pk)).status_code == 403
    job_id = submit(client_for(owner), job_body(ready_version.pk)).json()["id"]
    assert client_for(outsider).get(f"/api/v1/jobs/{job_id}/").status_code == 404
    assert client_for(outsider).post(f"/api/v1/jobs/{job_id}/stop/").status_code == 404
    assert client_for(viewer).post(f"/api/v1/jobs/{job_id}/stop/").status_code == 403
    assert client_for(viewer).get(f"/api/v1/jobs/{job_id}/").status_code == 200


def test_stopping_a_pending_job_stops_it_at_once(owner, client_for, ready_version):
    client = client_for(owner)
    job_id = submit(client, job_body(ready_version.pk)).json()["id"]
    TrainingJob.objects.filter(pk=job_id).update(waiting_reason="no node of type cpu is free (2 busy)")
    response = client.post(f"/api/v1/jobs/{job_id}/stop/")
    assert response.status_code == 202
    assert response.json()["status"] == "Stopped"
    assert response.json()["waiting_reason"] == "", "a stopped job waits for nothing"
    assert [e["status"] for e in response.json()["timeline"]] == ["Pending", "Stopped"]
    again = client.post(f"/api/v1/jobs/{job_id}/stop/")
    assert again.status_code == 409


def test_stopping_a_training_job_asks_its_agent(owner, client_for, ready_version):
    client = client_for(owner)
    job_id = submit(client, job_body(ready_version.pk)).json()["id"]
    TrainingJob.objects.filter(pk=job_id).update(status=JobStatus.TRAINING)
    assert client.post(f"/api/v1/jobs/{job_id}/stop/").json()["status"] == "Stopping"
    assert client.post(f"/api/v1/jobs/{job_id}/stop/").status_code == 202  # asking twice is harmless


def test_list_filters(owner, client_for, ready_version):
    client = client_for(owner)
    submit(client, job_body(ready_version.pk, name="alpha", tags=["a"]))
    submit(client, job_body(ready_version.pk, name="beta", tags=["b"]))
    names = lambda q: sorted(j["name"] for j in client.get(f"/api/v1/jobs/?{q}").json()["results"])  # noqa: E731
    assert names("project=acme") == ["alpha", "beta"]
    assert names("tag=a") == ["alpha"]
    assert names("search=bet") == ["beta"]
    assert names("status=Pending") == ["alpha", "beta"]
    assert names("algorithm=image-classifier") == []
    assert names(f"dataset={ready_version.dataset_id}") == ["alpha", "beta"]
    assert names("status=Pending,Completed") == ["alpha", "beta"]


@pytest.mark.parametrize("query", ["status=Nope", "status=pending", "status=Pending,", "status=Pending,Runing"])
def test_an_unknown_status_filter_is_a_400_naming_status(owner, client_for, query):
    response = client_for(owner).get(f"/api/v1/jobs/?{query}")
    assert response.status_code == 400
    assert "status" in response.json()["error"]["fields"]


def test_algorithms_endpoint_lists_schemas(owner, client_for):
    body = client_for(owner).get("/api/v1/algorithms/").json()
    names = {a["name"] for a in body["results"]}
    assert {"tabular-classifier", "image-classifier", "text-classifier", "char-lm"} <= names
    tabular = next(a for a in body["results"] if a["name"] == "tabular-classifier")
    assert any(h["name"] == "epochs" and h["type"] == "integer" for h in tabular["hyperparameters"])


# --- scripts ----------------------------------------------------------------------------------
def upload_script(client, name: str, content: bytes):
    return client.post("/api/v1/scripts/", {"project": "acme", "file": SimpleUploadedFile(name, content)}, format="multipart")


def test_script_upload_and_submit(owner, client_for, ready_version):
    client = client_for(owner)
    response = upload_script(client, "train.py", b"print('loss=0.5')\n")
    assert response.status_code == 201, response.content
    script = response.json()
    assert script["entry_point"] == "train.py"
    body = {"project": "acme", "name": "scripted", "script": {"uri": script["uri"], "entry_point": "train.py"},
            "inputs": {"train": ready_version.pk}, "metric_definitions": [{"name": "loss", "regex": r"loss=([0-9.]+)"}]}
    created = submit(client, body)
    assert created.status_code == 201, created.content
    assert created.json()["script"]["uri"] == script["uri"]


def test_bad_scripts_are_refused(owner, client_for):
    client = client_for(owner)
    assert "line 1" in upload_script(client, "bad.py", b"def (:\n").json()["error"]["message"]
    assert "empty" in upload_script(client, "empty.py", b"").json()["error"]["message"]
    assert ".py file or a .tar.gz" in upload_script(client, "notes.txt", b"hi").json()["error"]["message"]
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w:gz") as archive:
        info = tarfile.TarInfo("../../etc/cron.d/x")
        info.size = 1
        archive.addfile(info, io.BytesIO(b"x"))
    assert "outside its folder" in upload_script(client, "src.tar.gz", evil.getvalue()).json()["error"]["message"]


def test_script_uri_from_elsewhere_is_refused(owner, client_for, ready_version):
    body = {"project": "acme", "name": "x", "script": {"uri": "file:///etc/passwd", "entry_point": "x.py"},
            "inputs": {"train": ready_version.pk}}
    response = submit(client_for(owner), body)
    assert response.status_code == 400
    assert "script.uri" in response.json()["error"]["fields"]


def test_a_new_job_starts_without_stale_live_events(owner, client_for, ready_version):
    """A reset database reuses job ids while Redis may keep old streams: they must not be
    replayed as the new job's."""
    from studio.redis_conn import redis_client
    from trainyard.protocol import EVENTS_STREAM, key

    first = (TrainingJob.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1
    candidates = range(first, first + 500)  # a PostgreSQL sequence may have moved past max(id)
    pipe = redis_client().pipeline()
    for job_id in candidates:
        pipe.xadd(key(EVENTS_STREAM, job_id), {"status": "Completed", "at": "2020-01-01T00:00:00Z", "message": "old"})
    pipe.execute()
    try:
        job_id = submit(client_for(owner), job_body(ready_version.pk)).json()["id"]
        assert job_id in candidates
        assert redis_client().xlen(key(EVENTS_STREAM, job_id)) == 0
    finally:
        redis_client().delete(*(key(EVENTS_STREAM, i) for i in candidates))


def test_more_processes_than_gpus_on_a_gpu_node_type_is_refused(owner, client_for, ready_version):
    Node.objects.create(name="g1", hostname="h", queue="node.g1", instance_type="gpu", cpus=32, gpus=2)
    response = submit(client_for(owner), job_body(ready_version.pk, resources={"instance_type": "gpu",
                                                                               "processes_per_node": 4}))
    assert response.status_code == 400, response.content
    assert "NCCL runs one process per GPU; use at most 2" in response.json()["error"]["fields"][
        "resources.processes_per_node"][0]
    defaulted = submit(client_for(owner), job_body(ready_version.pk, resources={"instance_type": "gpu"}))
    assert defaulted.status_code == 201, defaulted.content
    assert defaulted.json()["resources"]["processes_per_node"] == 2, "one process per GPU by default"
