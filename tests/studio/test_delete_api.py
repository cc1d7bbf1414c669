"""DELETE on the detail URL of jobs, tuning jobs, models, model versions, endpoints, flows
and work teams (docs/SPEC.md §6): 204 deleted, 200 with the object when archived, 409
with the error envelope naming what blocks it; the store objects go in the background
(studio.deletion.run_deletion, called here as the task calls it)."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from datasets.actions import VersionOptions, register_local_files
from datasets.storage import default_store, object_uri
from hosting.models import BatchPrediction, BatchStatus, Endpoint, Model, ModelVersion
from jobs.models import JobEvent, JobStatus, MetricChunk, MetricPoint, SystemMetric, TrainingJob
from review.models import Assignment, AssignmentStatus, FlowDefinition, HumanLoop, WorkTeam
from studio.deletion import run_deletion
from studio.models import PendingDeletion
from tests import factories
from tuning.models import TuningJob, TuningStatus


def put(uri: str, body: bytes = b"x") -> str:
    with default_store().open_write(uri) as out:
        out.write(body)
    return uri


def exists(uri: str) -> bool:
    return default_store().exists(uri)


def finish_pending_deletions() -> None:
    for pending_id in PendingDeletion.objects.values_list("pk", flat=True):
        run_deletion(pending_id)
    assert not PendingDeletion.objects.exists()


@pytest.fixture
def make_job(project, owner):
    def make(name: str = "resnet", status: str = JobStatus.COMPLETED, points: int = 3, **fields) -> TrainingJob:
        job = factories.make_job(project, name=name, status=status, algorithm="tabular-classifier", created_by=owner,
                                 **fields)
        job.output_uri = object_uri(f"jobs/{job.pk}-{uuid.uuid4().hex[:8]}")  # ids repeat across rolled-back tests
        job.model_uri = put(f"{job.output_uri}/model.tar.gz")
        job.save(update_fields=["output_uri", "model_uri"])
        put(f"{job.output_uri}/output.tar.gz")
        put(f"{job.output_uri}/logs/node-0.log")
        put(f"{job.output_uri}/checkpoints/step-1.pt")
        put(f"{job.output_uri}/checkpoints/step-2.pt")
        now = timezone.now()
        MetricPoint.objects.bulk_create([MetricPoint(job=job, name="loss", step=s, value=1.0 / (s + 1), time=now)
                                         for s in range(points)])
        MetricChunk.objects.create(job=job, name="loss", chunk=0, count=points, first_step=0, first_value=1,
                                   last_step=points - 1, last_value=0.5)
        SystemMetric.objects.create(job=job, node_name="n", time=now, cpu_percent=1, memory_bytes=1)
        JobEvent.objects.create(job=job, status=JobStatus.PENDING, message="Submitted")
        return job

    return make


def register(job: TrainingJob, name: str = "demo") -> ModelVersion:
    model, _ = Model.objects.get_or_create(project=job.project, name=name)
    number = model.versions.count() + 1
    return ModelVersion.objects.create(model=model, version=number, job=job, artifact_uri=job.model_uri,
                                       algorithm=job.algorithm, kind="tabular")


# --- jobs ----------------------------------------------------------------------------------------
def test_delete_finished_job_removes_rows_then_its_files(client_for, owner, make_job):
    job = make_job(points=5)
    prefix = job.output_uri

    response = client_for(owner).delete(f"/api/v1/jobs/{job.pk}/")

    assert response.status_code == 204
    assert not TrainingJob.objects.filter(pk=job.pk).exists()
    assert not MetricPoint.objects.filter(job_id=job.pk).exists()
    assert not MetricChunk.objects.filter(job_id=job.pk).exists()
    assert not SystemMetric.objects.filter(job_id=job.pk).exists()
    pending = PendingDeletion.objects.get()
    assert pending.uris == [prefix]
    assert exists(f"{prefix}/model.tar.gz")  # the store part runs in the background
    finish_pending_deletions()
    assert not exists(f"{prefix}/model.tar.gz") and not exists(f"{prefix}/checkpoints/step-1.pt")
    assert client_for(owner).get(f"/api/v1/jobs/{job.pk}/").status_code == 404


def test_running_job_must_be_stopped_first(client_for, owner, make_job):
    job = make_job(name="still-going", status=JobStatus.TRAINING)

    response = client_for(owner).delete(f"/api/v1/jobs/{job.pk}/")

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "in_use"
    assert "still-going" in error["message"] and "stop it first" in error["message"]
    assert f"/jobs/{job.pk}/" in error["message"]
    assert TrainingJob.objects.filter(pk=job.pk).exists() and not PendingDeletion.objects.exists()


def test_job_a_model_came_from_is_archived_and_hidden_from_the_list(client_for, owner, make_job):
    job = make_job(name="source-of-demo")
    register(job)
    other = make_job(name="plain")
    api = client_for(owner)

    response = api.delete(f"/api/v1/jobs/{job.pk}/")

    assert response.status_code == 200
    assert response.json()["id"] == job.pk and response.json()["archived_at"]
    job.refresh_from_db()
    assert job.archived_at is not None
    assert exists(job.model_uri) and MetricPoint.objects.filter(job=job).count() == 3
    assert not PendingDeletion.objects.exists()
    listed = [row["id"] for row in api.get("/api/v1/jobs/").json()["results"]]
    assert listed == [other.pk]
    with_archived = [row["id"] for row in api.get("/api/v1/jobs/?archived=true").json()["results"]]
    assert sorted(with_archived) == sorted([job.pk, other.pk])
    assert api.get("/api/v1/jobs/?archived=maybe").status_code == 400


def test_trial_of_a_tuning_job_names_the_tuning_job(client_for, owner, project, make_job):
    tuning = TuningJob.objects.create(project=project, name="sweep", status=TuningStatus.COMPLETED, base_job={},
                                      parameter_ranges={}, objective={"metric": "loss", "goal": "minimize"},
                                      strategy="random", max_trials=1, max_parallel=1)
    trial = make_job(name="sweep-1", tuning_job=tuning, trial_number=1)

    response = client_for(owner).delete(f"/api/v1/jobs/{trial.pk}/")

    assert response.status_code == 409
    assert "sweep" in response.json()["error"]["message"] and f"/tuning/{tuning.pk}/" in response.json()["error"]["message"]


def test_viewer_cannot_delete_and_outsider_sees_nothing(client_for, viewer, outsider, make_job):
    job = make_job()
    assert client_for(viewer).delete(f"/api/v1/jobs/{job.pk}/").status_code == 403
    assert client_for(outsider).delete(f"/api/v1/jobs/{job.pk}/").status_code == 404
    assert TrainingJob.objects.filter(pk=job.pk).exists()


# --- tuning jobs ---------------------------------------------------------------------------------
@pytest.fixture
def make_tuning(project, owner, make_job):
    def make(status: str = TuningStatus.COMPLETED, trials: int = 2) -> TuningJob:
        tuning = TuningJob.objects.create(project=project, name="sweep", status=status, base_job={}, parameter_ranges={},
                                          objective={"metric": "loss", "goal": "minimize"}, strategy="random",
                                          max_trials=trials, max_parallel=1, created_by=owner)
        for number in range(1, trials + 1):
            make_job(name=f"sweep-{number}", tuning_job=tuning, trial_number=number)
        return tuning

    return make


def test_delete_tuning_job_takes_its_trials_and_their_files(client_for, owner, make_tuning):
    tuning = make_tuning()
    trials = list(TrainingJob.objects.filter(tuning_job=tuning))

    response = client_for(owner).delete(f"/api/v1/tuning-jobs/{tuning.pk}/")

    assert response.status_code == 204
    assert not TuningJob.objects.filter(pk=tuning.pk).exists()
    assert not TrainingJob.objects.filter(pk__in=[t.pk for t in trials]).exists()
    finish_pending_deletions()
    assert not any(exists(t.model_uri) for t in trials)


def test_tuning_job_in_progress_must_be_stopped_first(client_for, owner, make_tuning):
    tuning = make_tuning(status=TuningStatus.IN_PROGRESS)
    response = client_for(owner).delete(f"/api/v1/tuning-jobs/{tuning.pk}/")
    assert response.status_code == 409
    assert "stop it first" in response.json()["error"]["message"]
    assert TrainingJob.objects.filter(tuning_job=tuning).count() == 2


def test_tuning_job_whose_trial_became_a_model_is_archived(client_for, owner, make_tuning):
    tuning = make_tuning()
    register(TrainingJob.objects.filter(tuning_job=tuning).first())
    api = client_for(owner)

    response = api.delete(f"/api/v1/tuning-jobs/{tuning.pk}/")

    assert response.status_code == 200 and response.json()["archived_at"]
    assert TrainingJob.objects.filter(tuning_job=tuning, archived_at__isnull=False).count() == 2
    assert api.get("/api/v1/tuning-jobs/").json()["count"] == 0
    assert api.get("/api/v1/tuning-jobs/?archived=true").json()["count"] == 1


# --- models, versions, endpoints ---------------------------------------------------------------
def test_model_version_served_by_an_endpoint_names_the_endpoint(client_for, owner, project, make_job):
    version = register(make_job())
    Endpoint.objects.create(project=project, name="prod-scorer", model_version=version)
    api = client_for(owner)

    response = api.delete(f"/api/v1/models/{version.model_id}/versions/1/")

    assert response.status_code == 409
    message = response.json()["error"]["message"]
    assert "prod-scorer" in message and "/models/endpoints/prod-scorer/" in message
    assert api.delete(f"/api/v1/models/{version.model_id}/").status_code == 409
    assert ModelVersion.objects.filter(pk=version.pk).exists()

    assert api.delete("/api/v1/endpoints/prod-scorer/").status_code == 204
    assert api.delete(f"/api/v1/models/{version.model_id}/versions/1/").status_code == 204
    assert not ModelVersion.objects.filter(pk=version.pk).exists()
    assert api.get(f"/api/v1/models/{version.model_id}/versions/1/").status_code == 404


def test_delete_model_takes_its_versions_and_finished_batch_outputs(client_for, owner, project, make_job, tmp_path):
    job = make_job()
    version = register(job)
    register(job)
    path = tmp_path / "rows.csv"
    path.write_text("a,label\n1,x\n")
    data, _ = register_local_files(project=project, name="rows", description="", user=owner, files={"rows.csv": path},
                                   options=VersionOptions())
    output = put(object_uri("batch-predictions/77/predictions.jsonl"))
    BatchPrediction.objects.create(project=project, model_version=version, dataset_version=data,
                                   status=BatchStatus.COMPLETED, output_uri=output)

    response = client_for(owner).delete(f"/api/v1/models/{version.model_id}/")

    assert response.status_code == 204
    assert not Model.objects.filter(pk=version.model_id).exists() and not BatchPrediction.objects.exists()
    finish_pending_deletions()
    assert not exists(output)
    assert exists(job.model_uri)  # the tarball is the job's, and the job is still here


# --- flows and work teams ------------------------------------------------------------------------
def _flow(project, owner, name="check") -> FlowDefinition:
    team, _ = WorkTeam.objects.get_or_create(project=project, name="labellers")
    team.members.add(owner)
    return FlowDefinition.objects.create(project=project, name=name, work_team=team, labels=["a", "b"], title="?")


def test_work_team_used_by_a_flow_names_the_flow(client_for, owner, project):
    flow = _flow(project, owner, name="biome-check")
    api = client_for(owner)

    response = api.delete(f"/api/v1/work-teams/{flow.work_team_id}/")

    assert response.status_code == 409
    assert "biome-check" in response.json()["error"]["message"]
    assert f"/review/flows/{flow.pk}/" in response.json()["error"]["message"]
    assert api.delete(f"/api/v1/flow-definitions/{flow.pk}/").status_code == 204
    assert api.delete(f"/api/v1/work-teams/{flow.work_team_id}/").status_code == 204
    assert not WorkTeam.objects.exists()


def test_flow_sent_items_by_an_endpoint_is_blocked_naming_it(client_for, owner, project, make_job):
    flow = _flow(project, owner)
    Endpoint.objects.create(project=project, name="triage", model_version=register(make_job()), flow_definition=flow)
    response = client_for(owner).delete(f"/api/v1/flow-definitions/{flow.pk}/")
    assert response.status_code == 409
    assert "triage" in response.json()["error"]["message"]


def test_delete_flow_takes_its_items_answers_and_outputs(client_for, owner, project):
    flow = _flow(project, owner)
    loop = HumanLoop.objects.create(name="loop-1", project=project, flow_definition=flow, answers_needed=1, open_slots=0,
                                    expires_at=timezone.now())
    Assignment.objects.create(loop=loop, worker=owner, status=AssignmentStatus.ANSWERED, lease_expires_at=timezone.now(),
                              answer={"label": "a"})
    output = put(object_uri(f"review/{project.slug}/flows/{flow.pk}/loops/loop-1/output.json"))

    response = client_for(owner).delete(f"/api/v1/flow-definitions/{flow.pk}/")

    assert response.status_code == 204
    assert not HumanLoop.objects.exists() and not Assignment.objects.exists()
    finish_pending_deletions()
    assert not exists(output)


# --- dataset versions (the ProtectedError that was a 500) --------------------------------------
def test_dataset_version_used_only_by_a_batch_prediction_is_409_naming_it(client_for, owner, project, make_job, tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("a,label\n1,x\n")
    data, _ = register_local_files(project=project, name="rows", description="", user=owner, files={"rows.csv": path},
                                   options=VersionOptions())
    batch = BatchPrediction.objects.create(project=project, model_version=register(make_job()), dataset_version=data,
                                           status=BatchStatus.COMPLETED)
    api = client_for(owner)

    response = api.delete(f"/api/v1/dataset-versions/{data.pk}/")
    assert response.status_code == 409
    assert f"batch prediction '{batch.pk}" in response.json()["error"]["message"]
    response = api.delete(f"/api/v1/datasets/{data.dataset_id}/")
    assert response.status_code == 409
    assert data.__class__.objects.filter(pk=data.pk).exists()
