"""The engine without nodes: trials are ended by hand (finish_trial) so each decision of a
tick can be checked at once — asking, warm start, end conditions, pruning, races."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, close_old_connections, transaction
from django.utils import timezone

from jobs.models import EARLY_STOPPED, JobStatus, MetricPoint, TrainingJob
from jobs.transitions import transition
from tests.tuning.conftest import body, create, finish_trial, trials_of
from tuning.engine import advance, advance_all
from tuning.models import TuningJob, TuningStatus

GRID_X = {"x": {"type": "categorical", "values": [1, 2, 3]}}


def test_each_tick_asks_only_up_to_max_parallel_and_max_trials(owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, max_parallel=2, max_trials=3))
    advance(tuning.pk)
    advance(tuning.pk)
    assert [t.trial_number for t in trials_of(tuning)] == [1, 2]
    finish_trial(trials_of(tuning)[0], loss=1.0)
    advance(tuning.pk)
    assert [t.trial_number for t in trials_of(tuning)] == [1, 2, 3]
    for trial in trials_of(tuning)[1:]:
        finish_trial(trial, loss=3.0)
    assert advance(tuning.pk) == TuningStatus.COMPLETED
    tuning.refresh_from_db()
    assert tuning.end_reason == "MaxTrialsReached" and tuning.best_value == 1.0
    assert tuning.best_trial == trials_of(tuning)[0] and tuning.finished_at is not None
    assert len({tuple(sorted(t.trial_params.items())) for t in trials_of(tuning)}) == 3


def test_the_same_seed_and_history_give_the_same_trials(owner, client_for, quadratic):
    client = client_for(owner)
    first = create(client, body(quadratic, strategy="bayesian", name="a", max_parallel=3, max_trials=6))
    second = create(client, body(quadratic, strategy="bayesian", name="b", max_parallel=3, max_trials=6))
    other_seed = create(client, body(quadratic, strategy="bayesian", name="c", max_parallel=3, max_trials=6, seed=8))
    advance_all()
    params = lambda t: [trial.trial_params for trial in trials_of(t)]  # noqa: E731
    assert params(first) == params(second)
    assert params(first) != params(other_seed)
    assert len({tuple(p.values()) for p in params(first)}) == 3  # a rebuilt sampler never repeats its first draw


def test_two_ticks_racing_never_create_duplicate_trials(transactional_db, owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, max_parallel=3, max_trials=4))
    errors: list[BaseException] = []

    def tick() -> None:
        try:
            for _ in range(3):
                advance(tuning.pk)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            close_old_connections()

    threads = [threading.Thread(target=tick) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert [t.trial_number for t in trials_of(tuning)] == [1, 2, 3]
    # The database backs the lock up: one job per trial number.
    with pytest.raises(IntegrityError), transaction.atomic():
        TrainingJob.objects.filter(pk=trials_of(tuning)[2].pk).update(trial_number=1)


def test_a_fresh_engine_continues_a_search_where_it_stopped(owner, client_for, quadratic):
    """Nothing survives between ticks but the database: dropping the engine (a restart)
    is the same as ticking again."""
    import importlib

    import tuning.engine as engine

    search = create(client_for(owner), body(quadratic, strategy="grid", parameter_ranges=GRID_X, max_trials=3))
    engine.advance(search.pk)
    finish_trial(trials_of(search)[0], loss=1.0)
    engine = importlib.reload(engine)  # a fresh module: no state carried over
    engine.advance(search.pk)
    finish_trial(trials_of(search)[1], loss=2.0)
    engine.advance(search.pk)
    finish_trial(trials_of(search)[2], loss=3.0)
    assert engine.advance(search.pk) == TuningStatus.COMPLETED
    assert [t.trial_params for t in trials_of(search)] == [{"x": 1}, {"x": 2}, {"x": 3}]


def test_warm_start_skips_the_grid_points_earlier_jobs_tried(owner, client_for, quadratic):
    client = client_for(owner)
    earlier = create(client, body(quadratic, name="earlier", strategy="grid", max_parallel=2, max_trials=2,
                                  parameter_ranges={"x": {"type": "categorical", "values": [1, 2]}}))
    advance(earlier.pk)
    for trial, loss in zip(trials_of(earlier), (0.5, 4.0), strict=True):
        finish_trial(trial, loss=loss)
    assert advance(earlier.pk) == TuningStatus.COMPLETED

    grid = {"strategy": "grid", "parameter_ranges": GRID_X, "max_parallel": 1}
    refused = client.post("/api/v1/tuning-jobs/", body(quadratic, name="cold", max_trials=1, **grid), format="json")
    assert refused.status_code == 400 and "The grid has 3 points" in refused.json()["error"]["fields"]["max_trials"][0]
    later = create(client, body(quadratic, name="later", max_trials=1, warm_start_from=[earlier.pk], **grid))
    advance(later.pk)
    assert [t.trial_params for t in trials_of(later)] == [{"x": 3}]
    finish_trial(trials_of(later)[0], loss=9.0)
    assert advance(later.pk) == TuningStatus.COMPLETED
    later.refresh_from_db()
    assert later.best_trial == trials_of(later)[0]  # the best of its own trials
    assert list(later.warm_start_from.all()) == [earlier]


def test_warm_start_feeds_the_bayesian_model(owner, client_for, quadratic):
    """With enough earlier completed trials, TPE models from the first trial on; without
    them the same seed gives its random start-up draw."""
    client = client_for(owner)
    earlier = create(client, body(quadratic, name="earlier", max_parallel=6, max_trials=6))
    advance(earlier.pk)
    for trial in trials_of(earlier):
        p = trial.trial_params
        finish_trial(trial, loss=(p["x"] - 1) ** 2 + (p["y"] + 2) ** 2)
    advance(earlier.pk)
    search = {"strategy": "bayesian", "max_trials": 6, "seed": 11}
    cold = create(client, body(quadratic, name="cold", **search))
    warm = create(client, body(quadratic, name="warm", warm_start_from=[earlier.pk], **search))
    advance(cold.pk)
    advance(warm.pk)
    assert trials_of(cold)[0].trial_params != trials_of(warm)[0].trial_params


def test_reaching_the_target_value_stops_the_others_and_completes(owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, max_parallel=3, max_trials=10, target_value=0.1))
    advance(tuning.pk)
    first, second, third = trials_of(tuning)
    transition(second.pk, JobStatus.TRAINING, from_statuses=[JobStatus.PENDING])
    finish_trial(first, loss=0.05)
    assert advance(tuning.pk) == TuningStatus.STOPPING  # the training trial is asked to stop
    second.refresh_from_db()
    third.refresh_from_db()
    assert (second.status, second.stop_reason) == (JobStatus.STOPPING, "StopRequested")
    assert third.status == JobStatus.STOPPED
    transition(second.pk, JobStatus.STOPPED, from_statuses=[JobStatus.STOPPING])  # as its agent would
    assert advance(tuning.pk) == TuningStatus.COMPLETED
    tuning.refresh_from_db()
    assert tuning.end_reason == "TargetValueReached" and tuning.best_trial == first and len(trials_of(tuning)) == 3


def test_max_runtime_ends_the_search_with_its_best_trial(owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, max_parallel=2, max_trials=10, max_runtime_seconds=60))
    advance(tuning.pk)
    finish_trial(trials_of(tuning)[0], loss=2.5)
    advance(tuning.pk)
    assert len(trials_of(tuning)) == 3
    TuningJob.objects.filter(pk=tuning.pk).update(started_at=timezone.now() - timedelta(seconds=61))
    assert advance(tuning.pk) == TuningStatus.COMPLETED  # the pending trials stop at once
    tuning.refresh_from_db()
    assert tuning.end_reason == "MaxRuntimeExceeded" and tuning.best_value == 2.5
    assert [t.status for t in trials_of(tuning)] == ["Completed", "Stopped", "Stopped"]


def test_a_search_whose_first_trials_all_fail_fails_saying_why(owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, max_parallel=2, max_trials=10))
    advance(tuning.pk)
    for trial in trials_of(tuning):
        finish_trial(trial, status=JobStatus.FAILED, failure_reason="ImportError: no module named foo\nmore")
    advance(tuning.pk)
    third = trials_of(tuning)[2]
    finish_trial(third, loss=None)  # completed, but never reported the objective
    assert advance(tuning.pk) == TuningStatus.FAILED
    tuning.refresh_from_db()
    assert tuning.end_reason == "AllTrialsFailed"
    assert "All 3 finished trials failed; trial 1" in tuning.failure_reason
    assert "ImportError: no module named foo." in tuning.failure_reason
    assert "was never reported" in third.events.last().message


def test_a_trial_that_cannot_be_created_is_a_failed_trial(owner, client_for, quadratic):
    from datasets.storage import store_for

    tuning = create(client_for(owner), body(quadratic, max_trials=5))
    store_for(quadratic["script"]["uri"]).delete_prefix(quadratic["script"]["uri"])
    advance(tuning.pk)
    trial = trials_of(tuning)[0]
    assert trial.status == JobStatus.FAILED and "could not start this trial: script.uri" in trial.failure_reason
    assert trial.tuning_job_id == tuning.pk and trial.trial_number == 1


def _training_trial(job: TrainingJob, values: list[float]) -> None:
    transition(job.pk, JobStatus.TRAINING, from_statuses=[JobStatus.PENDING])
    now = timezone.now()
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name="loss", step=step, rank=0, value=value, time=now)
                                     for step, value in enumerate(values)])


def test_a_trial_worse_than_the_median_is_early_stopped(owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, early_stopping="median", max_parallel=4, max_trials=4))
    advance(tuning.pk)
    trials = trials_of(tuning)
    for trial, final in zip(trials[:3], (1.0, 1.2, 0.8), strict=True):
        MetricPoint.objects.bulk_create([MetricPoint(job=trial, name="loss", step=s, rank=0, value=final + 9 - s,
                                                     time=timezone.now()) for s in range(10)])
        finish_trial(trial)
    advance(tuning.pk)
    bad = trials[3]
    _training_trial(bad, [50.0, 49.0, 48.0, 47.0])
    advance(tuning.pk)
    bad.refresh_from_db()
    assert (bad.status, bad.stop_reason) == (JobStatus.STOPPING, EARLY_STOPPED)
    assert "EarlyStopped by tuning job" in bad.events.last().message
    # Pruned at step 1 (the first after the warm-up step): the series stops where the pruner did.
    assert bad.intermediate_values == {"0": 50.0, "1": 49.0}
    MetricPoint.objects.create(job=bad, name="loss", step=4, rank=0, value=46.0, time=timezone.now())
    transition(bad.pk, JobStatus.STOPPED, from_statuses=[JobStatus.STOPPING])  # its agent keeps the reason
    assert advance(tuning.pk) == TuningStatus.COMPLETED
    bad.refresh_from_db()
    assert (bad.status, bad.stop_reason) == (JobStatus.STOPPED, EARLY_STOPPED)
    assert bad.intermediate_values == {"0": 50.0, "1": 49.0} and bad.objective_value is None
    tuning.refresh_from_db()
    assert tuning.best_value == pytest.approx(0.8) and tuning.end_reason == "MaxTrialsReached"


def test_hyperband_keeps_its_rungs_between_ticks_and_stops_the_worst(owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, strategy="hyperband", max_parallel=4, max_trials=4))
    assert tuning.early_stopping == "hyperband"
    advance(tuning.pk)
    first, second, third, worst = trials_of(tuning)
    MetricPoint.objects.bulk_create([MetricPoint(job=first, name="loss", step=s, rank=0, value=v, time=timezone.now())
                                     for s, v in enumerate([2.0, 1.5])])
    finish_trial(first)  # fixes max_resource: its last step + 1 (one bracket)
    advance(tuning.pk)
    _training_trial(second, [1.0, 1.0])
    _training_trial(third, [1.0, 0.8])
    _training_trial(worst, [50.0, 49.0])
    advance(tuning.pk)
    tuning.refresh_from_db()
    assert tuning.pruner_state == {"max_resource": 2, "rungs": {"2": {"completed_rung_0": 1.0},
                                                                "3": {"completed_rung_0": 0.8},
                                                                "4": {"completed_rung_0": 49.0}}}
    states = {t.trial_number: (t.status, t.stop_reason) for t in trials_of(tuning)}
    assert states[4] == (JobStatus.STOPPING, EARLY_STOPPED)
    assert states[2] == states[3] == (JobStatus.TRAINING, "")
    MetricPoint.objects.create(job=first, name="loss", step=5, rank=0, value=0.1, time=timezone.now())
    advance(tuning.pk)
    tuning.refresh_from_db()
    assert tuning.pruner_state["max_resource"] == 2  # fixed once, whatever completes later


def test_a_trial_close_to_its_peers_runs_on(owner, client_for, quadratic):
    tuning = create(client_for(owner), body(quadratic, early_stopping="median", max_parallel=2, max_trials=2))
    advance(tuning.pk)
    good, close = trials_of(tuning)
    MetricPoint.objects.bulk_create([MetricPoint(job=good, name="loss", step=s, rank=0, value=10.0 - s,
                                                 time=timezone.now()) for s in range(5)])
    finish_trial(good)
    _training_trial(close, [9.0, 8.5, 7.0])
    advance(tuning.pk)
    close.refresh_from_db()
    assert close.status == JobStatus.TRAINING
    assert close.intermediate_values == {"0": 9.0, "1": 8.5, "2": 7.0}


def test_a_completed_trial_waits_for_its_last_points_to_be_written(owner, client_for, quadratic):
    """Its objective is the metric's last value once the flusher drained the trial's
    stream; a flusher that stays away holds the search SETTLE_SECONDS at most."""
    from studio.redis_conn import redis_client
    from trainyard.protocol import METRICS_STREAM, key
    from tuning.engine import SETTLE_SECONDS

    tuning = create(client_for(owner), body(quadratic, max_trials=1))
    advance(tuning.pk)
    trial = trials_of(tuning)[0]
    redis_client().xadd(key(METRICS_STREAM, trial.pk), {"r": "0", "p": '[["loss", 0, 0.25, 0]]'})
    finish_trial(trial, loss=None)
    assert advance(tuning.pk) == TuningStatus.IN_PROGRESS  # unwritten points: not settled yet
    MetricPoint.objects.create(job=trial, name="loss", step=0, rank=0, value=0.25, time=timezone.now())
    TrainingJob.objects.filter(pk=trial.pk).update(finished_at=timezone.now() - timedelta(seconds=SETTLE_SECONDS + 1))
    assert advance(tuning.pk) == TuningStatus.COMPLETED
    trial.refresh_from_db()
    assert trial.objective_value == 0.25 and trial.intermediate_values == {"0": 0.25}
