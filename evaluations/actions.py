"""What changes evaluations, and what an evaluation changes (docs/SPEC.md §9):

- submit_evaluation: a Pending row, checked before anything runs (the data is the project's
  and ready, the model and the data share a label, the calibration part can hold the bound),
  enqueued on commit;
- propose: a new threshold proposal from the stored scores (another target, other costs);
- calibrate_model_version: the model version serves calibrated confidences from then on;
- activate_flow: a flow routes at the proposal's threshold and records where it came from.

Each raises EvaluationError (a 400 naming the field, or a 409) and writes nothing then.
"""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from datasets.models import DatasetVersion, VersionStatus
from evaluations.models import Evaluation, EvaluationStatus
from hosting.actions import HostingError, dataset_version_in_project, resolve_model_version
from hosting.models import ModelKind, ModelVersion
from review.models import FlowDefinition, TaskType
from studio.errors import FieldError
from studio.models import Project
from trainyard.records import CHANNEL_ALIASES

log = logging.getLogger(__name__)

DEFAULT_TARGET_ERROR = 0.05
DEFAULT_DELTA = 0.05
DEFAULT_CALIBRATION_FRACTION = 0.5
ISOTONIC_MIN_ITEMS = 1000
FORMATS = {ModelKind.TABULAR: ("csv", "jsonl"), ModelKind.TEXT: ("csv", "jsonl"), ModelKind.IMAGE: ("image_folder",),
           ModelKind.GENERATIVE: ("text",)}
OPTION_KEYS = ("target_error", "delta", "flow_definition", "review_cost", "error_cost", "sample_rate", "task_count",
               "calibrated")


class EvaluationError(FieldError):
    """A request the evaluations app refuses; `field` names the input at fault."""

    def envelope_message(self) -> str:
        return f"{self.field}: {self.message}"


# --- checking inputs ---------------------------------------------------------------------------
def _number(value: Any, field: str, *, low: float, high: float, low_open: bool = True, high_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise EvaluationError(field, "Must be a number.")
    try:
        number = float(value)
    except ValueError:
        raise EvaluationError(field, "Must be a number.") from None
    below = number <= low if low_open else number < low
    above = number >= high if high_open else number > high
    if not math.isfinite(number) or below or above:
        left, right = ("(" if low_open else "["), (")" if high_open else "]")
        raise EvaluationError(field, f"Must be in {left}{low:g}, {high:g}{right}, got {value!r}.")
    return number


def flow_in_project(project: Project, flow: Any, *, field: str = "flow_definition") -> FlowDefinition:
    if isinstance(flow, FlowDefinition):
        found: FlowDefinition | None = flow
    else:
        try:
            found = FlowDefinition.objects.filter(pk=int(flow), project=project).first()
        except (TypeError, ValueError):
            raise EvaluationError(field, "Give the id of a flow definition.") from None
    if found is None or found.project_id != project.pk:
        raise EvaluationError(field, f"No flow definition with that id in project '{project.slug}'.")
    if found.task_type != TaskType.CLASSIFICATION:
        raise EvaluationError(field, f"Flow '{found.name}' collects free text: a confidence threshold routes "
                                     "classification flows only.")
    return found


def check_proposal_options(project: Project, raw: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """The proposal's inputs, checked, over `base` (an evaluation's stored options):
    target_error r* in (0, 0.5]; delta in (0, 1); a flow of the project, whose task_count and
    audit sample rate are then used unless given; costs ≥ 0 (both or neither)."""
    options = {**(base or {})}
    options.setdefault("target_error", DEFAULT_TARGET_ERROR)
    options.setdefault("delta", DEFAULT_DELTA)
    options.setdefault("calibrated", True)
    if raw.get("target_error") is not None:
        options["target_error"] = _number(raw["target_error"], "target_error", low=0, high=0.5)
    if raw.get("delta") is not None:
        options["delta"] = _number(raw["delta"], "delta", low=0, high=1, high_open=True)
    if raw.get("calibrated") is not None:
        if not isinstance(raw["calibrated"], bool):
            raise EvaluationError("calibrated", "Must be true or false.")
        options["calibrated"] = raw["calibrated"]
    if "flow_definition" in raw:
        options["flow_definition"] = flow_in_project(project, raw["flow_definition"]).pk if raw["flow_definition"] else None
    for name in ("review_cost", "error_cost"):
        if name in raw:
            options[name] = None if raw[name] in (None, "") else _number(raw[name], name, low=0, high=1e12, low_open=False)
    if "sample_rate" in raw and raw["sample_rate"] is not None:
        options["sample_rate"] = _number(raw["sample_rate"], "sample_rate", low=0, high=1, low_open=False, high_open=True)
    if "task_count" in raw and raw["task_count"] is not None:
        value = raw["task_count"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
            raise EvaluationError("task_count", "Must be a whole number from 1 to 100.")
        options["task_count"] = value
    if (options.get("review_cost") is None) != (options.get("error_cost") is None):
        missing = "error_cost" if options.get("error_cost") is None else "review_cost"
        raise EvaluationError(missing, "Give both review_cost (per review task) and error_cost (per wrong "
                                       "auto-accepted item), or neither.")
    unknown = sorted(set(raw) - set(OPTION_KEYS) - {"project", "model", "model_version", "dataset_version", "channel",
                                                    "calibration_fraction", "seed", "evaluation", "choice"})
    if unknown:
        raise EvaluationError(unknown[0], f"Unknown field; the fields are {', '.join(OPTION_KEYS)}.")
    return options


def flow_routing(options: dict[str, Any]) -> dict[str, Any]:
    """The proposal's view of its flow: the current threshold, task_count k and audit sample
    rate s (the flow's, unless the options give them), the flow's name."""
    flow_id = options.get("flow_definition")
    flow = FlowDefinition.objects.filter(pk=int(flow_id)).first() if flow_id else None
    activation = (flow.activation or {}) if flow else {}
    combine_any = activation.get("combine", "any") == "any"
    sample = float(activation.get("sample_percent") or 0) / 100 if combine_any else 0.0
    return {"flow": {"id": flow.pk, "name": flow.name} if flow else None,
            "current": activation.get("confidence_below") if flow else None,
            "task_count": options.get("task_count") or (flow.task_count if flow else 1),
            "sample_rate": options["sample_rate"] if options.get("sample_rate") is not None else sample}


def _model_version(project: Project, body: dict[str, Any]) -> ModelVersion:
    if body.get("model") not in (None, ""):
        return resolve_model_version(project, body["model"], body.get("model_version"))
    value = body.get("model_version")
    if value in (None, ""):
        raise EvaluationError("model_version", "This field is required.")
    try:
        found = ModelVersion.objects.select_related("model").filter(pk=int(value), model__project=project).first()
    except (TypeError, ValueError):
        raise EvaluationError("model_version", "Give the id of a model version.") from None
    if found is None:
        raise EvaluationError("model_version", f"No model version with that id in project '{project.slug}'.")
    return found


def _channel(dataset_version: DatasetVersion, value: Any) -> tuple[str, int]:
    """(the channel, how many records it holds)."""
    counts = {str(k): int(v) for k, v in (dataset_version.channel_counts or {}).items() if v}
    if value in (None, ""):
        return "", int(dataset_version.num_records or sum(counts.values()))
    if not isinstance(value, str) or value.lower() not in CHANNEL_ALIASES:
        raise EvaluationError("channel", "Must be train, validation or test (or left out for every record).")
    channel = CHANNEL_ALIASES[value.lower()]
    if not counts.get(channel):
        have = ", ".join(f"{name} ({count})" for name, count in sorted(counts.items())) or "none"
        raise EvaluationError("channel", f"{dataset_version.dataset.name} v{dataset_version.version} has no {channel} "
                                         f"records (its channels: {have}); leave channel out to evaluate every record.")
    return channel, counts[channel]


def _labels_in_common(version: ModelVersion, dataset_version: DatasetVersion) -> None:
    classes = (dataset_version.schema or {}).get("classes") or {}
    if version.kind == ModelKind.GENERATIVE or not classes or not version.labels:
        return  # nothing known before reading the records; the run checks every record
    if not set(map(str, classes)) & set(map(str, version.labels)):
        raise EvaluationError(
            "dataset_version", f"{dataset_version.dataset.name} v{dataset_version.version} and model "
            f"{version.model.name} v{version.version} have no label in common: the data's labels are "
            f"{_few(classes)}, the model's are {_few(version.labels)}.")


def _few(values: Any) -> str:
    names = sorted(map(str, values))
    return ", ".join(names[:8]) + (f", … ({len(names)} in all)" if len(names) > 8 else "")


def min_calibration_items(options: dict[str, Any]) -> int:
    """The fewest calibration items whose zero-error bound meets the target, with the
    search's own union correction (⌈log2 n⌉ candidates, which grows with n)."""
    from trainyard.evaluation import min_items_for_bound

    needed = min_items_for_bound(options["target_error"], options["delta"], 1)
    while True:
        searched = max(1, math.ceil(math.log2(needed))) if needed > 1 else 1
        more = min_items_for_bound(options["target_error"], options["delta"], searched)
        if more <= needed:
            return int(needed)
        needed = more


# --- submitting --------------------------------------------------------------------------------
def submit_evaluation(*, project: Project, body: dict[str, Any], user=None) -> Evaluation:
    """A Pending evaluation, checked, enqueued once the row is committed."""
    version = _model_version(project, body)
    if body.get("dataset_version") in (None, ""):
        raise EvaluationError("dataset_version", "This field is required.")
    try:
        dataset_version = dataset_version_in_project(project, body["dataset_version"])
    except HostingError as exc:
        raise EvaluationError("dataset_version", exc.message) from None
    if dataset_version.status != VersionStatus.READY:
        raise EvaluationError("dataset_version", f"dataset version {dataset_version.pk} is {dataset_version.status}, "
                                                 "not ready: wait for its validation to finish")
    formats = FORMATS.get(ModelKind(version.kind), ())
    if dataset_version.format not in formats:
        raise EvaluationError("dataset_version", f"a {version.kind} model reads {' or '.join(formats)} data; "
                                                 f"{dataset_version.dataset.name} v{dataset_version.version} is "
                                                 f"{dataset_version.format}")
    channel, records = _channel(dataset_version, body.get("channel"))
    _labels_in_common(version, dataset_version)
    fraction = DEFAULT_CALIBRATION_FRACTION
    if body.get("calibration_fraction") is not None:
        fraction = _number(body["calibration_fraction"], "calibration_fraction", low=0, high=1, high_open=True)
    seed = body.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) > 2**31 - 1:
        raise EvaluationError("seed", "Must be a whole number.")
    options = check_proposal_options(project, body)
    if version.kind != ModelKind.GENERATIVE:
        needed = min_calibration_items(options)
        expected = int(records * fraction)
        if expected < needed:
            message = (f"The calibration part would hold about {expected} of the {records} records; a bound of "
                       f"{options['target_error']:.1%} on the auto-accepted error at δ={options['delta']:g} needs at "
                       f"least {needed} even with no error among them. Use more data, a larger calibration_fraction "
                       "or a looser target_error.")
            error = EvaluationError("calibration_fraction", message)
            error.fields["target_error"] = message  # either change fixes it
            raise error
    with transaction.atomic():
        evaluation = Evaluation.objects.create(
            project=project, model_version=version, dataset_version=dataset_version, channel=channel,
            calibration_fraction=fraction, seed=seed, options=options, kind=version.kind, labels=list(version.labels),
            records_total=records, created_by=user)
        transaction.on_commit(lambda: enqueue_evaluation(evaluation.pk))
    return evaluation


def enqueue_evaluation(pk: int) -> None:
    """Send it to a control worker. A broker outage leaves the row Pending (logged); the
    beat's requeue sends it again, so submitting never fails after commit."""
    from evaluations.tasks import run_evaluation_task

    try:
        run_evaluation_task.delay(pk)
    except Exception:  # noqa: BLE001 - kombu raises many kinds; the beat task retries
        log.exception("could not enqueue evaluation %s; it stays Pending until the next requeue", pk)


def requeue_stalled_evaluations(stale_seconds: int = 120) -> list[int]:
    """Running ones whose worker stopped beating, and Pending ones nobody picked up, back
    to Pending and enqueued (beat, every 30 s). The run restarts from the first record:
    it writes nothing but its own row and artifacts, so a rerun is harmless."""
    now = timezone.now()
    cutoff = now - timedelta(seconds=stale_seconds)
    stale = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, created_at__lt=cutoff)
    requeued = []
    for pk, status in list(Evaluation.objects.unfinished().filter(stale).values_list("pk", "status")):
        if Evaluation.objects.filter(pk=pk, status=status).filter(stale).update(status=EvaluationStatus.PENDING,
                                                                               heartbeat_at=now):
            requeued.append(pk)
            enqueue_evaluation(pk)
    return requeued


# --- proposals ---------------------------------------------------------------------------------
def _completed(evaluation: Evaluation, field: str = "evaluation") -> None:
    if evaluation.status != EvaluationStatus.COMPLETED:
        raise EvaluationError(field, f"Evaluation {evaluation.pk} is {evaluation.status}: only a completed one has "
                                     "figures to use.", status=409)
    if evaluation.kind == ModelKind.GENERATIVE:
        raise EvaluationError(field, f"Evaluation {evaluation.pk} is of a char-lm model: it has no confidences.")


def propose(evaluation: Evaluation, raw: dict[str, Any]) -> dict[str, Any]:
    """A new proposal from the stored scores; stored on the evaluation (the latest wins)."""
    from evaluations.run import proposal_from_scores

    _completed(evaluation)
    options = check_proposal_options(evaluation.project, raw, base=evaluation.options)
    try:
        proposal = proposal_from_scores(evaluation, options)
    except ValueError as exc:
        field, _, message = str(exc).partition(": ")
        raise EvaluationError(field if message else "target_error", message or str(exc)) from None
    Evaluation.objects.filter(pk=evaluation.pk).update(options=options, proposal=proposal)
    evaluation.options, evaluation.proposal = options, proposal
    return proposal


# --- calibration -------------------------------------------------------------------------------
def calibrate_model_version(version: ModelVersion, raw: dict[str, Any], user=None) -> ModelVersion:
    """The version serves calibrated confidences from now on: the evaluation's temperature
    (or, with ≥ 1,000 calibration items, its isotonic fit when method is "isotonic");
    method "none" goes back to the model's own softmax."""
    method = raw.get("method", "temperature")
    if method not in ("temperature", "isotonic", "none"):
        raise EvaluationError("method", "Must be \"temperature\", \"isotonic\" or \"none\".")
    if method == "none":
        calibration: dict[str, Any] = {}
    else:
        evaluation = evaluation_of_project(version.model.project, raw.get("evaluation"))
        _completed(evaluation)
        if evaluation.model_version_id != version.pk:
            raise EvaluationError("evaluation", f"Evaluation {evaluation.pk} is of model version "
                                                f"{evaluation.model_version_id}, not {version.pk}: a temperature fits "
                                                "the model it was fitted on.")
        fitted = evaluation.calibration or {}
        calibration = {"method": method, "evaluation": evaluation.pk, "set_at": timezone.now().isoformat(),
                       "set_by": getattr(user, "username", None)}
        if method == "temperature":
            calibration["temperature"] = fitted["temperature"]
        else:
            isotonic = fitted.get("isotonic") or {}
            if not isotonic.get("mapping"):
                items = fitted.get("calibration_items", 0)
                raise EvaluationError("method", f"Isotonic regression needs at least {ISOTONIC_MIN_ITEMS} calibration "
                                                f"items; evaluation {evaluation.pk} had {items}. Use the temperature.")
            calibration.update(isotonic["mapping"])
            calibration["temperature"] = None
    ModelVersion.objects.filter(pk=version.pk).update(calibration=calibration)
    version.calibration = calibration
    return version


def evaluation_of_project(project: Project, value: Any, field: str = "evaluation") -> Evaluation:
    if isinstance(value, Evaluation):
        found: Evaluation | None = value if value.project_id == project.pk else None
    else:
        if value in (None, ""):
            raise EvaluationError(field, "This field is required.")
        try:
            found = Evaluation.objects.select_related("model_version__model").filter(pk=int(value), project=project).first()
        except (TypeError, ValueError):
            raise EvaluationError(field, "Give the id of an evaluation.") from None
    if found is None:
        raise EvaluationError(field, f"No evaluation with that id in project '{project.slug}'.")
    return found


# --- a flow's threshold ------------------------------------------------------------------------
def activate_flow(flow: FlowDefinition, raw: dict[str, Any], user=None) -> dict[str, Any]:
    """Route `flow` at the chosen threshold of an evaluation's proposal (recomputed for this
    flow's task_count and audit sample, and with any target or costs given). Returns
    {"flow", "threshold", "choice", "record", "warnings"}."""
    from review.actions.teams import set_flow_threshold

    if flow.task_type != TaskType.CLASSIFICATION:
        raise EvaluationError("flow_definition", f"Flow '{flow.name}' collects free text: a confidence threshold "
                                                 "routes classification flows only.")
    evaluation = evaluation_of_project(flow.project, raw.get("evaluation"))
    choice = raw.get("choice", "risk")
    if choice not in ("risk", "cost"):
        raise EvaluationError("choice", "Must be \"risk\" (the most coverage within the target error) or \"cost\" "
                                        "(the least expected cost).")
    proposal = propose(evaluation, {**{k: v for k, v in raw.items() if k in OPTION_KEYS}, "flow_definition": flow.pk})
    row = proposal.get(choice)
    if not row:
        reason = proposal.get("reason" if choice == "risk" else "cost_reason") or "no threshold qualifies"
        raise EvaluationError("choice", f"The proposal has no {choice} threshold: {reason}")
    warnings = []
    temperature = proposal.get("temperature")
    served = list(flow.endpoints.select_related("model_version"))
    for endpoint in served:
        version = endpoint.model_version
        if version.pk != evaluation.model_version_id:
            warnings.append(f"endpoint '{endpoint.name}' serves model version {version.pk}, not {evaluation.model_version_id} "
                            "that the threshold was measured on")
        elif proposal.get("calibrated") and (version.calibration or {}).get("temperature") != temperature:
            warnings.append(f"endpoint '{endpoint.name}' serves confidences at temperature "
                            f"{(version.calibration or {}).get('temperature') or 1.0}, the threshold assumes {temperature}: "
                            f"calibrate model version {version.pk} with evaluation {evaluation.pk}")
    record = {"evaluation": evaluation.pk, "model_version": evaluation.model_version_id, "choice": choice,
              "temperature": temperature if proposal.get("calibrated") else None,
              "calibrated": bool(proposal.get("calibrated")),
              "target_error": proposal["target_error"], "delta": proposal["delta"], "threshold": row["threshold"],
              "expected": {key: row.get(key) for key in ("coverage", "risk", "risk_upper", "workload", "cost")},
              "measured": (proposal.get("measured") or {}).get(choice),
              "set_at": timezone.now().isoformat(), "set_by": getattr(user, "username", None)}
    if (flow.activation or {}).get("combine", "any") != "any":
        warnings.append("the flow combined its conditions with \"all\" (only sampled items below the threshold went to "
                        "people); the threshold's guarantee needs every item below it reviewed, so it now uses \"any\"")
    # Under "all", items below the threshold but not sampled would be auto-accepted: the bound
    # holds only when everything below the threshold goes to people.
    set_flow_threshold(flow, threshold=row["threshold"], record=record, combine="any")
    return {"flow_definition": flow.pk, "threshold": row["threshold"], "choice": choice, "calibration": record,
            "activation": flow.activation, "warnings": warnings}
