"""The tuning form's fixed fields, and what "Tune this" proposes from a finished job.

Like the job form, it only renders: the browser sends the values as JSON to
POST /api/v1/tuning-jobs/ (static/js/tuning_form.js), whose serializer validates them, so
the page and the API never disagree. The base job's hyperparameters, channels and the
ranges editor are generated in the browser from the algorithm's schema."""

from __future__ import annotations

import math
from typing import Any

from django import forms

from jobs.models import TrainingJob
from jobs.serializers import MAX_RUNTIME_LIMIT
from studio.models import Project

STRATEGIES = [
    ("bayesian", "Bayesian (TPE)"),
    ("random", "Random search"),
    ("grid", "Grid search"),
    ("hyperband", "Hyperband"),
]
STRATEGY_HELP = {
    "bayesian": "Learns from finished trials which regions score well and samples more there (Optuna's TPE).",
    "random": "Every trial draws its values independently: a strong baseline, and trivially parallel.",
    "grid": "Tries every combination; continuous ranges need to be few. The grid must fit in max trials.",
    "hyperband": "Starts many trials and keeps training only the promising ones (needs intermediate values).",
}
EARLY_STOPPING = [
    ("off", "Off"),
    ("median", "Median rule"),
    ("hyperband", "Hyperband"),
]
EARLY_STOPPING_HELP = {
    "off": "Every trial trains to the end.",
    "median": "A trial whose objective so far is worse than the median of earlier trials at the same step is stopped.",
    "hyperband": "Successive halving: at each rung only the best share of trials keeps training.",
}
DEFAULT_MAX_TRIALS = 20
DEFAULT_MAX_PARALLEL = 2
# Hyperparameters "Tune this" does not propose: bookkeeping (seed, logging), the training
# budget (epochs, steps: early stopping decides that) and data limits (max_*, min_*).
NOT_PROPOSED = frozenset({"seed", "epochs", "max_steps", "log_every_steps"})
NOT_PROPOSED_PREFIXES = ("max_", "min_")


class TuningForm(forms.Form):
    project = forms.ChoiceField(help_text="Projects where you are a scientist or an admin.")
    name = forms.CharField(max_length=200, help_text="Each trial is a training job named after it, with its number.",
                           widget=forms.TextInput(attrs={"autocomplete": "off", "spellcheck": "false"}))
    algorithm = forms.ChoiceField(required=False)
    instance_type = forms.ChoiceField(label="Instance type", help_text="The node queue every trial runs on.")
    trial_max_runtime_seconds = forms.IntegerField(
        label="Max runtime per trial (seconds)", min_value=1, max_value=MAX_RUNTIME_LIMIT, required=False,
        help_text="A trial is stopped (MaxRuntimeExceeded) after this long.",
        widget=forms.NumberInput(attrs={"placeholder": "no limit"}))
    objective_goal = forms.ChoiceField(label="Goal", choices=[("maximize", "Maximize"), ("minimize", "Minimize")])
    strategy = forms.ChoiceField(choices=STRATEGIES, initial="bayesian")
    max_trials = forms.IntegerField(label="Max trials", min_value=1, max_value=10_000, initial=DEFAULT_MAX_TRIALS,
                                    help_text="The search ends after this many trials.")
    max_parallel = forms.IntegerField(label="Trials at once", min_value=1, max_value=256, initial=DEFAULT_MAX_PARALLEL,
                                      help_text="At most this many trials train at the same time.")
    early_stopping = forms.ChoiceField(label="Early stopping", choices=EARLY_STOPPING, initial="off")
    target_value = forms.FloatField(label="Target value", required=False,
                                    help_text="Stop the search once a trial reaches it.",
                                    widget=forms.NumberInput(attrs={"step": "any", "placeholder": "none"}))
    max_runtime_seconds = forms.IntegerField(label="Max runtime of the search (seconds)", min_value=1, required=False,
                                             help_text="No new trial starts after this long; running ones are stopped.",
                                             widget=forms.NumberInput(attrs={"placeholder": "no limit"}))

    def __init__(self, *args: Any, projects: list[Project], algorithms: dict, instance_types: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        project, algorithm, instance_type = self.fields["project"], self.fields["algorithm"], self.fields["instance_type"]
        assert isinstance(project, forms.ChoiceField) and isinstance(algorithm, forms.ChoiceField)
        assert isinstance(instance_type, forms.ChoiceField)
        project.choices = [(p.slug, f"{p.name} ({p.slug})" if p.name != p.slug else p.slug) for p in projects]
        algorithm.choices = [(name, f"{spec.title} ({name})") for name, spec in algorithms.items()]
        wanted = self.initial.get("instance_type")
        types = list(instance_types) + ([wanted] if wanted and wanted not in instance_types else [])
        instance_type.choices = [(t, t) for t in types]


# --- "Tune this": a finished job's settings, with ranges around its values ---------------------
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _round(value: float) -> float:
    """4 significant digits: 0.0003 rather than 0.00030000000000000003."""
    return float(f"{value:.4g}")


def _within(value: float, low: float | None, high: float | None) -> float:
    if low is not None:
        value = max(value, low)
    if high is not None:
        value = min(value, high)
    return value


def propose_range(name: str, kind: str, value: Any, low: float | None = None, high: float | None = None) -> dict | None:
    """A search range around a job's value, inside the schema's bounds: a positive float
    gets a log range ×0.1..×10, an integer ×0.5..×2. None where nothing sensible fits (a
    zero float, a value at a bound that leaves no room, a non-number)."""
    number = _number(value)
    if number is None or name in NOT_PROPOSED or name.startswith(NOT_PROPOSED_PREFIXES):
        return None
    if kind == "float":
        if number <= 0:
            return None
        lo, hi = _within(number / 10, low, high), _within(number * 10, low, high)
        if lo <= 0 or lo >= hi:
            return None
        return {"type": "continuous", "min": _round(lo), "max": _round(hi), "scale": "log"}
    if kind == "integer":
        whole = int(number)
        lo_int = int(_within(whole // 2, low, high))
        hi_int = int(_within(max(whole * 2, whole + 1), low, high))
        if lo_int >= hi_int:
            return None
        return {"type": "integer", "min": lo_int, "max": hi_int, "scale": "linear"}
    return None


def proposed_ranges(job: TrainingJob) -> dict[str, dict]:
    """Ranges for the job's numeric hyperparameters. A built-in algorithm's schema gives
    each one's type and bounds (a categorical integer, like image channels, is left alone);
    a script's hyperparameters are typed by their values."""
    from algorithms import get_algorithm

    values = dict(job.hyperparameters or {})
    spec = get_algorithm(job.algorithm) if job.algorithm else None
    ranges: dict[str, dict] = {}
    if spec is not None:
        for hp in spec.hyperparameters:
            if hp.choices or hp.type not in ("integer", "float"):
                continue
            proposal = propose_range(hp.name, hp.type, values.get(hp.name, hp.default), hp.min, hp.max)
            if proposal:
                ranges[hp.name] = proposal
        return ranges
    for name, value in sorted(values.items()):
        kind = "integer" if isinstance(value, int) and not isinstance(value, bool) else "float"
        proposal = propose_range(name, kind, value)
        if proposal:
            ranges[name] = proposal
    return ranges


def base_job_of(job: TrainingJob, tuned: set[str]) -> dict[str, Any]:
    """The job's submission (as_submission) as a tuning job's base job: without the tuned
    hyperparameters, the name and the project (the tuning job gives those), the checkpoint
    URI (trials sharing one would resume from each other's checkpoints) and the settings
    left empty."""
    base = job.as_submission()
    del base["project"], base["name"]
    base["hyperparameters"] = {k: v for k, v in sorted(base["hyperparameters"].items()) if k not in tuned}
    base["resources"] = {k: v for k, v in base["resources"].items() if v is not None}
    base["stopping"] = {k: v for k, v in base["stopping"].items() if v}
    if job.algorithm:
        del base["script"], base["metric_definitions"]
    else:
        del base["algorithm"]
    if not base["pipeline"]:
        del base["pipeline"]
    every = (base.pop("checkpoint") or {}).get("every_steps")
    if every:
        base["checkpoint"] = {"every_steps": every}
    return base


def objective_of(job: TrainingJob) -> dict[str, str]:
    """The algorithm's default objective; for a script, its first validation metric
    (maximized when it reads like an accuracy, minimized otherwise)."""
    from algorithms import get_algorithm

    spec = get_algorithm(job.algorithm) if job.algorithm else None
    if spec is not None:
        return dict(spec.default_objective)
    names = [str(d.get("name")) for d in job.metric_definitions or [] if isinstance(d, dict) and d.get("name")]
    names += [name for name in (job.final_metrics or {}) if name not in names]
    if not names:
        return {"metric": "", "goal": "maximize"}
    metric = next((n for n in names if n.startswith("validation")), names[0])
    goal = "minimize" if "loss" in metric.lower() or "error" in metric.lower() else "maximize"
    return {"metric": metric, "goal": goal}


def from_job_prefill(job: TrainingJob) -> dict[str, Any]:
    """What the form's script pre-fills from a finished job (?from_job=<id>)."""
    ranges = proposed_ranges(job)
    return {
        "job": {"id": job.pk, "name": job.name, "algorithm": job.algorithm,
                "script": {"uri": job.script_uri, "entry_point": job.entry_point} if job.script_uri else None,
                "hyperparameters": dict(job.hyperparameters or {})},
        "base_job": base_job_of(job, set(ranges)),
        "parameter_ranges": ranges,
        "objective": objective_of(job),
    }


def from_job_initial(job: TrainingJob, writable_slugs: list[str]) -> dict[str, Any]:
    """The fixed fields: the job's project when the user may write there."""
    objective = objective_of(job)
    return {
        "project": job.project.slug if job.project.slug in writable_slugs else writable_slugs[0],
        "name": f"{job.name}-tuning"[:200],
        "algorithm": job.algorithm,
        "instance_type": job.instance_type,
        "trial_max_runtime_seconds": job.max_runtime_seconds,
        "objective_goal": objective["goal"],
    }
