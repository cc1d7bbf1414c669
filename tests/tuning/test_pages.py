"""Tuning pages through Django's test client: who sees what, what the list and the detail
show for a search with trials (pruned ones included), what "Tune this" pre-fills, what the
charts' JSON holds, parameter importances, and that user text is escaped."""

from __future__ import annotations

import json
import math
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from jobs.models import JobInput, JobStatus, TrainingJob
from tests.jobs.test_pages import make_version
from tuning.analysis import chart_data, param_importances
from tuning.forms import propose_range, proposed_ranges
from tuning.models import TuningJob, TuningStatus

XSS = "<script>alert('pwned')</script>"
RANGES = {
    "learning_rate": {"type": "continuous", "min": 1e-4, "max": 0.1, "scale": "log"},
    "layers": {"type": "integer", "min": 1, "max": 4},
    "optimizer": {"type": "categorical", "values": ["adam", "sgd"]},
}


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def make_tuning_job(project, user, **overrides) -> TuningJob:
    now = timezone.now()
    fields = {
        "name": "lr-search", "status": TuningStatus.IN_PROGRESS, "strategy": "bayesian",
        "base_job": {"algorithm": "tabular-classifier", "hyperparameters": {"epochs": 3}, "inputs": {},
                     "resources": {"instance_type": "cpu"}},
        "parameter_ranges": RANGES, "objective": {"metric": "validation_accuracy", "goal": "maximize"},
        "max_trials": 10, "max_parallel": 2, "early_stopping": "median", "created_by": user,
        "started_at": now - timedelta(minutes=30), **overrides,
    }
    return TuningJob.objects.create(project=project, **fields)


def make_trial(tuning_job, number: int, params: dict, value: float | None, *, status: str = JobStatus.COMPLETED,
               stop_reason: str = "", intermediate: dict | None = None) -> TrainingJob:
    now = timezone.now()
    return TrainingJob.objects.create(
        project=tuning_job.project, name=f"{tuning_job.name}-{number}", algorithm="tabular-classifier", status=status,
        stop_reason=stop_reason, tuning_job=tuning_job, trial_number=number, trial_params=params, objective_value=value,
        intermediate_values=intermediate or {}, hyperparameters={"epochs": 3, **params},
        started_at=now - timedelta(minutes=20 - number), finished_at=None if status == JobStatus.TRAINING else now,
    )


def searched(project, user, **overrides) -> tuple[TuningJob, list[TrainingJob]]:
    """A search with four completed trials, a pruned one, a failed one and a running one."""
    job = make_tuning_job(project, user, **overrides)
    trials = [
        make_trial(job, 0, {"learning_rate": 0.001, "layers": 2, "optimizer": "adam"}, 0.81),
        make_trial(job, 1, {"learning_rate": 0.01, "layers": 3, "optimizer": "sgd"}, 0.92),
        make_trial(job, 2, {"learning_rate": 0.05, "layers": 1, "optimizer": "adam"}, 0.74),
        make_trial(job, 3, {"learning_rate": 0.02, "layers": 4, "optimizer": "sgd"}, 0.88),
        make_trial(job, 4, {"learning_rate": 0.0002, "layers": 2, "optimizer": "adam"}, None, status=JobStatus.STOPPED,
                   stop_reason="EarlyStopped", intermediate={"20": 0.41, "40": 0.52}),
        make_trial(job, 5, {"learning_rate": 0.09, "layers": 4, "optimizer": "sgd"}, None, status=JobStatus.FAILED),
        make_trial(job, 6, {"learning_rate": 0.008, "layers": 3, "optimizer": "sgd"}, None, status=JobStatus.TRAINING,
                   intermediate={"20": 0.7}),
    ]
    TuningJob.objects.filter(pk=job.pk).update(best_trial=trials[1], best_value=0.92)
    job.refresh_from_db()
    return job, trials


def live_json(body: str) -> dict:
    return json.loads(re.search(r'<script id="tuning-live" type="application/json">(.*?)</script>', body, re.S).group(1))


def form_data(body: str) -> dict:
    return json.loads(re.search(r'<script id="tuning-form-data" type="application/json">(.*?)</script>', body, re.S).group(1))


def table(body: str, table_id: str) -> str:
    match = re.search(rf'<table[^>]*id="{table_id}".*?</table>', body, re.S)
    assert match, f"no table {table_id}"
    return match.group(0)


# --- access -----------------------------------------------------------------------------------
def test_tuning_pages_require_login(owner, project):
    job = make_tuning_job(project, owner)
    for url in (reverse("tuning"), reverse("tuning-create"), reverse("tuning-detail", args=[job.pk]),
                reverse("tuning-data", args=[job.pk])):
        response = Client().get(url)
        assert response.status_code == 302 and response["Location"].startswith(reverse("login")), url


def test_reviewer_is_sent_to_the_inbox(owner, reviewer, project):
    job = make_tuning_job(project, owner)
    client = login(reviewer)
    for url in (reverse("tuning"), reverse("tuning-create"), reverse("tuning-detail", args=[job.pk])):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"] == reverse("review-inbox"), url


def test_viewer_reads_but_cannot_create_or_stop(owner, viewer, project):
    job, _ = searched(project, owner)
    client = login(viewer)
    listing = client.get(reverse("tuning")).content.decode()
    assert "lr-search" in listing and f'href="{reverse("tuning-create")}"' not in listing
    detail = client.get(reverse("tuning-detail", args=[job.pk]))
    assert detail.status_code == 200
    assert 'id="stop-tuning"' not in detail.content.decode() and "?from_job=" not in detail.content.decode()
    assert client.get(reverse("tuning-create")).status_code == 403
    assert client.get(reverse("tuning-data", args=[job.pk])).status_code == 200


def test_scientist_gets_stop_while_in_progress_only(owner, teammate, project):
    running = make_tuning_job(project, owner)
    done = make_tuning_job(project, owner, status=TuningStatus.COMPLETED, finished_at=timezone.now(),
                           end_reason="MaxTrialsReached")
    client = login(teammate)
    body = client.get(reverse("tuning-detail", args=[running.pk])).content.decode()
    assert 'id="stop-tuning"' in body and f'data-stop-url="/api/v1/tuning-jobs/{running.pk}/stop/"' in body
    assert live_json(body)["urls"]["stop"] == f"/api/v1/tuning-jobs/{running.pk}/stop/"
    finished = client.get(reverse("tuning-detail", args=[done.pk])).content.decode()
    assert 'id="stop-tuning"' not in finished
    assert "it ran its 10 trials" in finished and "MaxTrialsReached" in finished


def test_outsider_gets_404_everywhere(owner, outsider, project, tmp_path):
    job, trials = searched(project, owner, name="acme-secret")
    client = login(outsider)
    assert client.get(reverse("tuning-detail", args=[job.pk])).status_code == 404
    assert client.get(reverse("tuning-data", args=[job.pk])).status_code == 404
    assert client.get(reverse("tuning-create") + f"?from_job={trials[1].pk}").status_code == 404
    assert "acme-secret" not in client.get(reverse("tuning")).content.decode()
    assert client.get(reverse("tuning-create") + "?from_job=abc").status_code == 404


# --- list -------------------------------------------------------------------------------------
def test_list_shows_status_strategy_trials_and_best(owner, project):
    searched(project, owner)
    make_tuning_job(project, owner, name="grid-run", strategy="grid", status=TuningStatus.FAILED,
                    failure_reason="Every trial failed: label column 'y' not found", finished_at=timezone.now())
    body = login(owner).get(reverse("tuning")).content.decode()
    rows = table(body, "tuning-table")
    assert "lr-search" in rows and "grid-run" in rows
    assert 'data-status="inprogress"' in rows and 'data-status="failed"' in rows
    assert "Bayesian (TPE)" in rows and "Grid search" in rows
    assert "6/10" in rows and "1 running" in rows  # six finished trials (pruned and failed count), one training
    assert "0.92" in rows and "validation_accuracy" in rows
    assert "label column" in rows
    assert f'href="{reverse("tuning-create")}"' in body


def test_list_filters_by_status_strategy_and_name(owner, project):
    make_tuning_job(project, owner, name="alpha", strategy="random")
    make_tuning_job(project, owner, name="beta", strategy="grid", status=TuningStatus.COMPLETED)
    client = login(owner)
    assert "beta" not in table(client.get(reverse("tuning") + "?status=InProgress").content.decode(), "tuning-table")
    only_grid = table(client.get(reverse("tuning") + "?strategy=grid").content.decode(), "tuning-table")
    assert "beta" in only_grid and "alpha" not in only_grid
    assert "alpha" in table(client.get(reverse("tuning") + "?q=alp").content.decode(), "tuning-table")
    empty = client.get(reverse("tuning") + "?q=zzz").content.decode()
    assert "No tuning job matches these filters" in empty


def test_empty_list_says_how_to_start(teammate, viewer):
    body = login(teammate).get(reverse("tuning")).content.decode()
    assert "No tuning jobs yet" in body and "Tune this" in body and reverse("tuning-create") in body
    assert "a scientist or admin of the project can start one" in login(viewer).get(reverse("tuning")).content.decode()


def test_list_query_count_does_not_grow_with_jobs(owner, project, django_assert_max_num_queries):
    for index in range(3):
        searched(project, owner, name=f"search-{index}")
    client = login(owner)
    client.get(reverse("tuning"))
    with django_assert_max_num_queries(10):
        client.get(reverse("tuning"))
    for index in range(3, 8):
        searched(project, owner, name=f"search-{index}")
    with django_assert_max_num_queries(10):
        client.get(reverse("tuning"))


# --- detail -----------------------------------------------------------------------------------
def test_detail_shows_best_trial_and_every_trial(owner, project):
    job, trials = searched(project, owner)
    body = login(owner).get(reverse("tuning-detail", args=[job.pk])).content.decode()
    best = re.search(r'<section class="panel best-panel" id="best-trial".*?</section>', body, re.S).group(0)
    assert f'href="/jobs/{trials[1].pk}/"' in best and "0.92" in best and "0.01" in best and "sgd" in best
    rows = table(body, "trials-table")
    assert rows.count("<tr data-trial=") == 7
    assert ">learning_rate<" in rows and ">layers<" in rows and ">optimizer<" in rows
    assert 'data-status="pruned"' in rows and ">pruned<" in rows  # Stopped with EarlyStopped
    assert 'data-status="failed"' in rows and 'data-status="training"' in rows
    assert 'title="The last value it reported">0.52<' in rows  # the pruned trial's last intermediate value
    for trial in trials:
        assert f'href="/jobs/{trial.pk}/"' in rows
    assert "6 of 10 trials finished, 1 running" in body
    live = live_json(body)
    assert live["urls"]["data"] == reverse("tuning-data", args=[job.pk]) and live["finished"] is False
    assert len(live["charts"]["trials"]) == 7


def test_tuning_job_without_trials_says_what_happens_next(owner, project):
    job = make_tuning_job(project, owner, max_parallel=3)
    body = login(owner).get(reverse("tuning-detail", args=[job.pk])).content.decode()
    assert "The first trials start as soon as a node is free" in body
    assert "The best trial shows here once a trial reports" in body


def test_data_endpoint_gives_the_three_charts(owner, project):
    job, trials = searched(project, owner)
    payload = login(owner).get(reverse("tuning-data", args=[job.pk])).json()
    assert payload["status"] == "InProgress" and payload["finished"] is False and payload["signature"]
    charts = payload["charts"]
    by_number = {t["number"]: t for t in charts["trials"]}
    assert by_number[4]["status"] == "Pruned" and by_number[4]["value"] == 0.52 and by_number[4]["reported"] is True
    assert by_number[1]["value"] == 0.92 and by_number[1]["reported"] is False
    assert by_number[5]["value"] is None
    assert charts["best_so_far"] == [[0, 0.81], [1, 0.92], [2, 0.92], [3, 0.92]]
    dims = {d["label"]: d for d in charts["parcoords"]["dimensions"]}
    assert set(dims) == {"learning_rate (log)", "layers", "optimizer", "validation_accuracy"}
    assert dims["optimizer"]["ticktext"] == ["adam", "sgd"] and dims["optimizer"]["values"] == [0.0, 1.0, 0.0, 1.0]
    assert dims["learning_rate (log)"]["values"][0] == pytest.approx(-3.0)
    assert dims["learning_rate (log)"]["range"] == [pytest.approx(-4.0), pytest.approx(-1.0)]
    assert charts["parcoords"]["color"] == [0.81, 0.92, 0.74, 0.88]
    assert set(charts["importances"]) == set(RANGES) and sum(charts["importances"].values()) == pytest.approx(1.0)


def test_signature_changes_when_a_trial_finishes(owner, project):
    job, trials = searched(project, owner)
    client = login(owner)
    before = client.get(reverse("tuning-data", args=[job.pk])).json()["signature"]
    assert client.get(reverse("tuning-data", args=[job.pk])).json()["signature"] == before
    TrainingJob.objects.filter(pk=trials[6].pk).update(status=JobStatus.COMPLETED, objective_value=0.95)
    assert client.get(reverse("tuning-data", args=[job.pk])).json()["signature"] != before


# --- importances ----------------------------------------------------------------------------
def test_importances_find_the_parameter_that_matters(owner, project):
    job = make_tuning_job(project, owner, parameter_ranges={
        "learning_rate": RANGES["learning_rate"], "layers": RANGES["layers"]})
    # The objective depends on the learning rate only: high near 0.01, whatever the layers.
    for number, (lr, layers) in enumerate([(0.0001, 1), (0.0003, 4), (0.001, 2), (0.003, 3), (0.008, 1), (0.01, 4),
                                           (0.012, 2), (0.03, 3), (0.06, 1), (0.1, 4), (0.0005, 2), (0.02, 3)]):
        make_trial(job, number, {"learning_rate": lr, "layers": layers}, 1 - abs(math.log10(lr) + 2) / 3)
    importances = param_importances(job)
    assert list(importances) == ["learning_rate", "layers"]
    assert importances["learning_rate"] > 0.6 and sum(importances.values()) == pytest.approx(1.0)


def test_importances_need_two_completed_trials_and_a_parameter(owner, project):
    job = make_tuning_job(project, owner)
    assert param_importances(job) == {}
    make_trial(job, 0, {"learning_rate": 0.01, "layers": 2, "optimizer": "adam"}, 0.8)
    make_trial(job, 1, {"learning_rate": 0.02, "layers": 2, "optimizer": "adam"}, None, status=JobStatus.STOPPED,
               stop_reason="EarlyStopped", intermediate={"10": 0.3})
    assert param_importances(job) == {}  # one completed trial: nothing to compare
    make_trial(job, 2, {"learning_rate": 0.03, "layers": 3, "optimizer": "sgd"}, 0.7)
    assert set(param_importances(job)) == set(RANGES)
    no_ranges = make_tuning_job(project, owner, name="empty", parameter_ranges={})
    make_trial(no_ranges, 0, {}, 0.5)
    make_trial(no_ranges, 1, {}, 0.6)
    assert param_importances(no_ranges) == {}


def test_a_trial_outside_its_ranges_is_left_out_not_an_error(owner, project):
    job = make_tuning_job(project, owner)
    make_trial(job, 0, {"learning_rate": 0.01, "layers": 2, "optimizer": "adam"}, 0.8)
    make_trial(job, 1, {"learning_rate": 5.0, "layers": 2, "optimizer": "adam"}, 0.9)  # above max
    make_trial(job, 2, {"learning_rate": 0.02, "layers": 3, "optimizer": "sgd"}, 0.7)
    assert set(param_importances(job)) == set(RANGES)
    assert chart_data(job)["best_so_far"][-1] == [2, 0.9]


# --- create, "Tune this" ---------------------------------------------------------------------
def test_form_offers_algorithms_metrics_and_earlier_searches(owner, project, other_project):
    make_tuning_job(project, owner, name="earlier")
    body = login(owner).get(reverse("tuning-create")).content.decode()
    assert 'id="tuning-form"' in body and 'action="/api/v1/tuning-jobs/"' in body
    data = form_data(body)
    tabular = next(a for a in data["algorithms"] if a["name"] == "tabular-classifier")
    assert "validation_accuracy" in tabular["metric_names"] and "epoch" not in tabular["metric_names"]
    assert tabular["default_objective"] == {"metric": "validation_accuracy", "goal": "maximize"}
    assert [w["name"] for w in data["warm_start"]] == ["earlier"]
    assert data["prefill"] is None
    assert re.search(r'id="id_strategy".*?<option value="bayesian" selected>', body, re.S)
    assert 'name="max_trials" value="20"' in body and 'name="max_parallel" value="2"' in body


def test_from_job_prefills_the_form_with_ranges_around_its_values(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path)
    source = TrainingJob.objects.create(
        project=project, name="baseline", algorithm="tabular-classifier", status=JobStatus.COMPLETED,
        hyperparameters={"epochs": 7, "learning_rate": 0.01, "hidden_units": 64, "layers": 2, "label_column": "label"},
        resources={"instance_type": "cpu", "instance_count": 1}, stopping={"max_runtime_seconds": 600},
        checkpoint={"uri": "s3://bucket/ckpt/", "every_steps": 50}, environment={"MY_FLAG": "1"}, tags=["base"],
        final_metrics={"validation_accuracy": 0.9})
    JobInput.objects.create(job=source, channel="train", dataset_version=version)
    body = login(owner).get(reverse("tuning-create") + f"?from_job={source.pk}").content.decode()
    assert 'value="baseline-tuning"' in body
    assert re.search(r'id="id_algorithm".*?<option value="tabular-classifier" selected>', body, re.S)
    assert 'name="trial_max_runtime_seconds" value="600"' in body
    assert re.search(r'id="id_objective_goal".*?<option value="maximize" selected>', body, re.S)
    assert f'href="/jobs/{source.pk}/"' in body
    prefill = form_data(body)["prefill"]
    ranges = prefill["parameter_ranges"]
    assert ranges["learning_rate"] == {"type": "continuous", "min": 0.001, "max": 0.1, "scale": "log"}
    assert ranges["hidden_units"] == {"type": "integer", "min": 32, "max": 128, "scale": "linear"}
    assert ranges["layers"] == {"type": "integer", "min": 1, "max": 4, "scale": "linear"}
    assert "epochs" not in ranges and "seed" not in ranges and "log_every_steps" not in ranges
    base = prefill["base_job"]
    assert base["algorithm"] == "tabular-classifier"
    assert base["hyperparameters"] == {"epochs": 7, "label_column": "label"}  # the tuned ones left out
    assert base["inputs"] == {"train": {"dataset_version": version.pk, "mode": "file"}}
    assert base["checkpoint"] == {"every_steps": 50}  # no shared checkpoint URI between trials
    assert base["environment"] == {"MY_FLAG": "1"} and base["tags"] == ["base"]
    assert "name" not in base and "project" not in base
    assert prefill["objective"] == {"metric": "validation_accuracy", "goal": "maximize"}


def test_from_a_viewer_project_job_lands_in_a_writable_project(owner, project, other_project, tmp_path):
    from studio.actions import set_membership

    set_membership(project=other_project, user=owner, role="viewer")
    source = TrainingJob.objects.create(project=other_project, name="theirs", algorithm="char-lm",
                                        status=JobStatus.COMPLETED, hyperparameters={"learning_rate": 0.003})
    body = login(owner).get(reverse("tuning-create") + f"?from_job={source.pk}").content.decode()
    assert re.search(r'id="id_project".*?<option value="acme" selected>', body, re.S)
    prefill = form_data(body)["prefill"]
    assert prefill["objective"] == {"metric": "validation_loss", "goal": "minimize"}


def test_proposed_ranges_stay_inside_the_schema():
    assert propose_range("learning_rate", "float", 0.5, 1e-7, 1.0) == {"type": "continuous", "min": 0.05, "max": 1.0,
                                                                        "scale": "log"}
    assert propose_range("weight_decay", "float", 0.0, 0.0, 1.0) is None  # no log range around zero
    assert propose_range("layers", "integer", 0, 0, 16) == {"type": "integer", "min": 0, "max": 1, "scale": "linear"}
    assert propose_range("hidden_units", "integer", 1, 1, 8192) == {"type": "integer", "min": 1, "max": 2, "scale": "linear"}
    assert propose_range("seed", "integer", 42) is None
    assert propose_range("max_tokens", "integer", 512) is None
    script = TrainingJob(name="s", script_uri="file:///x/train.py", hyperparameters={"lr": 0.02, "depth": 6, "name": "x"})
    assert proposed_ranges(script) == {"depth": {"type": "integer", "min": 3, "max": 12, "scale": "linear"},
                                       "lr": {"type": "continuous", "min": 0.002, "max": 0.2, "scale": "log"}}


# --- escaping ---------------------------------------------------------------------------------
def test_user_text_is_escaped_everywhere(owner, project):
    job = make_tuning_job(project, owner, name=XSS, parameter_ranges={
        XSS: {"type": "categorical", "values": [XSS, "b"]}, "lr": RANGES["learning_rate"]},
        objective={"metric": XSS, "goal": "maximize"}, status=TuningStatus.FAILED, failure_reason=XSS)
    trial = make_trial(job, 0, {XSS: XSS, "lr": 0.01}, 0.5)
    make_trial(job, 1, {XSS: "b", "lr": 0.02}, 0.6)
    TuningJob.objects.filter(pk=job.pk).update(best_trial=trial, best_value=0.5)
    TrainingJob.objects.filter(pk=trial.pk).update(name=XSS)
    client = login(owner)
    for url in (reverse("tuning"), reverse("tuning-detail", args=[job.pk]), reverse("tuning-create"),
                reverse("tuning-create") + f"?from_job={trial.pk}"):
        body = client.get(url).content.decode()
        assert "<script>alert" not in body, url
        assert "&lt;script&gt;alert" in body or "\\u003Cscript\\u003Ealert" in body, url


# --- the job page's "Tune this" ---------------------------------------------------------------
def test_finished_job_offers_tune_this_to_scientists(owner, teammate, viewer, project):
    done = TrainingJob.objects.create(project=project, name="done", algorithm="tabular-classifier",
                                      status=JobStatus.COMPLETED)
    running = TrainingJob.objects.create(project=project, name="running", algorithm="tabular-classifier",
                                         status=JobStatus.TRAINING, started_at=timezone.now())
    link = f'href="{reverse("tuning-create")}?from_job={done.pk}"'
    assert link in login(teammate).get(reverse("job-detail", args=[done.pk])).content.decode()
    assert "?from_job=" not in login(teammate).get(reverse("job-detail", args=[running.pk])).content.decode()
    assert "?from_job=" not in login(viewer).get(reverse("job-detail", args=[done.pk])).content.decode()


def test_a_trials_job_page_links_back_to_its_search(owner, project):
    job, trials = searched(project, owner)
    body = login(owner).get(reverse("job-detail", args=[trials[2].pk])).content.decode()
    assert f'href="{reverse("tuning-detail", args=[job.pk])}"' in body and "#2</span> of" in body


def test_detail_names_the_base_jobs_dataset_versions(owner, project, tmp_path):
    version = make_version(project, owner, tmp_path)
    job = make_tuning_job(project, owner, base_job={"algorithm": "tabular-classifier", "inputs": {
        "train": {"dataset_version": version.pk, "mode": "file"}}, "stopping": {"max_runtime_seconds": 300}})
    body = login(owner).get(reverse("tuning-detail", args=[job.pk])).content.decode()
    assert f'href="/datasets/{version.dataset_id}/?version=1">flowers v1</a>' in body
    assert "300 s per trial" in body
