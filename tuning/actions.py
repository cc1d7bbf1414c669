"""Writes for tuning jobs: create and stop. Pages and the API call these; each runs in one
transaction, with an engine tick sent on commit (tuning.engine does the searching)."""

from __future__ import annotations

import difflib
import logging
import secrets

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from jobs.actions import JobError, NotStoppable, check_submission, stop_job
from jobs.models import STOP_REQUESTED, JobStatus
from studio.errors import ActionError
from studio.models import Project
from tuning import ranges
from tuning.models import EndReason, Strategy, TuningJob, TuningStatus

log = logging.getLogger(__name__)


class TuningError(ActionError):
    """Bad input for a tuning job: {field path: message}."""

    def __init__(self, fields: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in fields.items()), fields=fields)


def check_tuning_job(project: Project, data: dict) -> dict:
    """The checks a serializer cannot make (TuningJobCreateSerializer made the others):
    1. a built-in algorithm's tuned names are its hyperparameters, with ranges inside
       their bounds; its objective defaults to the algorithm's and must be a metric it emits;
    2. warm-start jobs are this project's and optimise the same metric;
    3. a grid fits in max_trials (less the grid points warm-start trials already tried);
    4. the base job passes submit_job's own checks with a value of every range filled in.
    Returns `data` with the objective filled in; raises TuningError naming the field."""
    base, tuned = data["base_job"], data["parameter_ranges"]
    objective = data.get("objective")
    algorithm = base.get("algorithm") or ""
    if algorithm:
        objective = _check_algorithm_ranges(algorithm, tuned, objective, base)
    assert objective is not None  # the serializer demands one for a script
    objective = {"metric": objective["metric"], "goal": objective["goal"]}
    sources = _check_warm_start(project, data.get("warm_start_from") or [], objective["metric"])
    if data["strategy"] == Strategy.GRID:
        _check_grid_size(tuned, data["max_trials"], sources)
    sample = {**(base.get("hyperparameters") or {}), **{name: ranges.representative(spec) for name, spec in tuned.items()}}
    try:
        check_submission(project, {**base, "hyperparameters": sample})
    except JobError as exc:
        fields = {}
        for field, message in exc.fields.items():
            name = field.removeprefix("hyperparameters.")
            if field.startswith("hyperparameters.") and name in tuned:
                fields[f"parameter_ranges.{name}"] = f"with {name}={sample[name]!r}: {message}"
            else:
                fields[f"base_job.{field}"] = message
        raise TuningError(fields) from exc
    return {**data, "objective": objective, "warm_start_from": sources}


def _check_algorithm_ranges(algorithm: str, tuned: dict[str, dict], objective: dict | None, base: dict) -> dict:
    from algorithms import ALGORITHMS, get_algorithm
    from algorithms.base import validate_hyperparameters

    spec = get_algorithm(algorithm)
    if spec is None:
        raise TuningError({"base_job.algorithm": f"Unknown algorithm '{algorithm}'; choose one of: "
                                                 f"{', '.join(sorted(ALGORITHMS))}."})
    errors: dict[str, str] = {}
    for name, range_spec in sorted(tuned.items()):
        hyperparameter = spec.hyperparameter(name)
        if hyperparameter is None:
            _, unknown = validate_hyperparameters(spec, {name: None})  # says which names it takes
            errors[f"parameter_ranges.{name}"] = unknown[name]
            continue
        kind = range_spec["type"]
        if kind == "continuous" and hyperparameter.type == "integer":
            errors[f"parameter_ranges.{name}.type"] = (f"{name} is an integer hyperparameter of {algorithm}: use an "
                                                       "integer range.")
            continue
        if kind != "categorical" and hyperparameter.type not in ("integer", "float"):
            errors[f"parameter_ranges.{name}.type"] = (f"{name} is a {hyperparameter.type} hyperparameter of "
                                                       f"{algorithm}: list its values in a categorical range.")
            continue
        checks = [("values", v) for v in range_spec["values"]] if kind == "categorical" else [
            ("min", range_spec["min"]), ("max", range_spec["max"])]
        for field, value in checks:
            try:
                hyperparameter.coerce(value)
            except ValueError as exc:
                errors[f"parameter_ranges.{name}.{field}"] = str(exc)
                break
    if objective is None:
        objective = dict(spec.default_objective)
    emitted = [*spec.metric_names(), *(d["name"] for d in base.get("metric_definitions") or [])]
    if objective["metric"] not in emitted:
        close = difflib.get_close_matches(objective["metric"].replace(":", "_"), emitted, n=1, cutoff=0.7)
        hint = f"did you mean '{close[0]}'?" if close else f"it emits {', '.join(emitted)}"
        errors["objective.metric"] = f"{algorithm} does not emit a metric '{objective['metric']}'; {hint}"
    if errors:
        raise TuningError(errors)
    return objective


def _check_warm_start(project: Project, ids: list[int], metric: str) -> list[TuningJob]:
    found = {t.pk: t for t in TuningJob.objects.filter(project=project, pk__in=ids)}
    missing = [str(pk) for pk in ids if pk not in found]
    if missing:
        raise TuningError({"warm_start_from": f"No tuning job {', '.join(missing)} in project '{project.slug}'."})
    other = [t for t in found.values() if t.metric != metric]
    if other:
        raise TuningError({"warm_start_from": (
            f"Tuning job {other[0].pk} optimised '{other[0].metric}', not '{metric}': its trials' values do not "
            "compare with this search's.")})
    return [found[pk] for pk in ids]


def _check_grid_size(tuned: dict[str, dict], max_trials: int, sources: list[TuningJob]) -> None:
    size = ranges.grid_size(tuned)
    remaining = size
    if sources and size <= ranges.GRID_COUNT_LIMIT:
        names = sorted(tuned)
        tried = {ranges.params_key(params, names)
                 for params in _finished_trial_params(sources)
                 if all(n in params and ranges.fits(tuned[n], params[n]) for n in names)}
        remaining = size - len(tried)
    if remaining > max_trials:
        counts = " × ".join(str(len(ranges.values_of(spec))) if size <= ranges.GRID_COUNT_LIMIT else "…"
                            for _, spec in sorted(tuned.items()))
        shown = f"{size:,}" if size <= ranges.GRID_COUNT_LIMIT else f"more than {ranges.GRID_COUNT_LIMIT:,}"
        already = f", {size - remaining} of them tried by the warm-start jobs" if remaining != size else ""
        raise TuningError({"max_trials": (
            f"The grid has {shown} points ({counts}{already}) but max_trials is {max_trials}: raise max_trials to "
            f"{remaining:,} or try fewer values.")})


def _finished_trial_params(sources: list[TuningJob]) -> list[dict]:
    from jobs.models import FINISHED_STATUSES, TrainingJob

    return list(TrainingJob.objects.filter(tuning_job__in=sources, status__in=FINISHED_STATUSES)
                .values_list("trial_params", flat=True))


def create_tuning_job(*, project: Project, user: User, data: dict) -> TuningJob:
    """1. Check what the serializer could not (check_tuning_job).
    2. Create the tuning job (InProgress), in one transaction.
    3. On commit, an engine tick asks for its first trials."""
    data = check_tuning_job(project, data)
    base = {k: v for k, v in data["base_job"].items() if k not in ("project", "name")}
    tuned = data["parameter_ranges"]
    # The tuned values come from the ranges; a base value for one would only confuse.
    base["hyperparameters"] = {k: v for k, v in (base.get("hyperparameters") or {}).items() if k not in tuned}
    seed = data.get("seed")
    with transaction.atomic():
        tuning = TuningJob.objects.create(
            project=project, name=data["name"], base_job=base, parameter_ranges=tuned, objective=data["objective"],
            strategy=data["strategy"], max_trials=data["max_trials"], max_parallel=data["max_parallel"],
            early_stopping=data["early_stopping"], target_value=data.get("target_value"),
            max_runtime_seconds=data.get("max_runtime_seconds"),
            seed=seed if seed is not None else secrets.randbelow(2**31), created_by=user, started_at=timezone.now())
        tuning.warm_start_from.set(data["warm_start_from"])
        transaction.on_commit(lambda: advance_soon(tuning.pk))
    return tuning


def stop_tuning_job(tuning: TuningJob) -> TuningJob:
    """Stop the search: no more trials; pending trials stop at once, running ones are asked
    to stop; the search is Stopping until they have ended, then Stopped. Asking again, or
    while the search is already ending for another reason, changes nothing."""
    from tuning.engine import Search

    with transaction.atomic():
        locked = TuningJob.objects.select_for_update(of=("self",)).select_related("project", "created_by").get(
            pk=tuning.pk)
        if locked.is_finished():
            raise NotStoppable(f"The tuning job is {locked.status}; only a running tuning job can be stopped.")
        if locked.status == TuningStatus.IN_PROGRESS:
            TuningJob.objects.filter(pk=locked.pk).update(status=TuningStatus.STOPPING,
                                                          end_reason=EndReason.STOP_REQUESTED)
            locked.status, locked.end_reason = TuningStatus.STOPPING, EndReason.STOP_REQUESTED
            for trial in locked.trials.filter(status__in=[JobStatus.PENDING, JobStatus.STARTING, JobStatus.TRAINING]):
                try:
                    stop_job(trial, reason=STOP_REQUESTED, message=f"Stopped: tuning job #{locked.pk} was stopped")
                except NotStoppable:
                    continue  # it ended meanwhile
            # Ends it now when nothing was running (pending trials stop at once).
            Search(locked).advance()
        transaction.on_commit(lambda: advance_soon(locked.pk))
    tuning.refresh_from_db()
    return tuning


def advance_soon(tuning_job_id: int) -> None:
    from tuning.tasks import advance_tuning_jobs_task

    try:
        advance_tuning_jobs_task.delay(tuning_job_id)
    except Exception:  # noqa: BLE001 - the periodic tick advances it anyway
        log.warning("could not send a tuning tick; the periodic one will advance job %s", tuning_job_id, exc_info=True)
