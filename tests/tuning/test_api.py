"""Creating, reading and stopping tuning jobs through the API: every bad input is a 400
naming the field and creates nothing; roles as for training jobs."""

from __future__ import annotations

import pytest

from jobs.models import JobStatus, TrainingJob
from tests.factories import make_version
from tests.tuning.conftest import body, create, finish_trial, trials_of
from tuning.engine import advance
from tuning.models import TuningJob, TuningStatus


@pytest.fixture
def ready_version(project, owner, tmp_path):
    table = "a,b,label\n" + "".join(f"{i},{i % 7},{'xy'[i % 2]}\n" for i in range(60))
    return make_version(project, tmp_path, {"train.csv": table}, name="tiny", user=owner)


def tabular_body(version_id: int, **overrides) -> dict:
    return {"project": "acme", "name": "tab", "strategy": "bayesian", "max_trials": 6, "max_parallel": 2,
            "base_job": {"algorithm": "tabular-classifier", "hyperparameters": {"epochs": 2},
                         "inputs": {"train": {"dataset_version": version_id}}},
            "parameter_ranges": {"learning_rate": {"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"},
                                 "layers": {"type": "integer", "min": 1, "max": 4},
                                 "batch_size": {"type": "categorical", "values": [16, 32]}},
            "objective": {"metric": "validation_accuracy", "goal": "maximize"}, **overrides}


def _dotted(fields: dict, prefix: str = ""):
    for key, value in fields.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{key}.")


def test_create_answers_201_with_the_search_and_ticks_on_commit(owner, client_for, quadratic,
                                                                django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        response = client_for(owner).post("/api/v1/tuning-jobs/", body(quadratic, early_stopping="median"), format="json")
    assert response.status_code == 201, response.content
    tuning = response.json()
    assert tuning["status"] == "InProgress"
    assert tuning["strategy"] == "random" and tuning["early_stopping"] == "median" and tuning["seed"] == 7
    assert tuning["objective"] == {"metric": "loss", "goal": "minimize"}
    assert tuning["parameter_ranges"]["x"] == {"type": "continuous", "min": -2.0, "max": 3.0, "scale": "linear"}
    assert "project" not in tuning["base_job"] and tuning["base_job"]["hyperparameters"] == {"steps": 3}
    assert tuning["trials"] == [] and tuning["best_trial"] is None
    assert tuning["trial_counts"]["total"] == 0
    assert len(callbacks) == 1  # an engine tick is sent on commit
    assert not TrainingJob.objects.exists()  # trials come from the engine


def test_built_in_defaults_the_objective_and_checks_the_base_job_with_range_values(owner, client_for,
                                                                                  ready_version):
    payload = tabular_body(ready_version.pk)
    del payload["objective"]
    tuning = create(client_for(owner), payload)
    assert tuning.objective == {"metric": "validation_accuracy", "goal": "maximize"}
    assert tuning.early_stopping == "off"
    advance(tuning.pk)
    trials = trials_of(tuning)
    assert len(trials) == 2  # max_parallel
    for trial in trials:
        assert set(trial.trial_params) == {"learning_rate", "layers", "batch_size"}
        assert trial.hyperparameters["epochs"] == 2
        assert trial.hyperparameters["learning_rate"] == trial.trial_params["learning_rate"]
        assert 1e-4 <= trial.trial_params["learning_rate"] <= 0.1
        assert trial.tags == [f"tuning:{tuning.pk}"]
        assert trial.inputs.get().dataset_version_id == ready_version.pk
    assert [t.name for t in trials] == ["tab-001", "tab-002"]


GOOD_X = {"type": "continuous", "min": -2, "max": 3}


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        ({"parameter_ranges": {}}, "parameter_ranges", "at least one"),
        ({"parameter_ranges": {"x": {"type": "continuous", "min": 3, "max": 1}}}, "parameter_ranges.x.min",
         "min (3) is greater than max (1)"),
        ({"parameter_ranges": {"x": {"type": "continuous", "min": 0, "max": 1, "scale": "log"}}},
         "parameter_ranges.x.min", "log scale needs min > 0"),
        ({"parameter_ranges": {"x": {"type": "integer", "min": -1, "max": 4, "scale": "log"}}},
         "parameter_ranges.x.min", "log scale needs min > 0"),
        ({"parameter_ranges": {"x": {"type": "categorical", "values": []}}}, "parameter_ranges.x.values", "non-empty"),
        ({"parameter_ranges": {"x": {"type": "categorical"}}}, "parameter_ranges.x.values", "non-empty"),
        ({"parameter_ranges": {"x": {"type": "gaussian", "min": 0, "max": 1}}}, "parameter_ranges.x.type",
         "Unknown range type"),
        ({"parameter_ranges": {"x": {"type": "integer", "min": 0.5, "max": 4}}}, "parameter_ranges.x.min", "integer"),
        ({"parameter_ranges": {"x": {**GOOD_X, "values": [1]}}}, "parameter_ranges.x.values", "takes"),
        ({"max_parallel": 5, "max_trials": 4}, "max_parallel", "more than max_trials"),
        ({"strategy": "grid", "max_trials": 5,
          "parameter_ranges": {"x": {"type": "integer", "min": 1, "max": 3},
                               "y": {"type": "categorical", "values": [-2, -1]}}}, "max_trials",
         "The grid has 6 points (3 × 2)"),
        ({"strategy": "grid", "parameter_ranges": {"x": GOOD_X}}, "parameter_ranges.x.type", "discrete"),
        ({"strategy": "hyperband", "early_stopping": "median"}, "early_stopping", "Hyperband"),
        ({"objective": None}, "objective", "needs an objective"),
        ({"objective": {"metric": "loss", "goal": "lowest"}}, "objective.goal", ""),
        ({"warm_start_from": [999999]}, "warm_start_from", "No tuning job 999999"),
        ({"max_trials": 0}, "max_trials", ""),
        ({"name": "x" * 191}, "name", "190"),
        ({"target_value": "high"}, "target_value", ""),
    ],
    ids=lambda v: v if isinstance(v, str) and v and " " not in v else None,
)
def test_bad_searches_are_field_errors(owner, client_for, quadratic, overrides, field, text):
    response = client_for(owner).post("/api/v1/tuning-jobs/", body(quadratic, **overrides), format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in list(_dotted(error["fields"])), error
    assert text in str(error), error
    assert not TuningJob.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "field", "text"),
    [
        ({"parameter_ranges": {"made_up": {"type": "integer", "min": 1, "max": 2}}}, "parameter_ranges.made_up",
         "unknown hyperparameter for tabular-classifier"),
        ({"parameter_ranges": {"learning_rate": {"type": "continuous", "min": 0.01, "max": 2.0}}},
         "parameter_ranges.learning_rate.max", "≤ 1"),
        ({"parameter_ranges": {"epochs": {"type": "continuous", "min": 1, "max": 5}}}, "parameter_ranges.epochs.type",
         "integer range"),
        ({"parameter_ranges": {"batch_size": {"type": "categorical", "values": [16, "big"]}}},
         "parameter_ranges.batch_size.values", "expected an integer, got 'big'"),
        ({"objective": {"metric": "validation:accuracy", "goal": "maximize"}}, "objective.metric",
         "does not emit a metric 'validation:accuracy'; did you mean 'validation_accuracy'?"),
        ({"objective": {"metric": "f1", "goal": "maximize"}}, "objective.metric", "it emits train_loss"),
        ({"base_job": {"algorithm": "tabular-classifier", "hyperparameters": {"epochs": "many"}, "inputs": {}}},
         "base_job.hyperparameters.epochs", "integer"),
        ({"base_job": {"algorithm": "tabular-classifier", "inputs": {"train": {"dataset_version": 999999}}}},
         "base_job.inputs.train", "No dataset version 999999"),
        ({"base_job": {"algorithm": "tabular-classifier", "distribution": "fsdp", "inputs": {}}},
         "base_job.distribution", "does not support"),
        ({"base_job": {"hyperparameters": {"epochs": 2}}}, "base_job.algorithm", "either an algorithm"),
    ],
)
def test_bad_built_in_searches_are_field_errors(owner, client_for, ready_version, overrides, field, text):
    payload = tabular_body(ready_version.pk, **overrides)
    if "inputs" in payload["base_job"] and not payload["base_job"]["inputs"]:
        payload["base_job"]["inputs"] = {"train": {"dataset_version": ready_version.pk}}
    response = client_for(owner).post("/api/v1/tuning-jobs/", payload, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert field in list(_dotted(error["fields"])), error
    assert text in str(error), error
    assert not TuningJob.objects.exists() and not TrainingJob.objects.exists()


def test_roles_like_training_jobs(owner, teammate, viewer, outsider, client_for, quadratic):
    assert client_for(viewer).post("/api/v1/tuning-jobs/", body(quadratic), format="json").status_code == 403
    refused = client_for(outsider).post("/api/v1/tuning-jobs/", body(quadratic), format="json")
    assert refused.status_code == 400 and "project" in refused.json()["error"]["fields"]  # as POST /api/v1/jobs/
    tuning = create(client_for(teammate), body(quadratic))
    assert client_for(viewer).get(f"/api/v1/tuning-jobs/{tuning.pk}/").status_code == 200
    assert client_for(viewer).post(f"/api/v1/tuning-jobs/{tuning.pk}/stop/").status_code == 403
    assert client_for(outsider).get(f"/api/v1/tuning-jobs/{tuning.pk}/").status_code == 404
    assert client_for(outsider).post(f"/api/v1/tuning-jobs/{tuning.pk}/stop/").status_code == 404
    assert client_for(outsider).get("/api/v1/tuning-jobs/").json()["count"] == 0
    assert client_for(outsider).get("/api/v1/tuning-jobs/?project=acme").status_code == 404


def test_detail_lists_trials_counts_and_the_best_trial(owner, client_for, quadratic):
    client = client_for(owner)
    tuning = create(client, body(quadratic, max_parallel=3, max_trials=4))
    advance(tuning.pk)
    first, second, third = trials_of(tuning)
    finish_trial(first, loss=2.0)
    finish_trial(second, loss=0.5)
    finish_trial(third, status=JobStatus.FAILED, failure_reason="boom")
    advance(tuning.pk)
    detail = client.get(f"/api/v1/tuning-jobs/{tuning.pk}/").json()
    assert [t["trial_number"] for t in detail["trials"]] == [1, 2, 3, 4]
    assert detail["trials"][0]["objective_value"] == 2.0 and detail["trials"][2]["failure_reason"] == "boom"
    assert set(detail["trials"][1]["trial_params"]) == {"x", "y"}
    assert detail["best_trial"] == {"id": second.pk, "name": second.name, "trial_number": 2, "objective_value": 0.5,
                                    "trial_params": second.trial_params}
    assert detail["best_value"] == 0.5
    assert detail["trial_counts"] == {"total": 4, "pending": 1, "running": 0, "completed": 2, "stopped": 0,
                                      "early_stopped": 0, "rule_stopped": 0, "failed": 1}
    assert detail["elapsed_seconds"] >= 0
    trial = client.get(f"/api/v1/jobs/{second.pk}/").json()
    assert (trial["tuning_job"], trial["trial_number"], trial["objective_value"]) == (tuning.pk, 2, 0.5)
    assert trial["trial_params"] == second.trial_params


def test_list_is_paginated_filtered_and_counts_trials_in_few_queries(owner, client_for, quadratic,
                                                                     django_assert_max_num_queries):
    client = client_for(owner)
    for index in range(4):
        tuning = create(client, body(quadratic, name=f"search-{index}", max_parallel=2))
        advance(tuning.pk)
    with django_assert_max_num_queries(8):
        page = client.get("/api/v1/tuning-jobs/?project=acme&page_size=3").json()
    assert page["count"] == 4 and len(page["results"]) == 3 and page["next"]
    assert page["results"][0]["name"] == "search-3"
    assert page["results"][0]["trial_counts"]["pending"] == 2
    assert [t["name"] for t in client.get("/api/v1/tuning-jobs/?search=search-1").json()["results"]] == ["search-1"]
    assert client.get("/api/v1/tuning-jobs/?status=Completed").json()["count"] == 0
    jobs = client.get(f"/api/v1/jobs/?tag=tuning:{tuning.pk}").json()
    assert sorted(j["name"] for j in jobs["results"]) == ["search-3-001", "search-3-002"]  # trials are ordinary jobs


def test_stopping_a_search_of_pending_trials_stops_it_at_once(owner, client_for, quadratic):
    client = client_for(owner)
    tuning = create(client, body(quadratic, max_parallel=2))
    advance(tuning.pk)
    response = client.post(f"/api/v1/tuning-jobs/{tuning.pk}/stop/")
    assert response.status_code == 202, response.content
    stopped = response.json()
    assert stopped["status"] == "Stopped" and stopped["end_reason"] == "StopRequested"
    assert [(t["status"], t["stop_reason"]) for t in stopped["trials"]] == [("Stopped", "StopRequested")] * 2
    assert client.post(f"/api/v1/tuning-jobs/{tuning.pk}/stop/").status_code == 409
    advance(tuning.pk)
    assert len(trials_of(tuning)) == 2  # no trial after the stop
    assert TuningJob.objects.get(pk=tuning.pk).status == TuningStatus.STOPPED
