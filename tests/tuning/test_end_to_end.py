"""Searches whose trials really run: two node workers, the quadratic script, the engine
ticked as the control worker would (tests/tuning/conftest.py `drive`)."""

from __future__ import annotations

import subprocess
import sys
from itertools import combinations

import pytest

from jobs.models import EARLY_STOPPED, FINISHED_STATUSES, JobAttempt, JobStatus
from tests.conftest import ROOT, worker_env
from tests.tuning.conftest import body, create, drive, trials_of
from tuning.models import TuningJob, TuningStatus

pytestmark = pytest.mark.slow

# One control worker's life: it schedules, flushes and ticks until the search has `wanted`
# trials, then exits. A fresh interpreter: nothing of the test process's engine carries over.
FRESH_CONTROL_WORKER = """
import os, sys, time
import django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
django.setup()
from jobs.metrics.ingest import Flusher
from jobs.scheduling import schedule_jobs
from tuning.engine import advance_all
from tuning.models import TuningJob

search, wanted = TuningJob.objects.get(pk=int(sys.argv[1])), int(sys.argv[2])
flusher, deadline = Flusher(), time.monotonic() + 60
while search.trials.count() < wanted and time.monotonic() < deadline:
    schedule_jobs()
    while flusher.flush_once(block_ms=0):
        pass
    advance_all()
    time.sleep(0.2)
print("trials:", search.trials.count())
"""


def finished(tuning: TuningJob) -> bool:
    return tuning.is_finished()


def test_a_2x2_grid_runs_exactly_four_trials_never_more_at_once_than_max_parallel(nodes, owner, client_for,
                                                                                   quadratic, isolated_storage):
    """Two idle nodes, max_parallel 1: the trials still run one at a time (from their own
    start and end times). Half-way the control worker is replaced by a fresh process, which
    carries on without repeating a grid point; later trials start in the warm pool."""
    grid = {"x": {"type": "integer", "min": 1, "max": 2}, "y": {"type": "categorical", "values": [-2, 0]}}
    tuning = create(client_for(owner), body({**quadratic, "keep_alive_seconds": 30}, strategy="grid",
                                            parameter_ranges=grid, max_trials=4, max_parallel=1))
    drive(tuning, lambda t: t.trials.filter(objective_value__isnull=False).count() >= 2)
    fresh = subprocess.run([sys.executable, "-c", FRESH_CONTROL_WORKER, str(tuning.pk), "4"], cwd=ROOT,
                           env=worker_env(isolated_storage), capture_output=True, text=True, timeout=120)
    assert "trials: 4" in fresh.stdout, fresh.stdout + fresh.stderr
    tuning = drive(tuning, finished)

    assert (tuning.status, tuning.end_reason) == (TuningStatus.COMPLETED, "MaxTrialsReached")
    trials = trials_of(tuning)
    assert [t.trial_number for t in trials] == [1, 2, 3, 4]
    assert sorted((t.trial_params["x"], t.trial_params["y"]) for t in trials) == [(1, -2), (1, 0), (2, -2), (2, 0)]
    for trial in trials:
        assert trial.status == JobStatus.COMPLETED, trial.failure_reason
        x, y = trial.trial_params["x"], trial.trial_params["y"]
        assert trial.objective_value == pytest.approx((x - 1) ** 2 + (y + 2) ** 2 + 1 / 3)
        assert sorted(trial.intermediate_values) == ["0", "1", "2"]
    assert tuning.best_trial.trial_params == {"x": 1, "y": -2}
    assert tuning.best_value == pytest.approx(1 / 3)
    spans = [(a.started_at, a.finished_at) for a in JobAttempt.objects.filter(job__tuning_job=tuning)]
    assert len(spans) == 4
    for (start_a, end_a), (start_b, end_b) in combinations(spans, 2):
        assert end_a <= start_b or end_b <= start_a, "two trials ran at once with max_parallel 1"
    # The next trial usually lands in the pool the previous one left (it may start cold on the
    # other idle node if it is asked for before the first node's agent has released it).
    assert any(t.warm_pool for t in trials[1:]), [t.warm_pool for t in trials]


def test_a_trial_worse_than_the_median_is_stopped_early(nodes, owner, client_for, quadratic):
    """x=4 has a loss near 10 and trains slowly (the script sleeps 0.3 s × loss a step);
    after x=1 completed, the median rule stops it at its second step."""
    base = {**quadratic, "hyperparameters": {"y": -2, "steps": 6, "step_seconds": 0.3}}
    tuning = create(client_for(owner), body(base, strategy="grid", early_stopping="median", max_trials=2,
                                            parameter_ranges={"x": {"type": "categorical", "values": [1, 4]}}))
    tuning = drive(tuning, finished, timeout=60)

    good, bad = trials_of(tuning)
    assert good.trial_params == {"x": 1} and good.status == JobStatus.COMPLETED
    assert (bad.status, bad.stop_reason) == (JobStatus.STOPPED, EARLY_STOPPED)
    # Two of its six steps reported: it was stopped there, not left to train (no wall-clock
    # bound here — on a loaded machine the stop lands late, but the steps say when).
    assert bad.intermediate_values == {"0": pytest.approx(10.0), "1": pytest.approx(9.5)}
    assert bad.objective_value is None
    assert (tuning.status, tuning.end_reason, tuning.best_trial) == (TuningStatus.COMPLETED, "MaxTrialsReached", good)


def test_stopping_a_search_stops_its_running_trials(nodes, owner, client_for, quadratic):
    base = {**quadratic, "hyperparameters": {"steps": 3, "step_seconds": 5}}
    tuning = create(client_for(owner), body(base, max_parallel=3, max_trials=6))

    def two_training_one_waiting(t: TuningJob) -> bool:
        return sorted(t.trials.values_list("status", flat=True)) == ["Pending", "Training", "Training"]

    drive(tuning, two_training_one_waiting, timeout=60)
    response = client_for(owner).post(f"/api/v1/tuning-jobs/{tuning.pk}/stop/")
    assert response.status_code == 202, response.content
    assert response.json()["status"] == "Stopping"
    assert sorted(t["status"] for t in response.json()["trials"]) == ["Stopped", "Stopping", "Stopping"]

    tuning = drive(tuning, finished, timeout=60)
    assert (tuning.status, tuning.end_reason) == (TuningStatus.STOPPED, "StopRequested")
    trials = trials_of(tuning)
    assert len(trials) == 3
    assert all((t.status, t.stop_reason) == (JobStatus.STOPPED, "StopRequested") for t in trials)
    assert all(t.status in FINISHED_STATUSES for t in trials)
