"""What a tuning job's page shows about its trials: parameter importances (Optuna's
PED-ANOVA evaluator) and the data of its three charts.

Reads only: the trials are TrainingJobs with `tuning_job`, `trial_number`, `trial_params`,
`objective_value` and `intermediate_values`; nothing here writes to the database."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeGuard

from jobs.models import PRUNED_STOP_REASONS

if TYPE_CHECKING:
    from jobs.models import TrainingJob
    from tuning.models import TuningJob

COMPLETED = "Completed"
MIN_TRIALS_FOR_IMPORTANCE = 2
STEADY_IMPORTANCE_TRIALS = 10  # fewer completed trials: the page says the importances are a rough hint
STUDY_PREFIX = "trainyard-page-importances-"
TRIAL_FIELDS = ("id", "name", "status", "stop_reason", "stop_rule", "trial_number", "trial_params", "objective_value",
                "intermediate_values", "started_at", "finished_at", "tuning_job_id")


class _QuietPageStudies(logging.Filter):
    """Optuna's in-memory storage logs "A new study created" at INFO for every study; the
    throwaway studies of page views would fill the server log. Only those are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return STUDY_PREFIX not in record.getMessage()


_in_memory_log = logging.getLogger("optuna.storages._in_memory")
if not any(isinstance(f, _QuietPageStudies) for f in _in_memory_log.filters):
    _in_memory_log.addFilter(_QuietPageStudies())


class TrialPoint(TypedDict):
    id: int
    number: int
    status: str  # as the page shows it: a pruned trial reads "Pruned"
    value: float | None  # the objective, or a pruned trial's last reported value
    reported: bool  # value is an intermediate value (a pruned or running trial), not the final objective
    params: dict[str, Any]


class Dimension(TypedDict, total=False):
    label: str
    values: list[float]
    range: list[float]
    tickvals: list[float]
    ticktext: list[str]


class ChartData(TypedDict):
    objective: dict[str, str]
    trials: list[TrialPoint]
    best_so_far: list[list[float]]  # [[trial number, best value up to it], ...], completed trials only
    parcoords: dict[str, Any]  # {"dimensions": [...], "color": [...], "trials": [numbers]}
    importances: dict[str, float]


def shown_status(trial: TrainingJob) -> str:
    """A trial's status as people read it: a trial stopped by the pruner or by one of its
    rules (stop_reason EarlyStopped or RuleTriggered) is "Pruned"."""
    if trial.status == "Stopped" and trial.stop_reason in PRUNED_STOP_REASONS:
        return "Pruned"
    return trial.status


def goal_of(tuning_job: TuningJob) -> Literal["maximize", "minimize"]:
    return "minimize" if (tuning_job.objective or {}).get("goal") == "minimize" else "maximize"


def last_reported(intermediate: dict | None) -> float | None:
    """The intermediate value at the highest step ({"120": 0.81, ...}; keys are JSON strings)."""
    best_step, value = None, None
    for step, reported in (intermediate or {}).items():
        try:
            number = float(step)
        except (TypeError, ValueError):
            continue
        if _finite(reported) and (best_step is None or number > best_step):
            best_step, value = number, float(reported)
    return value


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _trials(tuning_job: TuningJob) -> list[TrainingJob]:
    return list(tuning_job.trials.only(*TRIAL_FIELDS).order_by("trial_number", "pk"))


def _completed(trials: list[TrainingJob]) -> list[TrainingJob]:
    return [t for t in trials if t.status == COMPLETED and _finite(t.objective_value)]


# --- importances ----------------------------------------------------------------------------
def _distribution(spec: dict[str, Any]) -> Any:
    """The Optuna distribution of one range (tuning.ranges); None for one it cannot express
    (a row written by hand, not through the API's checks)."""
    from tuning.ranges import distribution

    try:
        return distribution(spec)
    except (KeyError, TypeError, ValueError):
        return None


def param_importances(tuning_job: TuningJob, trials: list[TrainingJob] | None = None) -> dict[str, float]:
    """{parameter: importance}, summing to 1, most important first, from the completed
    trials (Optuna's PED-ANOVA, which needs no scikit-learn). {} with fewer than two
    completed trials or no parameter.

    1. Rebuild the search as an in-memory Optuna study: one distribution per range, one
       finished trial per completed TrainingJob (a trial whose values fall outside the
       ranges, or lack one, is left out rather than failing the page).
    2. Ask the evaluator for the importance of reaching the best trials."""
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    distributions = {name: dist for name, spec in (tuning_job.parameter_ranges or {}).items()
                     if isinstance(spec, dict) and (dist := _distribution(spec)) is not None}
    completed = _completed(trials if trials is not None else _trials(tuning_job))
    if not distributions or len(completed) < MIN_TRIALS_FOR_IMPORTANCE:
        return {}
    study = optuna.create_study(direction=goal_of(tuning_job), study_name=f"{STUDY_PREFIX}{tuning_job.pk}")
    added = 0
    for trial in completed:
        params = trial.trial_params or {}
        if set(distributions) - set(params):
            continue
        try:
            study.add_trial(optuna.trial.create_trial(
                params={name: params[name] for name in distributions}, distributions=distributions,
                value=float(trial.objective_value)))  # type: ignore[arg-type]
        except ValueError:  # a value outside its range (a hand-edited row): leave the trial out
            continue
        added += 1
    if added < MIN_TRIALS_FOR_IMPORTANCE:
        return {}
    # PED-ANOVA compares the top `target_quantile` of trials with all of them; its 10 %
    # default leaves one trial of a 10-trial search, too few for its density estimate. Aim
    # for about five trials in the top group, between 10 % and half of them.
    quantile = min(0.5, max(0.1, 5 / added))
    importances = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(target_quantile=quantile),
                                        params=list(distributions))
    return {name: float(value) for name, value in sorted(importances.items(), key=lambda item: -item[1])}


# --- charts ---------------------------------------------------------------------------------
def best_so_far(completed: list[TrainingJob], goal: str) -> list[list[float]]:
    """The running best of the completed trials, in trial order: the staircase a search draws."""
    pick = min if goal == "minimize" else max
    line: list[list[float]] = []
    best: float | None = None
    for trial in sorted(completed, key=lambda t: (t.trial_number or 0, t.pk)):
        value = float(trial.objective_value)  # type: ignore[arg-type]
        best = value if best is None else pick(best, value)
        line.append([trial.trial_number or 0, best])
    return line


def _ticks(low: float, high: float) -> list[float]:
    """Decades between two log10 positions, or the two ends when the range spans less."""
    decades = [float(p) for p in range(math.ceil(low), math.floor(high) + 1)]
    return decades if len(decades) >= 2 else [low, high]


def _tick_text(value: float) -> str:
    return f"{value:.3g}"


def parameter_dimension(name: str, spec: dict[str, Any], values: list[Any]) -> Dimension | None:
    """One parcoords axis. Log ranges are drawn in log10 with ticks labelled in the real
    values (parcoords has no log axis); categorical values become positions 0..n-1 with
    the values as tick labels."""
    kind = spec.get("type")
    if kind == "categorical":
        choices = list(spec.get("values") or [])
        labels = [str(choice) for choice in choices]
        positions = []
        for value in values:
            if value in choices:
                positions.append(float(choices.index(value)))
            elif str(value) in labels:
                positions.append(float(labels.index(str(value))))
            else:
                return None
        top = max(len(choices) - 1, 1)
        return {"label": name, "values": positions, "range": [0.0, float(top)],
                "tickvals": [float(i) for i in range(len(choices))], "ticktext": labels}
    if kind not in ("continuous", "integer") or not all(_finite(v) for v in values):
        return None
    try:
        low, high = float(spec["min"]), float(spec["max"])
    except (KeyError, TypeError, ValueError):
        low, high = min(values, default=0.0), max(values, default=1.0)
    if spec.get("scale") == "log" and low > 0 and all(v > 0 for v in values):
        low_log, high_log = math.log10(low), math.log10(high)
        ticks = _ticks(low_log, high_log)
        return {"label": f"{name} (log)", "values": [math.log10(v) for v in values], "range": [low_log, high_log],
                "tickvals": ticks, "ticktext": [_tick_text(10 ** t) for t in ticks]}
    return {"label": name, "values": [float(v) for v in values], "range": [low, high]}


def parallel_coordinates(tuning_job: TuningJob, completed: list[TrainingJob]) -> dict[str, Any]:
    """One axis per tuned hyperparameter, then the objective; one line per completed trial
    that has every parameter."""
    # By name: PostgreSQL's jsonb does not keep the order the ranges were written in.
    ranges = {name: spec for name, spec in sorted((tuning_job.parameter_ranges or {}).items()) if isinstance(spec, dict)}
    rows = [t for t in completed if set(ranges) <= set(t.trial_params or {})]
    dimensions: list[Dimension] = []
    for name, spec in ranges.items():
        dimension = parameter_dimension(name, spec, [(t.trial_params or {})[name] for t in rows])
        if dimension is not None:
            dimensions.append(dimension)
    objective = [float(t.objective_value) for t in rows]  # type: ignore[arg-type]
    if rows:
        metric = (tuning_job.objective or {}).get("metric", "objective")
        low, high = min(objective), max(objective)
        if low == high:  # one value: a narrow band around it (Plotly's own pad is ±1, whatever the scale)
            pad = abs(low) * 0.05 or 0.05
            low, high = low - pad, high + pad
        dimensions.append({"label": str(metric), "values": objective, "range": [low, high]})
    return {"dimensions": dimensions if rows else [], "color": objective, "trials": [t.trial_number for t in rows]}


def trial_point(trial: TrainingJob) -> TrialPoint:
    final = float(trial.objective_value) if _finite(trial.objective_value) else None
    reported = final is None
    return {
        "id": trial.pk,
        "number": trial.trial_number or 0,
        "status": shown_status(trial),
        "value": final if final is not None else last_reported(trial.intermediate_values),
        "reported": reported,
        "params": dict(trial.trial_params or {}),
    }


def chart_data(tuning_job: TuningJob, trials: list[TrainingJob] | None = None) -> ChartData:
    """Everything the detail page's charts draw, from one read of the trials."""
    trials = trials if trials is not None else _trials(tuning_job)
    completed = _completed(trials)
    goal = goal_of(tuning_job)
    objective = tuning_job.objective or {}
    return {
        "objective": {"metric": str(objective.get("metric", "")), "goal": goal},
        "trials": [trial_point(t) for t in trials],
        "best_so_far": best_so_far(completed, goal),
        "parcoords": parallel_coordinates(tuning_job, completed),
        "importances": param_importances(tuning_job, trials),
    }
