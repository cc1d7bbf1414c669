"""TrainingJob.as_submission(): the job in the API's submission shape. Submitting it again
makes a job whose stored settings equal the first's."""

from __future__ import annotations

import pytest

from jobs.models import TrainingJob
from tests.factories import make_version
from tests.jobs.conftest import upload_script

# What two submissions of the same settings may differ in: the name, ids, times, and the
# output location named after the job's id.
NOT_COMPARED = {"id", "name", "created_at", "output_uri"}


@pytest.fixture
def versions(project, owner, tmp_path):
    table = "a,b,label\n" + "".join(f"{i},{i % 7},{'xy'[i % 2]}\n" for i in range(40))
    return [make_version(project, tmp_path, {f"{name}.csv": table}, name=name, user=owner) for name in ("train", "validation")]


def stored(job: TrainingJob) -> dict:
    fields = {f.attname: getattr(job, f.attname) for f in TrainingJob._meta.concrete_fields if f.attname not in NOT_COMPARED}
    fields["inputs"] = sorted(job.inputs.values_list("channel", "dataset_version_id", "mode"))
    return fields


def submit(client, body: dict) -> TrainingJob:
    response = client.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    return TrainingJob.objects.get(pk=response.json()["id"])


def algorithm_body(versions) -> dict:
    train, validation = versions
    return {
        "project": "acme", "name": "first", "algorithm": "tabular-classifier",
        "hyperparameters": {"epochs": 2},
        "inputs": {"train": {"dataset_version": train.pk}, "validation": {"dataset_version": validation.pk, "mode": "stream"}},
        "resources": {"instance_type": "cpu", "instance_count": 1, "memory_limit_mb": 512},
        "priority": 7, "stopping": {"max_runtime_seconds": 600}, "checkpoint": {"every_steps": 5},
        "keep_alive_seconds": 30, "retries": 2, "environment": {"MY_FLAG": "1"}, "tags": ["baseline", "tuning:4"],
    }


def script_body(versions) -> dict:
    train, _ = versions
    return {
        "project": "acme", "name": "scripted", "script": {"uri": upload_script("quick.py"), "entry_point": "quick.py"},
        "hyperparameters": {"lr": 0.1, "note": "x"}, "inputs": {"train": train.pk},
        "metric_definitions": [{"name": "loss", "regex": "loss=([0-9.]+)"}],
        "checkpoint": {"uri": "s3://bucket/checkpoints/run-1/", "every_steps": 0},
    }


@pytest.mark.parametrize("body", [algorithm_body, script_body], ids=["algorithm", "script"])
def test_a_submitted_jobs_submission_makes_the_same_job_again(owner, client_for, versions, body):
    client = client_for(owner)
    given = body(versions)
    first = submit(client, given)
    submission = TrainingJob.objects.get(pk=first.pk).as_submission()
    assert submission["project"] == "acme" and submission["name"] == first.name
    second = submit(client, {**submission, "name": f"{first.name}-again"})
    assert second.pk != first.pk and second.name == f"{first.name}-again"
    expected = stored(first)
    if "resources" not in given:
        # The API fills the defaults of a resources object it is given, not of an absent
        # one: the second job stores them spelled out.
        expected["resources"] = {"instance_count": 1, "memory_limit_mb": None, **expected["resources"]}
    assert stored(second) == expected
