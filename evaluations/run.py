"""An evaluation, run by a control worker (evaluations.tasks.run_evaluation_task):

1. Claim the row (Pending → Running, compare-and-set: a duplicate delivery does nothing).
2. Stage the dataset version's channel as a job's channel is staged, read every record with
   its label (evaluations.records), and check every label is one the model predicts.
3. Predict in chunks with the model's own predictor, keeping the logits (so no
   predict_proba contract is needed, and a temperature can be fitted), with a heartbeat
   and records_done after each chunk.
4. Compute the report (trainyard.evaluation: scikit-learn and torchmetrics underneath) on
   every record; split the records (seeded) into a calibration part and a test part; fit
   the temperature (and isotonic steps with ≥ 1,000 calibration items) on the first and
   report both before and after on the second; propose a threshold on the first and
   measure it on the second.
5. Write the scores (logits, targets, the split) as an artifact, then the row Completed in
   one update; or Failed with a reason a person can act on, and nothing else written.
"""

from __future__ import annotations

import io
import logging
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from django.utils import timezone

from datasets.storage import StorageError, object_uri, store_for
from evaluations.models import Evaluation, EvaluationStatus
from evaluations.records import Labelled, RecordsError, labelled_records, stage
from hosting.models import ModelKind
from hosting.serving import InvalidInstances, parse_instances, predictor_for
from jobs.runner.staging import StagingError

log = logging.getLogger(__name__)

CHUNK = 1024
# Resamples for the 95 % intervals: 1,000 up to 4,000 records, then as many as 4 million
# record draws allow, never fewer than 200. A large set's intervals are narrow, and a fixed
# 1,000 would cost more than predicting a cheap model's records (bench/evaluation.py).
BOOTSTRAP = 1000
BOOTSTRAP_MIN = 200
BOOTSTRAP_DRAWS = 4_000_000
ISOTONIC_MIN_ITEMS = 1000
CURVE_CLASSES = 10
FIXED_THRESHOLD = 0.8  # AWS's examples' habit, shown beside the proposal for comparison


def run_evaluation(evaluation_id: int) -> str:
    """The evaluation's final status ("skipped" when another worker has it or it is finished)."""
    now = timezone.now()
    claimed = Evaluation.objects.filter(pk=evaluation_id, status=EvaluationStatus.PENDING).update(
        status=EvaluationStatus.RUNNING, heartbeat_at=now, records_done=0)
    if not claimed:
        return "skipped"
    evaluation = Evaluation.objects.select_related("model_version__model", "dataset_version__dataset", "project").get(
        pk=evaluation_id)
    if evaluation.started_at is None:
        Evaluation.objects.filter(pk=evaluation_id).update(started_at=now)
    started = time.monotonic()
    try:
        fields = evaluate(evaluation)
    except (RecordsError, StagingError, StorageError, OSError, ValueError) as exc:
        _finish(evaluation_id, EvaluationStatus.FAILED, failure_reason=str(exc))
        return EvaluationStatus.FAILED
    except Exception as exc:  # noqa: BLE001 - the row must not stay Running forever
        log.exception("evaluation %s failed", evaluation_id)
        _finish(evaluation_id, EvaluationStatus.FAILED, failure_reason=f"internal error ({type(exc).__name__}: {exc}); "
                                                                       "the control worker's log has the details")
        return EvaluationStatus.FAILED
    _finish(evaluation_id, EvaluationStatus.COMPLETED, duration_seconds=time.monotonic() - started, **fields)
    return EvaluationStatus.COMPLETED


def _finish(evaluation_id: int, status: str, **fields: Any) -> None:
    now = timezone.now()
    Evaluation.objects.filter(pk=evaluation_id).update(status=status, finished_at=now, heartbeat_at=now, **fields)


# --- the run -------------------------------------------------------------------------------------
def evaluate(evaluation: Evaluation) -> dict[str, Any]:
    """The Completed row's fields (the artifacts already written)."""
    version, dataset_version = evaluation.model_version, evaluation.dataset_version
    with tempfile.TemporaryDirectory(prefix=f"evaluation-{evaluation.pk}-") as tmp:
        stage(dataset_version, evaluation.channel, Path(tmp))
        data = labelled_records(version, dataset_version, Path(tmp))
    if not data.instances:
        where = f"the {evaluation.channel} channel of " if evaluation.channel else ""
        raise RecordsError(f"{where}{dataset_version.dataset.name} v{dataset_version.version} has no records to evaluate")
    Evaluation.objects.filter(pk=evaluation.pk).update(records_total=len(data.instances), heartbeat_at=timezone.now())
    if version.kind == ModelKind.GENERATIVE:
        return _evaluate_language_model(evaluation, data)
    return _evaluate_classifier(evaluation, data)


def _targets(evaluation: Evaluation, data: Labelled) -> tuple[list[Any], np.ndarray]:
    """The labelled records and their label indices; RecordsError naming the labels the model
    cannot predict."""
    index = {str(label): position for position, label in enumerate(evaluation.labels)}
    unknown: dict[str, int] = {}
    kept, targets = [], []
    for instance, label in zip(data.instances, data.labels, strict=True):
        if not label:
            continue
        if label not in index:
            unknown[label] = unknown.get(label, 0) + 1
            continue
        kept.append(instance)
        targets.append(index[label])
    dataset = f"{evaluation.dataset_version.dataset.name} v{evaluation.dataset_version.version}"
    model = f"{evaluation.model_version.model.name} v{evaluation.model_version.version}"
    if unknown:
        shown = ", ".join(f"'{label}' ({count})" for label, count in sorted(unknown.items(), key=lambda kv: -kv[1])[:8])
        raise RecordsError(f"{dataset} has labels that model {model} cannot predict: {shown}; the model's labels are "
                           f"{', '.join(map(str, evaluation.labels[:20]))}. Evaluate on data of the model's labels, or "
                           "retrain the model with these.")
    if len(kept) < 2:
        raise RecordsError(f"{dataset} has {len(kept)} labelled record{'s' if len(kept) != 1 else ''}: an evaluation "
                           "needs at least 2")
    return kept, np.asarray(targets, dtype=np.int64)


def predict_logits(evaluation: Evaluation, instances: list[Any]) -> np.ndarray:
    """(records, labels) float64 logits, CHUNK records at a time, beating after each."""
    version = evaluation.model_version
    predictor = predictor_for(version)
    parts = []
    for start in range(0, len(instances), CHUNK):
        chunk = instances[start:start + CHUNK]
        try:
            parsed, _contents = parse_instances(version, chunk)
            parts.append(predictor.logits(parsed).double().numpy())
        except InvalidInstances as exc:
            message = str(exc)
            if message.startswith("instances["):
                number, _, rest = message[len("instances["):].partition("]: ")
                if number.isdigit():
                    raise RecordsError(f"record {start + int(number)}: {rest}") from None
            raise RecordsError(message) from None
        Evaluation.objects.filter(pk=evaluation.pk).update(records_done=start + len(chunk), heartbeat_at=timezone.now())
    return np.concatenate(parts) if parts else np.zeros((0, len(evaluation.labels)))


def _evaluate_classifier(evaluation: Evaluation, data: Labelled) -> dict[str, Any]:
    from trainyard import evaluation as metrics

    instances, targets = _targets(evaluation, data)
    logits = predict_logits(evaluation, instances)
    labels = [str(label) for label in evaluation.labels]
    probabilities = metrics.softmax(logits)
    resamples = bootstrap_resamples(len(targets))
    calibration_part, test_part = metrics.split_indices(len(targets), evaluation.calibration_fraction, evaluation.seed)
    # The fits and the report read the same arrays and write nothing shared; numpy's sorts and
    # sums release the GIL, so on two cores they overlap.
    with ThreadPoolExecutor(max_workers=1) as pool:
        fitted = pool.submit(fit_calibration, logits, targets, labels, calibration_part, test_part)
        report = metrics.classification_report(probabilities, targets, labels, bins=15, bootstrap=resamples,
                                               seed=evaluation.seed, curve_classes=CURVE_CLASSES)
        calibration = fitted.result()
    report["unlabelled"] = data.unlabelled
    report["bootstrap_resamples"] = resamples
    artifacts = {"scores": _write_scores(evaluation, logits, targets, calibration_part, test_part)}
    if len(labels) > CURVE_CLASSES:
        artifacts["per_class_csv"] = _write_text(evaluation, "per-class.csv",
                                                 metrics.per_class_csv(probabilities, targets, labels))
    evaluation.calibration = calibration
    scores = Scores(logits, targets, calibration_part, test_part)
    try:
        proposal = proposal_from_scores(evaluation, evaluation.options, scores=scores)
    except ValueError as exc:  # the split is too small for this target: the figures still stand
        proposal = {"error": str(exc)}
    return {"report": report, "calibration": calibration, "proposal": proposal, "artifacts": artifacts,
            "records_done": len(data.instances)}


def bootstrap_resamples(records: int) -> int:
    return max(BOOTSTRAP_MIN, min(BOOTSTRAP, BOOTSTRAP_DRAWS // max(records, 1)))


def fit_calibration(logits: np.ndarray, targets: np.ndarray, labels: list[str], calibration_part: np.ndarray,
                    test_part: np.ndarray) -> dict[str, Any]:
    """The temperature fitted on the calibration part, and the test part's figures and
    reliability bins before and after it (and after isotonic steps, when offered)."""
    import torch

    from algorithms.predict import isotonic_top
    from trainyard import evaluation as metrics

    temperature = metrics.fit_temperature(logits[calibration_part], targets[calibration_part])
    before = metrics.softmax(logits[test_part])
    after = metrics.softmax(logits[test_part], temperature)
    result: dict[str, Any] = {
        "temperature": temperature, "calibration_items": int(len(calibration_part)), "test_items": int(len(test_part)),
        "before": metrics.calibration_summary(before, targets[test_part]),
        "after": metrics.calibration_summary(after, targets[test_part]),
        "isotonic": None, "isotonic_min_items": ISOTONIC_MIN_ITEMS,
    }
    if len(calibration_part) >= ISOTONIC_MIN_ITEMS:
        raw = metrics.softmax(logits[calibration_part])
        mapping = metrics.fit_isotonic(raw.max(axis=1), raw.argmax(axis=1) == targets[calibration_part])
        mapped = isotonic_top(torch.from_numpy(metrics.softmax(logits[test_part])), mapping).numpy()
        result["isotonic"] = {"mapping": {"x": mapping["x"], "y": mapping["y"]},
                              "after": metrics.calibration_summary(mapped, targets[test_part])}
    return result


# --- scores and proposals ------------------------------------------------------------------------
class Scores:
    def __init__(self, logits: np.ndarray, targets: np.ndarray, calibration_part: np.ndarray, test_part: np.ndarray):
        self.logits, self.targets = logits, targets
        self.calibration_part, self.test_part = calibration_part, test_part


def _write_scores(evaluation: Evaluation, logits: np.ndarray, targets: np.ndarray, calibration_part: np.ndarray,
                  test_part: np.ndarray) -> str:
    buffer = io.BytesIO()
    # The logits were float32 from the model, so float32 keeps them exactly; uncompressed, as
    # random-looking floats hardly compress and compressing cost more than a tabular model's predictions.
    np.savez(buffer, logits=logits.astype(np.float32), targets=targets.astype(np.int32),
             calibration=calibration_part.astype(np.int32), test=test_part.astype(np.int32))
    return _write_bytes(evaluation, "scores.npz", buffer.getvalue())


def _write_text(evaluation: Evaluation, name: str, text: str) -> str:
    return _write_bytes(evaluation, name, text.encode("utf-8"))


def _write_bytes(evaluation: Evaluation, name: str, data: bytes) -> str:
    uri = object_uri(f"evaluations/{evaluation.pk}/{name}")
    with store_for(uri).open_write(uri) as out:
        out.write(data)
    return uri


def read_scores(evaluation: Evaluation) -> Scores:
    uri = (evaluation.artifacts or {}).get("scores")
    if not uri:
        raise ValueError(f"evaluation: evaluation {evaluation.pk} kept no scores")
    with store_for(uri).open_read(uri) as stream:
        stored = np.load(io.BytesIO(stream.read()))
        return Scores(stored["logits"].astype(np.float64), stored["targets"].astype(np.int64), stored["calibration"],
                      stored["test"])


def proposal_from_scores(evaluation: Evaluation, options: dict[str, Any], scores: Scores | None = None) -> dict[str, Any]:
    """trainyard.evaluation.propose_threshold on the calibration part's confidences (at the
    fitted temperature unless options say calibrated: false), compared with the flow's
    current threshold and a fixed 0.8, each then measured on the test part."""
    from evaluations.actions import flow_routing
    from trainyard import evaluation as metrics

    scores = scores or read_scores(evaluation)
    temperature = float((evaluation.calibration or {}).get("temperature") or 1.0)
    calibrated = bool(options.get("calibrated", True))
    probabilities = metrics.softmax(scores.logits, temperature if calibrated else 1.0)
    confidence = probabilities.max(axis=1)
    correct = probabilities.argmax(axis=1) == scores.targets
    routing = flow_routing(options)
    calibration_part, test_part = scores.calibration_part, scores.test_part
    proposal = metrics.propose_threshold(
        confidence[calibration_part], correct[calibration_part], target_error=options["target_error"],
        delta=options["delta"], sample_rate=routing["sample_rate"], task_count=routing["task_count"],
        review_cost=options.get("review_cost"), error_cost=options.get("error_cost"),
        compare={"current": routing["current"], "fixed_0.8": FIXED_THRESHOLD})
    proposal.update({"calibrated": calibrated, "temperature": temperature if calibrated else 1.0,
                     "flow_definition": routing["flow"], "computed_at": timezone.now().isoformat()})
    measured: dict[str, Any] = {}
    rows = {"risk": proposal.get("risk"), "cost": proposal.get("cost"), **(proposal.get("compared") or {})}
    for name, row in rows.items():
        if row and row.get("threshold") is not None:
            measured[name] = metrics.measure_threshold(confidence[test_part], correct[test_part], row["threshold"],
                                                       routing["sample_rate"])
    proposal["measured"] = measured
    return proposal


# --- char-lm ---------------------------------------------------------------------------------------
def _evaluate_language_model(evaluation: Evaluation, data: Labelled) -> dict[str, Any]:
    """Perplexity and bits per character of the text, read as the model was trained: the
    lines joined by newlines, cut into non-overlapping windows of its context length."""
    import torch

    from algorithms.charlm import encode_text, windows
    from trainyard import evaluation as metrics

    predictor = predictor_for(evaluation.model_version)
    schema = predictor.config["input"]
    ids = encode_text("\n".join(data.instances) + "\n", schema["vocabulary"])
    inputs, targets = windows(ids, schema["context_length"])
    if not len(inputs):
        raise RecordsError(f"the text has {len(ids)} characters: fewer than one window of "
                           f"{schema['context_length'] + 1} characters the model reads")
    parts = []
    with torch.no_grad():
        for start in range(0, len(inputs), 256):
            batch = torch.from_numpy(np.asarray(inputs[start:start + 256], dtype=np.int64))
            parts.append(predictor.model(batch).double().numpy())
            Evaluation.objects.filter(pk=evaluation.pk).update(records_done=min(len(data.instances), start),
                                                               heartbeat_at=timezone.now())
    report = metrics.language_model_report(np.concatenate(parts), np.asarray(targets, dtype=np.int64))
    report["characters"] = int(len(ids))
    return {"report": report, "records_done": len(data.instances)}
