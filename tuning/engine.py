"""The search loop: Optuna's ask-and-tell, one tick at a time, with every bit of state in
the database (the TuningJob row, its trials' TrainingJob rows and their metric points).

    advance_all()            every active tuning job (beat, every 2 s)
    advance(tuning_job_id)   one of them (on commit of a create or stop; when a trial ends)

A tick holds the tuning job's row lock (SELECT … FOR UPDATE; on SQLite the IMMEDIATE
transaction is the lock), so two ticks never decide for the same search at once, and a
unique (tuning_job, trial_number) constraint backs that up. Nothing lives in memory between
ticks: each rebuilds the Optuna study from the rows, so a control worker that restarts, or
a second one, carries on where the last tick left off.

One tick (Search.advance):
1. Settle finished trials: a completed trial's objective value is the last value of the
   objective metric (rank 0, highest step) once the flusher has written the trial's last
   points (its metric stream is drained; after SETTLE_SECONDS, whatever is there). A trial
   that completes without reporting the metric counts as failed.
2. Read running trials' new objective points into `intermediate_values` and ask the pruner
   about each new step in order, as `trial.report(); trial.should_prune()` would in one
   process; a pruned trial is stopped with stop_reason EarlyStopped and its series frozen
   at the step it was pruned at.
3. End conditions: target_value reached by a completed trial, max_runtime_seconds passed,
   or the first trials all failed → stop the trials still running (the search is
   Stopping until they end).
4. Ask for new trials while fewer than max_parallel run and fewer than max_trials exist;
   each is a TrainingJob submitted through jobs.actions.submit_job.
5. When nothing runs any more and no more trials will be asked for, end: Completed,
   Stopped (a person asked) or Failed (no trial completed). The best trial is kept up to
   date throughout.

Samplers: TPE for "bayesian" and "hyperband" (Optuna pairs Hyperband with TPE), random
for "random"; the grid is walked in order (tuning.ranges). Each ask builds its sampler
with a seed derived from (seed, trial number): the same seed and the same history give
the same trials, and a rebuilt sampler never repeats its first draw.

Pruners: "median" is Optuna's MedianPruner (stop a trial whose best value so far is worse
than the median of completed trials at the same step, after MEDIAN_WARMUP_STEPS, once
median_startup_trials trials completed); "hyperband" is Optuna's HyperbandPruner with
max_resource fixed by the first completed trial (its last step + 1) and min_resource
about 1/27 of it (four brackets at reduction factor 3). Its per-trial rungs and
max_resource are kept in TuningJob.pruner_state between ticks.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import optuna
import redis
from django.db import transaction
from django.utils import timezone
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from jobs.actions import JobError, NotStoppable, stop_job, submit_job
from jobs.metrics import text
from jobs.models import (
    EARLY_STOPPED,
    FINISHED_STATUSES,
    RULE_TRIGGERED,
    STOP_REQUESTED,
    JobEvent,
    JobStatus,
    MetricPoint,
    TrainingJob,
)
from jobs.transitions import note
from trainyard.protocol import FLUSHER_GROUP, METRICS_STREAM, key
from tuning import ranges
from tuning.models import EarlyStopping, EndReason, Strategy, TuningJob, TuningStatus

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)

# How long a completed trial's objective waits for the flusher before the tick takes what
# the database holds (a flusher that is down must not hold a search forever).
SETTLE_SECONDS = 60
# Objective points kept per trial; log the objective per evaluation, not per batch.
MAX_INTERMEDIATE_VALUES = 2_000
MEDIAN_WARMUP_STEPS = 1
HYPERBAND_REDUCTION_FACTOR = 3
HYPERBAND_MIN_RESOURCE_FRACTION = 27  # min_resource ≈ max_resource / 27: four brackets
MAX_TPE_STARTUP_TRIALS = 10  # Optuna's default
# The search fails early when its first this-many finished trials all failed (or
# max_parallel, if larger): a broken base job fails every trial.
FAIL_FAST_TRIALS = 3
# What a tick reads of every trial. intermediate_values (the heavy part) is loaded only for the
# trials a decision needs (Search.load_series): most ticks decide nothing.
TRIAL_FIELDS = ("pk", "trial_number", "status", "stop_reason", "failure_reason", "trial_params", "objective_value",
                "finished_at", "tuning_job_id")


def median_startup_trials(max_trials: int) -> int:
    """Completed trials before the median rule stops any: Optuna's 5, fewer in a small search."""
    return max(1, min(5, max_trials // 5))


def tpe_startup_trials(max_trials: int) -> int:
    """Random trials before TPE models: Optuna's 10, a third of a small search."""
    return max(2, min(MAX_TPE_STARTUP_TRIALS, max_trials // 3))


def advance_all() -> list[int]:
    """One tick of every active search; returns their ids. One search's trouble is logged
    and the others go on."""
    ids = list(TuningJob.objects.active().order_by("pk").values_list("pk", flat=True))
    for tuning_job_id in ids:
        try:
            advance(tuning_job_id)
        except Exception:  # noqa: BLE001 - the next tick tries again
            log.exception("tuning job %s: the tick failed; trying again at the next one", tuning_job_id)
    return ids


def advance(tuning_job_id: int) -> str | None:
    """One tick of one search, under its row lock. Returns its status afterwards (None when
    it is not active or another tick holds it)."""
    with transaction.atomic():
        tuning = (TuningJob.objects.select_for_update(skip_locked=True, of=("self",))
                  .select_related("project", "created_by")
                  .filter(pk=tuning_job_id).first())
        if tuning is None or tuning.is_finished():
            return None
        Search(tuning).advance()
        return tuning.status


# --- the trials as the study sees them -------------------------------------------------------------
@dataclass
class TrialView:
    """A trial row and what the study makes of it."""

    job: TrainingJob
    settled: bool  # finished and its metrics are written (or waited for long enough)

    @property
    def number(self) -> int:
        """The trial's number in its tuning job (every trial row has one)."""
        number = self.job.trial_number
        assert number is not None, "a trial row without a trial number"
        return number

    @property
    def objective(self) -> float:
        """The objective value; only a completed trial has one."""
        value = self.job.objective_value
        assert value is not None, "a trial without an objective value"
        return float(value)

    @property
    def finished(self) -> bool:
        return self.job.status in FINISHED_STATUSES

    @property
    def completed(self) -> bool:
        """Completed with an objective value: counts for the best trial and the samplers."""
        return self.job.status == JobStatus.COMPLETED and self.job.objective_value is not None

    @property
    def failed(self) -> bool:
        """Failed, or completed without reporting the objective (once settled)."""
        if self.job.status == JobStatus.FAILED:
            return True
        return self.job.status == JobStatus.COMPLETED and self.settled and self.job.objective_value is None

    @property
    def accounted(self) -> bool:
        """Finished, and nothing about its outcome will change."""
        return self.finished and (self.job.status != JobStatus.COMPLETED or self.settled or self.completed)

    def state(self) -> TrialState:
        if self.completed:
            return TrialState.COMPLETE
        if not self.accounted:
            return TrialState.RUNNING
        if self.job.was_early_stopped():
            return TrialState.PRUNED
        return TrialState.FAIL


def series(job: TrainingJob) -> dict[int, float]:
    return {int(step): float(value) for step, value in (job.intermediate_values or {}).items()}


def metrics_settled(job: TrainingJob) -> bool:
    """Whether the flusher has written every point the finished job sent (its metric stream
    is drained; the same test as the flusher's own retire step), or SETTLE_SECONDS passed."""
    if job.finished_at is None:
        return False
    if timezone.now() - job.finished_at > timedelta(seconds=SETTLE_SECONDS):
        return True
    from studio.redis_conn import redis_client

    stream = key(METRICS_STREAM, job.pk)
    try:
        client = redis_client()
        last = client.xrevrange(stream, count=1)
        if not last:
            return True  # the job never sent a point through Redis
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:
        return True
    except Exception:  # noqa: BLE001 - Redis away: wait for it (up to SETTLE_SECONDS)
        log.warning("could not read job %s's metric stream; waiting", job.pk, exc_info=True)
        return False
    group = next((g for g in groups if text(g["name"]) == FLUSHER_GROUP), None)
    if group is None or group["pending"]:
        return False
    return _stream_id(last[0][0]) <= _stream_id(group["last-delivered-id"])


def _stream_id(raw: Any) -> tuple[int, int]:
    ms, _, seq = text(raw or "0-0").partition("-")
    return int(ms), int(seq or 0)


# --- one search ------------------------------------------------------------------------------------
class Search:
    def __init__(self, tuning: TuningJob) -> None:
        self.tuning = tuning
        self.ranges: dict[str, dict] = tuning.parameter_ranges
        self.names = sorted(self.ranges)
        self.distributions: dict[str, BaseDistribution] = ranges.distributions(self.ranges)
        self.trials: list[TrialView] = []
        self.now = timezone.now()
        self._warm: list[TrialView] | None = None
        self._changed: set[str] = set()

    # --- the tick -----------------------------------------------------------------------------
    def advance(self) -> None:
        tuning = self.tuning
        jobs = list(TrainingJob.objects.filter(tuning_job=tuning).only(*TRIAL_FIELDS).order_by("trial_number"))
        self.trials = [TrialView(job, settled=False) for job in jobs]
        for trial in self.trials:
            self.settle(trial)
        if tuning.status == TuningStatus.IN_PROGRESS:
            self.prune_running()
            self.check_end_conditions()
        if tuning.status == TuningStatus.STOPPING:
            self.stop_unfinished(f"the tuning job is ending ({tuning.end_reason})")
        if tuning.status == TuningStatus.IN_PROGRESS:
            self.ask_new_trials()
        self.update_best()
        self.finish_if_done()
        self.save()

    def save(self) -> None:
        if self._changed:
            self.tuning.save(update_fields=sorted(self._changed))
            self._changed.clear()

    def set(self, **fields: Any) -> None:
        for name, value in fields.items():
            if getattr(self.tuning, name) != value:
                setattr(self.tuning, name, value)
                self._changed.add(name)

    # --- 1. settle ----------------------------------------------------------------------------
    def settle(self, trial: TrialView) -> None:
        job = trial.job
        if job.status != JobStatus.COMPLETED:
            trial.settled = job.status in FINISHED_STATUSES
            if job.stop_reason == RULE_TRIGGERED and job.finished_at and self.now - job.finished_at <= timedelta(
                    seconds=SETTLE_SECONDS):
                # Stopped by one of its rules between two prune checks: its last points are
                # read in (the pruner's own stop freezes the series where it pruned instead).
                self.load_series([trial])
                before = len(job.intermediate_values or {})
                if len(self.read_new_points(job)) != before:
                    TrainingJob.objects.filter(pk=job.pk).update(intermediate_values=job.intermediate_values)
            return
        if job.objective_value is not None:
            trial.settled = True
            return
        trial.settled = metrics_settled(job)
        if not trial.settled:
            return
        self.load_series([trial])
        values = self.read_new_points(job)
        if not values:
            message = (f"tuning: the objective metric '{self.tuning.metric}' was never reported (or only as NaN or "
                       "inf); the trial counts as failed")
            if not JobEvent.objects.filter(job_id=job.pk, message=message).exists():
                note(job.pk, message)
            return
        # The stored point at the highest step, not the series' last: a retried attempt that
        # resumed from a checkpoint re-logs steps, replacing their points.
        last = (MetricPoint.objects.filter(job_id=job.pk, name=self.tuning.metric, rank=0).order_by("-step")
                .values_list("value", flat=True).first())
        if last is None or not math.isfinite(last):
            last = values[max(values)]
        job.objective_value = last
        TrainingJob.objects.filter(pk=job.pk).update(objective_value=last, intermediate_values=job.intermediate_values)

    def read_new_points(self, job: TrainingJob) -> dict[int, float]:
        """Append the objective's points after the last one seen to the job's
        intermediate_values (finite values only; at most MAX_INTERMEDIATE_VALUES); returns
        the whole series."""
        seen = series(job)
        room = MAX_INTERMEDIATE_VALUES - len(seen)
        if room > 0:
            after = max(seen) if seen else -(2**63)
            fresh = list(MetricPoint.objects.filter(job_id=job.pk, name=self.tuning.metric, rank=0, step__gt=after)
                         .order_by("step").values_list("step", "value")[:room])
            added = {int(step): float(value) for step, value in fresh if math.isfinite(value)}
            if added:
                seen.update(added)
                job.intermediate_values = {str(step): value for step, value in sorted(seen.items())}
        return seen

    # --- 2. prune -----------------------------------------------------------------------------
    def prune_running(self) -> None:
        running = [t for t in self.trials if t.job.status == JobStatus.TRAINING]
        if not running:
            return
        self.load_series(running)
        pruner = self.pruner()
        new_steps: dict[int, dict[int, float]] = {}
        for trial in running:
            before = set(series(trial.job))
            after = self.read_new_points(trial.job)
            new_steps[trial.job.pk] = {step: value for step, value in sorted(after.items()) if step not in before}
            if not new_steps[trial.job.pk]:
                continue
            if pruner is None:
                TrainingJob.objects.filter(pk=trial.job.pk).update(intermediate_values=trial.job.intermediate_values)
        if pruner is None or not any(new_steps.values()):
            return
        study, numbers = self.build_study(pruner=pruner, exclude_new_steps=new_steps)
        rungs: dict[str, dict] = dict(self.tuning.pruner_state.get("rungs") or {})
        for trial in running:
            fresh = new_steps.get(trial.job.pk) or {}
            if not fresh:
                continue
            # A fresh in-memory study numbers its trials' ids like their numbers.
            optuna_trial = optuna.trial.Trial(study, numbers[trial.number])
            pruned_at = None
            for step, value in fresh.items():
                optuna_trial.report(value, step)
                if optuna_trial.should_prune():
                    pruned_at = step
                    break
            attrs = {k: v for k, v in study.get_trials(deepcopy=False)[numbers[trial.number]].system_attrs.items()
                     if k.startswith("completed_rung_")}
            if attrs:
                rungs[str(trial.job.trial_number)] = attrs
            if pruned_at is not None:
                kept = {str(s): v for s, v in sorted(series(trial.job).items()) if s <= pruned_at}
                trial.job.intermediate_values = kept
            TrainingJob.objects.filter(pk=trial.job.pk).update(intermediate_values=trial.job.intermediate_values)
            if pruned_at is not None:
                self.early_stop(trial, pruned_at)
        if rungs:
            self.set(pruner_state={**self.tuning.pruner_state, "rungs": rungs})

    def early_stop(self, trial: TrialView, step: int) -> None:
        value = series(trial.job)[step]
        message = (f"EarlyStopped by tuning job #{self.tuning.pk} ({self.tuning.early_stopping}): "
                   f"{self.tuning.metric}={value:g} at step {step} is worse than its peers'")
        try:
            stopped = stop_job(trial.job, reason=EARLY_STOPPED, message=message)
        except NotStoppable:
            return  # it finished meanwhile: its outcome stands
        trial.job.status, trial.job.stop_reason = stopped.status, stopped.stop_reason
        log.info("tuning job %s: trial %s pruned at step %s", self.tuning.pk, trial.job.trial_number, step)

    def pruner(self) -> optuna.pruners.BasePruner | None:
        mode = self.tuning.early_stopping
        if mode == EarlyStopping.MEDIAN:
            return optuna.pruners.MedianPruner(n_startup_trials=median_startup_trials(self.tuning.max_trials),
                                               n_warmup_steps=MEDIAN_WARMUP_STEPS)
        if mode == EarlyStopping.HYPERBAND:
            max_resource = self.tuning.pruner_state.get("max_resource") or self.first_max_resource()
            if not max_resource:
                return None  # like Optuna's max_resource="auto": nothing is pruned before a trial completes
            if "max_resource" not in self.tuning.pruner_state:
                self.set(pruner_state={**self.tuning.pruner_state, "max_resource": max_resource})
            return optuna.pruners.HyperbandPruner(
                min_resource=max(1, max_resource // HYPERBAND_MIN_RESOURCE_FRACTION), max_resource=max_resource,
                reduction_factor=HYPERBAND_REDUCTION_FACTOR)
        return None

    def first_max_resource(self) -> int | None:
        """The last step + 1 of the first trial to complete (this search's, else a warm-start one)."""
        self.load_series([t for t in [*self.trials, *self.warm_trials()] if t.completed])
        done = sorted((t for t in self.trials if t.completed and series(t.job)),
                      key=lambda t: (t.job.finished_at or self.now, t.job.trial_number))
        done = done or [t for t in self.warm_trials() if t.completed and series(t.job)]
        if not done:
            return None
        return max(series(done[0].job)) + 1

    # --- the study ----------------------------------------------------------------------------
    def warm_trials(self) -> list[TrialView]:
        """The finished trials of the searches this one warm-starts from whose tuned values
        fit this search's ranges (those of other ranges tell it nothing)."""
        if self._warm is None:
            self._warm = []
            sources = list(self.tuning.warm_start_from.values_list("pk", "status"))
            finished_sources = {pk for pk, status in sources if status not in (TuningStatus.IN_PROGRESS,
                                                                                TuningStatus.STOPPING)}
            jobs = (TrainingJob.objects.filter(tuning_job_id__in=[pk for pk, _ in sources], status__in=FINISHED_STATUSES)
                    .only(*TRIAL_FIELDS).order_by("tuning_job_id", "trial_number"))
            for job in jobs:
                params = job.trial_params or {}
                if not all(name in params and ranges.fits(self.ranges[name], params[name]) for name in self.names):
                    continue
                view = TrialView(job, settled=job.status != JobStatus.COMPLETED or job.objective_value is not None
                                 or job.tuning_job_id in finished_sources)
                if view.accounted:
                    self._warm.append(view)
        return self._warm

    @staticmethod
    def load_series(trials: list[TrialView]) -> None:
        """Fill in the intermediate_values of trials read without them, in one query."""
        missing = [t.job for t in trials if "intermediate_values" in t.job.get_deferred_fields()]
        if not missing:
            return
        loaded = dict(TrainingJob.objects.filter(pk__in=[job.pk for job in missing])
                      .values_list("pk", "intermediate_values"))
        for job in missing:
            job.intermediate_values = loaded.get(job.pk) or {}

    def frozen(self, trial: TrialView, *, drop_steps: dict[int, float] | None = None,
               system_attrs: dict | None = None) -> FrozenTrial:
        state = trial.state()
        values = series(trial.job)
        if drop_steps:
            values = {step: value for step, value in values.items() if step not in drop_steps}
        params = {name: trial.job.trial_params[name] for name in self.names}
        return optuna.trial.create_trial(
            state=state, value=trial.job.objective_value if state == TrialState.COMPLETE else None, params=params,
            distributions=self.distributions, intermediate_values=values, system_attrs=system_attrs or {})

    def build_study(self, *, pruner: optuna.pruners.BasePruner | None = None,
                    exclude_new_steps: dict[int, dict[int, float]] | None = None) -> tuple[optuna.Study, dict[int, int]]:
        """The study as the database has it: this search's trials first, in number order (so
        Optuna's trial number is trial_number - 1, which Hyperband's brackets hash), then the
        warm-start trials. Returns it with {trial_number: Optuna trial number}.
        `exclude_new_steps` leaves out points the pruner has yet to be told about."""
        self.load_series([*self.trials, *self.warm_trials()])
        study = optuna.create_study(study_name=f"tuning-{self.tuning.pk}",
                                    direction="maximize" if self.tuning.maximize else "minimize",
                                    sampler=optuna.samplers.RandomSampler(seed=self.tuning.seed),
                                    pruner=pruner or optuna.pruners.NopPruner())
        rungs = self.tuning.pruner_state.get("rungs") or {}
        numbers: dict[int, int] = {}
        for trial in self.trials:
            drop = (exclude_new_steps or {}).get(trial.job.pk)
            study.add_trial(self.frozen(trial, drop_steps=drop, system_attrs=rungs.get(str(trial.job.trial_number))))
            numbers[trial.number] = len(numbers)
        for trial in self.warm_trials():
            study.add_trial(self.frozen(trial))
        return study, numbers

    def sampler(self, trial_number: int) -> optuna.samplers.BaseSampler:
        seed = (self.tuning.seed * 1_000_003 + trial_number) % 2**32
        if self.tuning.strategy in (Strategy.BAYESIAN, Strategy.HYPERBAND):
            # constant_liar: trials still running count as bad guesses, so parallel trials spread out.
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=tpe_startup_trials(self.tuning.max_trials),
                                              constant_liar=self.tuning.max_parallel > 1)
        return optuna.samplers.RandomSampler(seed=seed)

    # --- 3. end conditions --------------------------------------------------------------------
    def check_end_conditions(self) -> None:
        tuning = self.tuning
        reached = [t for t in self.trials if t.completed and tuning.reaches_target(t.objective)]
        if reached:
            best = min(reached, key=lambda t: t.number)
            self.begin_end(EndReason.TARGET_VALUE_REACHED,
                           f"trial {best.job.trial_number} reached the target value {tuning.target_value:g}")
            return
        if tuning.max_runtime_seconds and tuning.started_at and (
                self.now - tuning.started_at).total_seconds() > tuning.max_runtime_seconds:
            self.begin_end(EndReason.MAX_RUNTIME_EXCEEDED, f"max_runtime_seconds ({tuning.max_runtime_seconds} s) passed")
            return
        accounted = [t for t in self.trials if t.accounted]
        if any(t.completed for t in self.trials):
            return
        fail_fast = min(tuning.max_trials, max(FAIL_FAST_TRIALS, tuning.max_parallel))
        failed = [t for t in accounted if t.failed]
        if len(failed) >= fail_fast and len(failed) == len(accounted):
            self.begin_end(EndReason.ALL_TRIALS_FAILED, "", failure_reason=self.failure_summary(failed))

    def failure_summary(self, failed: list[TrialView]) -> str:
        first = min(failed, key=lambda t: t.number).job
        if first.status == JobStatus.COMPLETED:
            why = f"it completed without reporting the objective metric '{self.tuning.metric}'"
        else:
            why = (first.failure_reason or "no reason recorded").strip().splitlines()[0][:500]
        return (f"All {len(failed)} finished trials failed; trial {first.trial_number} (job #{first.pk}): {why}. "
                "Fix the base job (or the objective metric) and start a new tuning job.")

    def begin_end(self, reason: str, why: str, *, failure_reason: str = "") -> None:
        """Ask no more trials, stop those still running; the search ends once they have."""
        log.info("tuning job %s ends: %s %s", self.tuning.pk, reason, why)
        self.set(status=TuningStatus.STOPPING, end_reason=reason)
        if failure_reason:
            self.set(failure_reason=failure_reason)

    def stop_unfinished(self, why: str) -> None:
        for trial in self.trials:
            job = trial.job
            if job.status in (JobStatus.PENDING, JobStatus.STARTING, JobStatus.TRAINING):
                try:
                    stopped = stop_job(job, reason=STOP_REQUESTED, message=f"Stopped: {why}")
                except NotStoppable:
                    continue
                job.status, job.stop_reason = stopped.status, stopped.stop_reason
                trial.settled = job.status in FINISHED_STATUSES

    # --- 4. ask -------------------------------------------------------------------------------
    def ask_new_trials(self) -> None:
        tuning = self.tuning
        unfinished = sum(1 for t in self.trials if not t.finished)
        wanted = min(tuning.max_parallel - unfinished, tuning.max_trials - len(self.trials))
        if wanted <= 0:
            return
        if tuning.strategy == Strategy.GRID:
            points = self.unvisited_grid_points()[:wanted]
            for params in points:
                self.create_trial(params)
            return
        study, _ = self.build_study()
        for _ in range(wanted):
            number = self.next_number()
            study.sampler = self.sampler(number)
            asked = study.ask(self.distributions)
            # The asked trial stays RUNNING in this study: the next ask sees it.
            self.create_trial(dict(asked.params))

    def unvisited_grid_points(self) -> list[dict[str, Any]]:
        """Grid points no trial of this search (whatever its outcome) or finished warm-start
        trial has tried, in grid order."""
        visited = {ranges.params_key(t.job.trial_params or {}, self.names) for t in [*self.trials, *self.warm_trials()]}
        return [p for p in ranges.grid_points(self.ranges) if ranges.params_key(p, self.names) not in visited]

    def next_number(self) -> int:
        return max((t.job.trial_number or 0 for t in self.trials), default=0) + 1

    def create_trial(self, params: dict[str, Any]) -> TrainingJob:
        """Submit the base job with the trial's values, as trial `next_number()`, in this
        tick's transaction. A trial whose job cannot be created (its values break a rule
        of the algorithm, say) is recorded as a failed trial with the reason."""
        tuning, number = self.tuning, self.next_number()
        base = dict(tuning.base_job)
        hyperparameters = {k: v for k, v in (base.get("hyperparameters") or {}).items() if k not in self.ranges}
        hyperparameters.update(params)
        tag = f"tuning:{tuning.pk}"
        data = {**base, "name": f"{tuning.name}-{number:03d}", "hyperparameters": hyperparameters,
                "tags": [*(t for t in base.get("tags") or [] if t != tag), tag]}
        try:
            with transaction.atomic():
                job = submit_job(project=tuning.project, user=tuning.created_by, data=data)
                TrainingJob.objects.filter(pk=job.pk).update(tuning_job=tuning, trial_number=number, trial_params=params)
        except JobError as exc:
            job = self.record_unstartable(data, number, params, exc)
        job.tuning_job_id, job.trial_number, job.trial_params = tuning.pk, number, params
        self.trials.append(TrialView(job, settled=job.status in FINISHED_STATUSES))
        return job

    def record_unstartable(self, data: dict, number: int, params: dict, exc: JobError) -> TrainingJob:
        reason = f"could not start this trial: {exc}"
        job = TrainingJob.objects.create(
            project=self.tuning.project, name=data["name"], status=JobStatus.FAILED, failure_reason=reason,
            algorithm=data.get("algorithm") or "", script_uri=(data.get("script") or {}).get("uri", ""),
            hyperparameters=data["hyperparameters"], tags=data["tags"], created_by=self.tuning.created_by,
            finished_at=self.now, tuning_job=self.tuning, trial_number=number, trial_params=params)
        JobEvent.objects.create(job=job, status=JobStatus.FAILED, message=reason)
        log.warning("tuning job %s: trial %s %s", self.tuning.pk, number, reason)
        return job

    # --- 5. best and the end ------------------------------------------------------------------
    def update_best(self) -> None:
        best: TrainingJob | None = None
        for trial in self.trials:
            if trial.completed and (best is None or self.tuning.better(trial.objective,
                                                                       best.objective_value)):
                best = trial.job
        self.set(best_trial_id=best.pk if best else None, best_value=best.objective_value if best else None)

    def finish_if_done(self) -> None:
        tuning = self.tuning
        if not all(t.accounted for t in self.trials):
            return
        if tuning.status == TuningStatus.IN_PROGRESS:
            if len(self.trials) < tuning.max_trials and not (
                    tuning.strategy == Strategy.GRID and not self.unvisited_grid_points()):
                return  # more trials to ask for (at the next tick, e.g. after a failed create)
            reason = EndReason.MAX_TRIALS_REACHED if len(self.trials) >= tuning.max_trials else EndReason.GRID_EXHAUSTED
            self.set(end_reason=reason)
        if not any(t.completed for t in self.trials) and tuning.end_reason != EndReason.STOP_REQUESTED:
            # Nothing to report: the search failed, saying why.
            failed = [t for t in self.trials if t.failed]
            if tuning.end_reason == EndReason.MAX_RUNTIME_EXCEEDED:
                why = f"No trial completed before max_runtime_seconds ({tuning.max_runtime_seconds} s) passed."
            else:
                self.set(end_reason=EndReason.ALL_TRIALS_FAILED)
                why = self.failure_summary(failed) if failed else (
                    f"No trial completed with the objective metric '{tuning.metric}' ({len(self.trials)} trials).")
            self.set(failure_reason=tuning.failure_reason or why)
            status = TuningStatus.FAILED
        elif tuning.end_reason == EndReason.STOP_REQUESTED:
            status = TuningStatus.STOPPED
        else:
            status = TuningStatus.COMPLETED
        self.set(status=status, finished_at=self.now)
        log.info("tuning job %s %s (%s); best trial %s = %s", tuning.pk, status, tuning.end_reason,
                 tuning.best_trial_id, tuning.best_value)
