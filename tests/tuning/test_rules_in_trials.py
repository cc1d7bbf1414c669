"""A tuning job's base_job rules apply to every trial; a bad one is a 400 naming it; a trial
a rule stopped counts as pruned."""

from __future__ import annotations

from jobs.models import JobRule, JobStatus, TrainingJob
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
    assert trial_counts([(JobStatus.STOPPED, "RuleTriggered", 2), (JobStatus.STOPPED, "StopRequested", 1)])[
        "early_stopped"] == 2
