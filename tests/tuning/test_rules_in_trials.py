"""A tuning job's base_job rules apply to every trial; a bad one is a 400 naming it; a trial
a rule stopped counts as pruned."""

from __future__ import annotations

import re

from django.utils import timezone

from jobs.models import RULE_TRIGGERED, JobRule, JobStatus, MetricPoint, TrainingJob
from tests.tuning.conftest import body, create, trials_of
from tuning.engine import advance
from tuning.serializers import trial_counts


def test_every_trial_gets_the_base_jobs_rules(owner, client_for, quadratic):
    rules = [{"name": "loss-high", "type": "custom", "parameters": {"metric": "loss", "threshold": 100, "comparison": ">"},
              "actions": ["stop"]}]
    tuning = create(client_for(owner), body({**quadratic, "rules": rules}, max_parallel=2))
    advance(tuning.pk)
    trials = trials_of(tuning)
    assert len(trials) == 2
    for trial in trials:
        assert set(JobRule.objects.filter(job=trial).values_list("name", flat=True)) == {"loss-high", "non_finite"}


def test_a_bad_base_job_rule_is_a_400_naming_it(owner, client_for, quadratic):
    response = client_for(owner).post("/api/v1/tuning-jobs/", body({**quadratic, "rules": [{"type": "nope"}]}),
                                      format="json")
    assert response.status_code == 400, response.content
    assert "rules[0].type" in str(response.json()["error"]), response.json()


def test_a_trial_stopped_by_a_rule_counts_as_pruned(project):
    job = TrainingJob(project=project, name="t", status=JobStatus.STOPPED, stop_reason="RuleTriggered", stop_rule="x")
    assert job.was_early_stopped()
    counts = trial_counts([(JobStatus.STOPPED, "RuleTriggered", 2), (JobStatus.STOPPED, "EarlyStopped", 1),
                           (JobStatus.STOPPED, "StopRequested", 1)])
    assert (counts["stopped"], counts["early_stopped"], counts["rule_stopped"]) == (4, 3, 2)


def test_the_search_says_which_rule_pruned_a_trial_and_its_last_value(owner, client, client_for, quadratic):
    # Found by using it: a trial a rule stopped read "Stopped early (EarlyStopped): its
    # intermediate values were not promising", "2 pruned early" beside "Early stop: off", no
    # rule named anywhere, and the value shown was the one the tuner last polled (step 1),
    # not the trial's last point (step 4).
    rules = [{"name": "loss-high", "type": "custom", "parameters": {"metric": "loss", "threshold": 100, "comparison": ">"},
              "actions": ["stop"]}]
    tuning = create(client_for(owner), body({**quadratic, "rules": rules}, max_parallel=2))
    advance(tuning.pk)
    trial = trials_of(tuning)[0]
    MetricPoint.objects.bulk_create([MetricPoint(job=trial, name="loss", step=step, rank=0, value=value, time=timezone.now())
                                     for step, value in ((1, 0.95), (2, 0.9), (3, 0.85), (4, 0.8145))])
    TrainingJob.objects.filter(pk=trial.pk).update(status=JobStatus.STOPPED, stop_reason=RULE_TRIGGERED,
                                                   stop_rule="loss-high", finished_at=timezone.now(),
                                                   intermediate_values={"1": 0.95})
    advance(tuning.pk)
    trial.refresh_from_db()
    assert trial.intermediate_values["4"] == 0.8145

    detail = client_for(owner).get(f"/api/v1/tuning-jobs/{tuning.pk}/").json()
    assert detail["trial_counts"]["rule_stopped"] == 1 and detail["trial_counts"]["early_stopped"] == 1
    shown = next(t for t in detail["trials"] if t["id"] == trial.pk)
    assert (shown["stop_reason"], shown["stop_rule"]) == ("RuleTriggered", "loss-high")

    client.force_login(owner)
    html = client.get(f"/tuning/{tuning.pk}/").content.decode()
    assert 'title="Stopped by its rule loss-high (RuleTriggered)">pruned</span>' in html
    assert "data-stop-rule>by loss-high</span>" in html and "not promising" not in html
    assert "1 pruned (all by their rules)" in html
    assert re.search(r'id="base-rules">.*loss-high.*non_finite', html, re.S), html[html.find("Every trial"):][:2000]
    assert "0.8145" in html and "search of" not in html
