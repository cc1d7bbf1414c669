"""A request body's key the API does not know is a 400 naming it and the nearest known name,
and nothing is written: DRF dropped such keys, so `"stopping": {"max_runtime": 60}` ran a job
with no limit and `"resources": {"memory_mb": 512}` with no memory limit (studio.api.KnownFieldsOnly)."""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import InstancePrice, TrainingJob
from studio.models import NotificationChannel
from tests.factories import make_version
from tuning.models import TuningJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def version(project, owner, tmp_path):
    table = "a,b,label\n" + "".join(f"{i},{i % 7},{'xy'[i % 2]}\n" for i in range(60))
    return make_version(project, tmp_path, {"train.csv": table}, name="tiny", user=owner)


def job_body(version, **overrides) -> dict:
    return {"project": "acme", "name": "typo", "algorithm": "tabular-classifier", "hyperparameters": {"epochs": 2},
            "inputs": {"train": {"dataset_version": version.pk}}, **overrides}


@pytest.mark.parametrize(("overrides", "path", "suggested"), [
    ({"hyperparameter": {"epochs": 3}}, "hyperparameter", "hyperparameters"),
    ({"max_runtime_seconds": 60}, "max_runtime_seconds", "stopping.max_runtime_seconds"),
    ({"instance_count": 2}, "instance_count", "resources.instance_count"),
    ({"stopping": {"max_runtime": 60}}, "stopping.max_runtime", "max_runtime_seconds"),
    ({"stopping": {"MaxRuntimeInSeconds": 60}}, "stopping.MaxRuntimeInSeconds", "max_runtime_seconds"),
    ({"resources": {"instance_count": 1, "memory_mb": 512}}, "resources.memory_mb", "memory_limit_mb"),
    ({"checkpoint": {"every_step": 5}}, "checkpoint.every_step", "every_steps"),
    ({"metric_definitions": [{"name": "loss", "regex": "loss=([0-9.]+)"}, {"name": "acc", "regexp": "a=(.*)"}]},
     "metric_definitions[1].regexp", "regex"),
])
def test_a_job_with_a_key_the_api_does_not_know_is_a_400_naming_it_and_creates_nothing(
        owner, client_for, version, overrides, path, suggested):
    response = client_for(owner).post("/api/v1/jobs/", job_body(version, **overrides), format="json")

    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["message"].startswith(f"{path}: is not a field here"), error["message"]
    assert f"did you mean {suggested}?" in error["message"], error["message"]
    assert path.split(".")[0].split("[")[0] in error["fields"]
    assert not TrainingJob.objects.exists()


def test_a_job_spec_that_names_only_known_keys_is_still_taken(owner, client_for, version):
    body = job_body(version, resources={"instance_type": "cpu", "instance_count": 1, "memory_limit_mb": 512},
                    stopping={"max_runtime_seconds": 60}, checkpoint={"every_steps": 5})
    response = client_for(owner).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.json()
    job = TrainingJob.objects.get()
    assert job.stopping == {"max_runtime_seconds": 60} and job.resources["memory_limit_mb"] == 512
    # What a clone sends (the job's own submission) names only known keys.
    again = client_for(owner).post("/api/v1/jobs/", {**job.as_submission(), "name": "again"}, format="json")
    assert again.status_code == 201, again.json()


def test_a_tuning_job_with_an_unknown_key_in_its_base_job_is_a_400(owner, client_for, version):
    body = {"project": "acme", "name": "tab", "strategy": "random", "max_trials": 2, "max_parallel": 1,
            "base_job": {"algorithm": "tabular-classifier", "hyperparameter": {"epochs": 2},
                         "inputs": {"train": {"dataset_version": version.pk}}},
            "parameter_ranges": {"layers": {"type": "integer", "min": 1, "max": 4}},
            "objective": {"metric": "validation_accuracy", "goal": "maximize"}}
    response = client_for(owner).post("/api/v1/tuning-jobs/", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["message"].startswith("base_job.hyperparameter: is not a field here")
    base_job = {key: value for key, value in body["base_job"].items() if key != "hyperparameter"}
    objective = client_for(owner).post("/api/v1/tuning-jobs/", {
        **body, "base_job": base_job, "objective": {"metric": "validation_accuracy", "direction": "maximize"}},
        format="json")
    assert objective.status_code == 400, objective.json()
    assert objective.json()["error"]["message"].startswith("objective.direction: is not a field here")
    assert not TuningJob.objects.exists()


def test_a_channel_given_email_for_emails_is_told_so(owner, client_for):
    response = client_for(owner).post("/api/v1/projects/acme/notification-channels/",
                                      {"name": "ops", "kind": "email", "email": "ops@example.com"}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["message"].startswith("email: is not a field here; did you mean emails?")
    assert not NotificationChannel.objects.exists()


def test_a_price_given_price_for_price_per_node_hour_is_told_so(owner, client_for):
    response = client_for(owner).put("/api/v1/projects/acme/instance-prices/cpu/",
                                     {"price_per_node_hour": "1.00", "price": "1.00"}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["message"].startswith("price: is not a field here; did you mean price_per_node_hour?")
    assert not InstancePrice.objects.exists()


def test_the_schema_says_these_bodies_take_no_other_keys():
    schemas = Client().get("/api/schema/", HTTP_ACCEPT="application/json").json()["components"]["schemas"]
    for name in ("JobCreateRequest", "ResourcesRequest", "StoppingRequest", "MetricDefinitionRequest",
                 "TuningJobCreateRequest", "NotificationChannelCreateRequest", "InstancePriceSetRequest"):
        assert schemas[name].get("additionalProperties") is False, name
    assert "additionalProperties" not in schemas["Job"]  # an answer may grow fields
