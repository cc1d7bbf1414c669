"""Batch predictions over a dataset version: JSONL in the object store, counts, human
loops through the flow, a clear failure on mismatched columns, the stalled-run requeue,
and the real Celery task on the control queue."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from datasets.actions import VersionOptions, register_local_files
from datasets.storage import store_for
from datasets.validation_run import run_validation
from hosting import actions
from hosting.batch import run_batch_prediction
from hosting.models import BatchPrediction, BatchStatus
from review.models import HumanLoop
from tests.conftest import wait_for
from tests.hosting.conftest import HELD_ROWS, make_flow


@pytest.fixture
def model_version(owner, demo_job):
    return actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)


def read_lines(uri: str) -> list[dict]:
    with store_for(uri).open_read(uri) as stream:
        return [json.loads(line) for line in stream.read().decode().splitlines()]


def test_batch_writes_jsonl_counts_records_and_starts_loops(owner, client_for, project, model_version, demo_version):
    flow = make_flow(project, owner, confidence_below=0.8, sample_percent=0)
    response = client_for(owner).post("/api/v1/batch-predictions/", {
        "project": "acme", "model": "biomes", "dataset_version": demo_version.pk, "flow_definition": flow.pk},
        format="json")
    assert response.status_code == 202, response.content
    batch_id = response.json()["id"]
    assert response.json()["status"] == "Pending"
    assert run_batch_prediction(batch_id) == BatchStatus.COMPLETED
    batch = BatchPrediction.objects.get(pk=batch_id)
    assert batch.records_done == batch.records_total == HELD_ROWS
    lines = read_lines(batch.output_uri)
    assert [line["record"] for line in lines] == list(range(HELD_ROWS))
    assert {"label", "confidence", "probabilities", "input"} <= set(lines[0])
    assert "label" not in lines[0]["input"]  # the features the model read, not the answer
    unsure = [line["record"] for line in lines if line["confidence"] < 0.8]
    loops = HumanLoop.objects.filter(flow_definition=flow)
    assert batch.human_loops_started == len(unsure) == loops.count() > 0
    assert all(loop.source["batch"] == batch_id for loop in loops)
    assert sorted(loop.source["record"] for loop in loops) == unsure  # the dataset's record numbers
    by_record = {line["record"]: line for line in lines}
    assert all(loop.confidence == pytest.approx(by_record[loop.source["record"]]["confidence"]) for loop in loops)
    detail = client_for(owner).get(f"/api/v1/batch-predictions/{batch_id}/").json()
    assert detail["status"] == "Completed" and detail["records_done"] == HELD_ROWS
    assert run_batch_prediction(batch_id) == "skipped"  # a duplicate delivery does nothing


def test_mismatched_columns_fail_with_a_reason_naming_the_missing_feature(owner, project, model_version, tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("feature_01,feature_02,region\n" + "".join(f"{i},{i},north\n" for i in range(20)))
    version, _ = register_local_files(project=project, name="other", description="", user=owner,
                                      files={"other.csv": path}, options=VersionOptions(format="csv"))
    assert run_validation(version.pk) == "ready"
    batch = actions.submit_batch_prediction(project=project, model_version=model_version, dataset_version=version.pk,
                                            user=owner)
    assert run_batch_prediction(batch.pk) == BatchStatus.FAILED
    batch.refresh_from_db()
    assert batch.failure_reason.startswith("the dataset's columns do not match the model's features: missing "
                                           "feature_03, feature_04")


def test_bad_batch_requests_are_400(owner, client_for, project, model_version, demo_version):
    client = client_for(owner)
    response = client.post("/api/v1/batch-predictions/", {"project": "acme", "model": "biomes",
                                                          "dataset_version": 999999}, format="json")
    assert response.status_code == 400 and "dataset_version" in response.json()["error"]["fields"]
    response = client.post("/api/v1/batch-predictions/", {"project": "acme", "model": "biomes"}, format="json")
    assert response.status_code == 400 and "dataset_version" in response.json()["error"]["fields"]


def test_a_stalled_run_is_requeued_and_resumes_loops_after_records_done(owner, project, model_version, demo_version):
    flow = make_flow(project, owner, confidence_below=0.8, sample_percent=0)
    batch = actions.submit_batch_prediction(project=project, model_version=model_version, dataset_version=demo_version,
                                            flow_definition=flow, user=owner)
    assert run_batch_prediction(batch.pk) == BatchStatus.COMPLETED
    first_loops = HumanLoop.objects.filter(flow_definition=flow).count()
    # As if a worker died after the first 512 records: Running, an old heartbeat.
    BatchPrediction.objects.filter(pk=batch.pk).update(status=BatchStatus.RUNNING, records_done=512,
                                                       heartbeat_at=timezone.now() - timedelta(minutes=10))
    HumanLoop.objects.filter(flow_definition=flow, source__record__gte=512).delete()
    kept = HumanLoop.objects.filter(flow_definition=flow).count()
    from studio.celery import app

    app.conf.task_always_eager = True  # run the re-enqueued task here
    try:
        assert actions.requeue_stalled_batches() == [batch.pk]
    finally:
        app.conf.task_always_eager = False
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED and batch.records_done == HELD_ROWS
    records = sorted(HumanLoop.objects.filter(flow_definition=flow).values_list("source__record", flat=True))
    assert len(records) == first_loops and len(set(records)) == len(records)  # none lost, none twice
    assert kept < first_loops  # the rerun did start the loops of records 512 on


@pytest.mark.slow
def test_batch_runs_on_a_real_control_worker(owner, client_for, project, celery_worker, demo_job, demo_version):
    actions.register_model(project=project, name="biomes", job=demo_job, user=owner)
    response = client_for(owner).post("/api/v1/batch-predictions/", {
        "project": "acme", "model": "biomes", "dataset_version": demo_version.pk}, format="json")
    batch_id = response.json()["id"]
    wait_for(lambda: BatchPrediction.objects.get(pk=batch_id).status in (BatchStatus.COMPLETED, BatchStatus.FAILED),
             timeout=90, message="the batch to finish")
    batch = BatchPrediction.objects.get(pk=batch_id)
    assert batch.status == BatchStatus.COMPLETED, (batch.failure_reason, celery_worker.log_path.read_text()[-3000:])
    assert len(read_lines(batch.output_uri)) == HELD_ROWS


def test_a_pending_batch_whose_message_was_lost_is_sent_again(owner, project, model_version, demo_version):
    batch = actions.submit_batch_prediction(project=project, model_version=model_version, dataset_version=demo_version,
                                            user=owner)  # on_commit never runs in this test: the message is "lost"
    assert actions.requeue_stalled_batches() == []  # too young to call lost
    BatchPrediction.objects.filter(pk=batch.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    from studio.celery import app

    app.conf.task_always_eager = True
    try:
        assert actions.requeue_stalled_batches() == [batch.pk]
    finally:
        app.conf.task_always_eager = False
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED and batch.records_done == HELD_ROWS
    assert actions.requeue_stalled_batches() == []
