"""The numbers of a model evaluation: classification figures with bootstrap intervals,
calibration (equal-width and equal-mass ECE, temperature and isotonic fits), the
selective-risk threshold a review flow auto-accepts above, and language-model perplexity.

Every figure scikit-learn or torchmetrics provides comes from them; this module adds only
what they lack: equal-mass bins, the bin tables a page draws, vectorised bootstrap
replicates, the temperature fit, the SGR threshold search (Geifman & El-Yaniv 2017,
"Selective classification for deep neural networks") and Clopper–Pearson bounds.

Conventions, so that two pages never disagree:
- confidence = top-class probability, correct = (argmax == target), argmax ties go to the
  first class (numpy and torch agree).
- Brier = scikit-learn's `brier_score_loss(labels=range(K))` with its default
  `scale_by_half="auto"`: Σ_c (y_ic − p_ic)² averaged over items, halved for K = 2 (so the
  binary figure is the customary (y − p₁)², range [0, 1]) and not halved for K ≥ 3 (range [0, 2]).
- Equal-width bins are torchmetrics' (n_bins edges from torch.linspace, a bin holds
  [lower, upper), a confidence of exactly 1.0 gets a slot of its own): our table's weighted
  |accuracy − confidence| sum is torchmetrics' ECE.
- Equal-mass bins: the item of rank r (stable sort by confidence) goes to bin ⌊r·B/n⌋.

No Django here (job processes import this module); scikit-learn, torch and torchmetrics are
imported inside the functions that use them, so `import trainyard.evaluation` stays cheap.
Every returned dict is JSON-serialisable with no NaN (a missing figure is None).
"""

from __future__ import annotations

import csv
import io
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

CONFIDENCE_LEVEL = 0.95
MAX_CURVE_POINTS = 200
# Bootstrap weights are built as a (replicates × n) count matrix; this bounds one chunk's cells
# (~8 bytes each, a few copies) so n = 1,000,000 does not allocate gigabytes.
BOOTSTRAP_CHUNK_CELLS = 2_000_000
INTERVAL_FIGURES = ("accuracy", "macro_f1", "log_loss", "brier", "ece_width", "ece_mass")


# -- small helpers ---------------------------------------------------------------------------

def _number(value: Any) -> float | None:
    """A plain float, or None for NaN/inf/None (JSON has no NaN)."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _thin(*columns: np.ndarray, limit: int = MAX_CURVE_POINTS) -> list[list[float]]:
    """Keep at most `limit` evenly spaced points of a curve, always its two ends."""
    length = len(columns[0])
    if length > limit:
        keep = np.unique(np.linspace(0, length - 1, limit).round().astype(np.int64))
        columns = tuple(column[keep] for column in columns)
    return [[float(value) for value in column] for column in columns]


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax of logits / temperature in float64, shifted by the row maximum."""
    scaled = np.asarray(logits, dtype=np.float64) / float(temperature)
    scaled = scaled - scaled.max(axis=-1, keepdims=True)
    exponentials = np.exp(scaled)
    return exponentials / exponentials.sum(axis=-1, keepdims=True)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def split_indices(n: int, calibration_fraction: float = 0.5, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split into (calibration indices, test indices), each sorted; both non-empty when n >= 2."""
    permutation = np.random.default_rng(seed).permutation(n)
    calibration_size = int(round(n * calibration_fraction))
    low, high = (1, n - 1) if n >= 2 else (0, n)
    calibration_size = min(max(calibration_size, low), high)
    return np.sort(permutation[:calibration_size]), np.sort(permutation[calibration_size:])


# -- per-item quantities shared by the point figures and the bootstrap -------------------------

def _top(probabilities: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    predictions = probabilities.argmax(axis=1)
    confidences = probabilities[np.arange(len(targets)), predictions]
    correct = (predictions == targets).astype(np.float64)
    return predictions, confidences, correct


def _width_bins(confidences: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """torchmetrics' equal-width bin of each item (0..bins, slot `bins` holding confidence 1.0) and its edges."""
    import torch

    edges = torch.linspace(0, 1, bins + 1, dtype=torch.float64)
    index = torch.bucketize(torch.from_numpy(np.ascontiguousarray(confidences, dtype=np.float64)), edges, right=True) - 1
    return index.numpy().astype(np.int64), edges.numpy()


def _mass_bins(confidences: np.ndarray, bins: int) -> np.ndarray:
    order = np.argsort(confidences, kind="stable")
    index = np.empty(len(confidences), dtype=np.int64)
    index[order] = (np.arange(len(confidences), dtype=np.int64) * bins) // max(len(confidences), 1)
    return index


def _torchmetrics_calibration_error(confidences: np.ndarray, correct: np.ndarray, bins: int, norm: str) -> float:
    """torchmetrics' calibration error in float64.

    `multiclass_calibration_error` casts confidences to float32 before binning (its
    `_multiclass_calibration_error_update` calls `.float()`); its `_ce_compute` on float64 tensors is
    the same computation without that cast, so the figure is exact to the item."""
    import torch
    from torchmetrics.functional.classification.calibration_error import _ce_compute

    value = _ce_compute(torch.from_numpy(np.ascontiguousarray(confidences, dtype=np.float64)),
                        torch.from_numpy(np.ascontiguousarray(correct, dtype=np.float64)), bins, norm=norm)
    return float(value)


def _bin_table(confidences: np.ndarray, correct: np.ndarray, index: np.ndarray, slots: int,
               edges: np.ndarray | None) -> list[dict[str, Any]]:
    counts = np.bincount(index, minlength=slots)
    confidence_sums = np.bincount(index, weights=confidences, minlength=slots)
    correct_sums = np.bincount(index, weights=correct, minlength=slots)
    rows: list[dict[str, Any]] = []
    for slot in range(slots):
        count = int(counts[slot])
        if edges is not None:
            if slot >= len(edges) - 1:  # torchmetrics' slot for confidence == 1.0: shown only when used
                if count == 0:
                    continue
                lower, upper = 1.0, 1.0
            else:
                lower, upper = float(edges[slot]), float(edges[slot + 1])
        else:
            if count == 0:
                continue
            members = confidences[index == slot]
            lower, upper = float(members.min()), float(members.max())
        rows.append({"lower": lower, "upper": upper, "count": count,
                     "confidence": float(confidence_sums[slot] / count) if count else None,
                     "accuracy": float(correct_sums[slot] / count) if count else None})
    return rows


def _calibration_error_from_index(confidences: np.ndarray, correct: np.ndarray, index: np.ndarray, slots: int) -> float:
    gaps = np.bincount(index, weights=correct - confidences, minlength=slots)
    return float(np.abs(gaps).sum() / max(len(confidences), 1))


def _item_log_loss(probabilities: np.ndarray, targets: np.ndarray) -> np.ndarray:
    # scikit-learn's log_loss clips to [eps, 1 - eps] of the dtype before the log.
    eps = np.finfo(np.float64).eps
    return -np.log(np.clip(probabilities[np.arange(len(targets)), targets], eps, 1 - eps))


def _item_brier(probabilities: np.ndarray, targets: np.ndarray) -> np.ndarray:
    one_hot = np.zeros_like(probabilities)
    one_hot[np.arange(len(targets)), targets] = 1.0
    squares = ((one_hot - probabilities) ** 2).sum(axis=1)
    return squares * 0.5 if probabilities.shape[1] < 3 else squares  # scale_by_half="auto"


# -- the bootstrap -----------------------------------------------------------------------------

def _replicate_figures(weights: np.ndarray, columns: np.ndarray, classes: int, width_slots: int, mass_slots: int,
                       n: int) -> dict[str, np.ndarray]:
    """Figures for each row of `weights` (resample counts per item, rows summing to n).

    `columns` holds the per-item quantities (see `_bootstrap_columns`), so one matrix product
    gives every replicate's sums; at identity weights each figure is the point figure."""
    sums = weights @ columns
    position = 0

    def take(width: int) -> np.ndarray:
        nonlocal position
        block = sums[:, position:position + width]
        position += width
        return block

    accuracy, log_loss, brier = (take(1)[:, 0] / n for _ in range(3))
    true_counts, predicted_counts, true_positives = take(classes), take(classes), take(classes)
    denominator = true_counts + predicted_counts
    f1 = np.divide(2 * true_positives, denominator, out=np.zeros_like(denominator), where=denominator > 0)
    ece_width = np.abs(take(width_slots)).sum(axis=1) / n
    ece_mass = np.abs(take(mass_slots)).sum(axis=1) / n
    return {"accuracy": accuracy, "macro_f1": f1.mean(axis=1), "log_loss": log_loss, "brier": brier,
            "ece_width": ece_width, "ece_mass": ece_mass}


def _bootstrap_columns(probabilities: np.ndarray, targets: np.ndarray, bins: int) -> tuple[np.ndarray, int, int]:
    n, classes = probabilities.shape
    predictions, confidences, correct = _top(probabilities, targets)
    width_index, _ = _width_bins(confidences, bins)
    mass_index = _mass_bins(confidences, bins)
    width_slots, mass_slots = bins + 1, bins
    gap = correct - confidences
    columns = np.zeros((n, 3 + 3 * classes + width_slots + mass_slots))
    rows = np.arange(n)
    columns[:, 0] = correct
    columns[:, 1] = _item_log_loss(probabilities, targets)
    columns[:, 2] = _item_brier(probabilities, targets)
    columns[rows, 3 + targets] = 1.0
    columns[rows, 3 + classes + predictions] = 1.0
    columns[rows, 3 + 2 * classes + targets] = correct
    columns[rows, 3 + 3 * classes + width_index] = gap
    columns[rows, 3 + 3 * classes + width_slots + mass_index] = gap
    return columns, width_slots, mass_slots


def bootstrap_replicates(probabilities: np.ndarray, targets: np.ndarray, *, bins: int = 15, resamples: int = 1000,
                         seed: int = 0, identity: bool = False) -> dict[str, np.ndarray]:
    """Each interval figure on `resamples` seeded resamples with replacement (identity=True: one replicate of the
    data itself, which equals the point figures).

    1. Per-item quantities go into one (n × columns) matrix once.
    2. Per chunk of replicates, resample indices are drawn and one np.bincount per replicate fills a
       (replicates × n) count matrix reused across chunks (one bincount of offset indices cost twice as
       much: the offsets, an int64 matrix and its float copy, on every chunk).
    3. counts @ columns gives every replicate's sums; figures follow from the sums."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    n, classes = probabilities.shape
    columns, width_slots, mass_slots = _bootstrap_columns(probabilities, targets, bins)
    if identity:
        return _replicate_figures(np.ones((1, n)), columns, classes, width_slots, mass_slots, n)
    rng = np.random.default_rng(seed)
    chunk = max(1, BOOTSTRAP_CHUNK_CELLS // max(n, 1))
    parts: list[dict[str, np.ndarray]] = []
    buffer = np.empty((min(chunk, resamples), n))
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        drawn = rng.integers(0, n, size=(size, n))
        counts = buffer[:size]
        for replicate in range(size):
            counts[replicate] = np.bincount(drawn[replicate], minlength=n)
        parts.append(_replicate_figures(counts, columns, classes, width_slots, mass_slots, n))
    return {name: np.concatenate([part[name] for part in parts]) for name in INTERVAL_FIGURES}


def _intervals(replicates: dict[str, np.ndarray]) -> dict[str, list[float | None]]:
    tail = (1 - CONFIDENCE_LEVEL) / 2 * 100
    return {name: [_number(value) for value in np.percentile(values, [tail, 100 - tail])]
            for name, values in replicates.items()}


def _trusted_inputs(function: Any) -> Any:
    """Run `function` with scikit-learn's parameter validation off (sklearn.config_context
    skip_parameter_validation, documented since 1.3): _check_inputs has already checked the
    arrays, and the validation of its many small calls cost more than the figures themselves
    on a large evaluation (bench/evaluation.py). The figures are the same."""
    import functools

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from sklearn import config_context

        with config_context(skip_parameter_validation=True):
            return function(*args, **kwargs)

    return wrapper


# -- classification ------------------------------------------------------------------------------

def _one_vs_rest(targets: np.ndarray, scores: np.ndarray, positive: int) -> tuple[dict[str, Any], dict[str, Any]]:
    from sklearn.metrics import auc, average_precision_score, precision_recall_curve, roc_curve

    truth = targets == positive
    if truth.all() or not truth.any():  # a curve needs positives and negatives; sklearn would warn and return NaN
        return {"fpr": [], "tpr": [], "auc": None}, {"recall": [], "precision": [], "average_precision": None}
    fpr, tpr, _ = roc_curve(truth, scores)
    precision, recall, _ = precision_recall_curve(truth, scores)
    fpr_list, tpr_list = _thin(fpr, tpr)
    recall_list, precision_list = _thin(recall, precision)
    # roc_auc_score of a binary target is exactly auc() of its roc_curve: one sort instead of two.
    return ({"fpr": fpr_list, "tpr": tpr_list, "auc": _number(auc(fpr, tpr))},
            {"recall": recall_list, "precision": precision_list,
             "average_precision": _number(average_precision_score(truth, scores))})


def _macro_roc_auc(probabilities: np.ndarray, targets: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score

    classes = probabilities.shape[1]
    support = np.bincount(targets, minlength=classes)
    if (support == 0).any() or (support == len(targets)).any():
        return None
    if classes == 2:
        return _number(roc_auc_score(targets, probabilities[:, 1]))
    return _number(roc_auc_score(targets, probabilities, multi_class="ovr", average="macro", labels=list(range(classes))))


def _check_inputs(probabilities: np.ndarray, targets: np.ndarray, labels: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    probabilities = np.asarray(probabilities, dtype=np.float64)
    targets = np.asarray(targets).astype(np.int64)
    if probabilities.ndim != 2 or len(probabilities) != len(targets) or len(targets) == 0:
        raise ValueError(f"probabilities: expected (n, K) with n = len(targets) > 0, got {probabilities.shape} for "
                         f"{len(targets)} targets")
    if labels is not None and probabilities.shape[1] != len(labels):
        raise ValueError(f"labels: {len(labels)} labels for {probabilities.shape[1]} probability columns")
    if targets.min() < 0 or targets.max() >= probabilities.shape[1]:
        raise ValueError(f"targets: expected integers in [0, {probabilities.shape[1]})")
    finite = np.isfinite(probabilities).all(axis=1)
    if not finite.all():
        raise ValueError(f"probabilities: the model's scores are NaN or infinite for {int((~finite).sum())} of "
                         f"{len(targets)} records (the first is record {int(np.argmin(finite))})")
    return probabilities, targets


@_trusted_inputs
def calibration_summary(probabilities: np.ndarray, targets: np.ndarray, bins: int = 15) -> dict[str, Any]:
    """{n, accuracy, nll, brier, ece_width, ece_mass, mce, bins}; bins are classification_report's
    calibration bin tables ({"width": [...], "mass": [...]}), so a caller wanting them need not run a
    whole report for them (evaluations.run's _summary did, twice per evaluation)."""
    from sklearn.metrics import accuracy_score, brier_score_loss, log_loss

    probabilities, targets = _check_inputs(probabilities, targets)
    classes = probabilities.shape[1]
    predictions, confidences, correct = _top(probabilities, targets)
    width_index, edges = _width_bins(confidences, bins)
    mass_index = _mass_bins(confidences, bins)
    return {"n": len(targets),
            "accuracy": float(accuracy_score(targets, predictions)),
            "nll": _number(log_loss(targets, probabilities, labels=list(range(classes)))),
            "brier": _number(brier_score_loss(targets, probabilities, labels=list(range(classes)))),
            "ece_width": _torchmetrics_calibration_error(confidences, correct, bins, "l1"),
            "ece_mass": _calibration_error_from_index(confidences, correct, mass_index, bins),
            "mce": _torchmetrics_calibration_error(confidences, correct, bins, "max"),
            "bins": {"width": _bin_table(confidences, correct, width_index, bins + 1, edges),
                     "mass": _bin_table(confidences, correct, mass_index, bins, None)}}


@_trusted_inputs
def classification_report(probabilities: np.ndarray, targets: np.ndarray, labels: list[str], *, bins: int = 15,
                          bootstrap: int = 1000, seed: int = 0, curve_classes: int = 10) -> dict[str, Any]:
    """Every figure of a classifier's evaluation page (keys in the module's interface notes)."""
    from sklearn.metrics import (
        accuracy_score,
        brier_score_loss,
        confusion_matrix,
        log_loss,
        precision_recall_fscore_support,
    )

    probabilities, targets = _check_inputs(probabilities, targets, labels)
    n, classes = probabilities.shape
    class_ids = list(range(classes))
    predictions, confidences, correct = _top(probabilities, targets)
    # The bootstrap is numpy throughout (it releases the GIL): it runs beside scikit-learn's calls.
    pool = ThreadPoolExecutor(max_workers=1) if bootstrap > 0 else None
    replicates = (pool.submit(bootstrap_replicates, probabilities, targets, bins=bins, resamples=bootstrap, seed=seed)
                  if pool is not None else None)

    precision, recall, f1, support = precision_recall_fscore_support(targets, predictions, labels=class_ids, zero_division=0)
    # scikit-learn's average="macro" over `labels` is the plain mean of these per-class arrays and
    # average="weighted" their mean weighted by support (its _classification.py): the same
    # figures without two more passes of its input checks (tests compare them with f1_score's).
    macro = (float(np.mean(precision)), float(np.mean(recall)), float(np.mean(f1)))
    weighted_f1 = float(np.average(f1, weights=support)) if support.sum() > 0 else 0.0
    report: dict[str, Any] = {
        "n": n,
        "accuracy": float(accuracy_score(targets, predictions)),
        "macro_f1": float(macro[2]),
        "weighted_f1": weighted_f1,
        "macro_precision": float(macro[0]),
        "macro_recall": float(macro[1]),
        "log_loss": _number(log_loss(targets, probabilities, labels=class_ids)),
        "brier": _number(brier_score_loss(targets, probabilities, labels=class_ids)),
        "brier_definition": "sklearn brier_score_loss, scale_by_half='auto' (halved for K=2, range [0, 2] for K>=3)",
        "per_class": [{"label": labels[c], "precision": float(precision[c]), "recall": float(recall[c]),
                       "f1": float(f1[c]), "support": int(support[c])} for c in class_ids],
        "confusion_matrix": confusion_matrix(targets, predictions, labels=class_ids).tolist(),
    }

    # Curves: binary shows the positive class only; otherwise the best-supported classes first.
    shown = [1] if classes == 2 else sorted(class_ids, key=lambda c: (-int(support[c]), c))[:max(curve_classes, 0)]
    report["roc"], report["pr"] = {}, {}
    for c in shown:
        report["roc"][labels[c]], report["pr"][labels[c]] = _one_vs_rest(targets, probabilities[:, c], c)
    aucs = [report["roc"][labels[c]]["auc"] for c in shown]
    if classes > 2 and len(shown) == classes and all(value is not None for value in aucs):
        # roc_auc_score(multi_class="ovr", average="macro") is the plain mean of these same binary AUCs.
        report["roc_auc_macro"] = _number(float(np.mean(aucs)))
    else:
        report["roc_auc_macro"] = _macro_roc_auc(probabilities, targets)
    report["curve_classes_omitted"] = 0 if classes == 2 else classes - len(shown)

    width_index, edges = _width_bins(confidences, bins)
    mass_index = _mass_bins(confidences, bins)
    report["calibration"] = {
        "ece_width": _torchmetrics_calibration_error(confidences, correct, bins, "l1"),
        "ece_mass": _calibration_error_from_index(confidences, correct, mass_index, bins),
        "mce": _torchmetrics_calibration_error(confidences, correct, bins, "max"),
        "bins": {"width": _bin_table(confidences, correct, width_index, bins + 1, edges),
                 "mass": _bin_table(confidences, correct, mass_index, bins, None)},
    }
    report["intervals"] = _intervals(replicates.result()) if replicates is not None else {}
    if pool is not None:
        pool.shutdown()
    return report


@_trusted_inputs
def per_class_csv(probabilities: np.ndarray, targets: np.ndarray, labels: list[str]) -> str:
    """One row per class (label, support, precision, recall, f1, roc_auc, average_precision); an empty cell
    where a figure does not exist (a class with no positives has no ROC AUC)."""
    from sklearn.metrics import precision_recall_fscore_support

    probabilities, targets = _check_inputs(probabilities, targets, labels)
    class_ids = list(range(probabilities.shape[1]))
    predictions = probabilities.argmax(axis=1)
    precision, recall, f1, support = precision_recall_fscore_support(targets, predictions, labels=class_ids, zero_division=0)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["label", "support", "precision", "recall", "f1", "roc_auc", "average_precision"])

    def cell(value: float | None) -> str:
        return "" if value is None else repr(float(value))

    for c in class_ids:
        roc, pr = _one_vs_rest(targets, probabilities[:, c], c)
        writer.writerow([labels[c], int(support[c]), cell(precision[c]), cell(recall[c]), cell(f1[c]), cell(roc["auc"]),
                         cell(pr["average_precision"])])
    return buffer.getvalue()


# -- recalibration -------------------------------------------------------------------------------

def fit_temperature(logits: np.ndarray, targets: np.ndarray) -> float:
    """T > 0 minimising the mean NLL of softmax(logits / T), searched over log T in [-4, 4]. Dividing by a
    positive T keeps every argmax."""
    from scipy.optimize import minimize_scalar

    logits = np.asarray(logits, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.int64)
    rows = np.arange(len(targets))

    def mean_nll(log_temperature: float) -> float:
        return float(-_log_softmax(logits / math.exp(log_temperature))[rows, targets].mean())

    result = minimize_scalar(mean_nll, bounds=(-4.0, 4.0), method="bounded", options={"xatol": 1e-6})
    return float(math.exp(result.x))


def fit_isotonic(confidences: np.ndarray, correct: np.ndarray) -> dict[str, list[float]]:
    """A monotone map confidence → P(correct) as steps {"x": [...], "y": [...]} (scikit-learn's isotonic fit)."""
    from sklearn.isotonic import IsotonicRegression

    model = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip")
    model.fit(np.asarray(confidences, dtype=np.float64), np.asarray(correct, dtype=np.float64))
    return {"x": [float(v) for v in model.X_thresholds_], "y": [float(v) for v in model.y_thresholds_]}


def apply_isotonic(mapping: dict[str, list[float]], confidences: np.ndarray) -> np.ndarray:
    return np.interp(np.asarray(confidences, dtype=np.float64), mapping["x"], mapping["y"])


# -- selective risk ------------------------------------------------------------------------------

def clopper_pearson_upper(errors: int, n: int, delta: float) -> float:
    """One-sided upper (1 − delta) Clopper–Pearson bound on an error rate seen as errors / n; 1.0 when n == 0."""
    from scipy.stats import beta

    if n <= 0 or errors >= n:
        return 1.0
    return float(beta.isf(delta, errors + 1, n - errors))  # isf, not ppf(1 - delta): 1 - 1e-30 rounds to 1


def min_items_for_bound(target_error: float, delta: float, searched: int) -> int:
    """The smallest n whose zero-error bound at delta / searched is <= target_error.

    With no errors the bound is 1 − (delta')^(1/n), so n = ⌈ln delta' / ln(1 − target)⌉; the
    neighbours are checked against `clopper_pearson_upper` itself so the two never disagree by rounding."""
    per_candidate = delta / max(searched, 1)
    n = max(1, math.ceil(math.log(per_candidate) / math.log1p(-target_error)))
    while n > 1 and clopper_pearson_upper(0, n - 1, per_candidate) <= target_error:
        n -= 1
    while clopper_pearson_upper(0, n, per_candidate) > target_error:
        n += 1
    return n


class _Coverage:
    """Covered counts and covered errors for any threshold, from one sort."""

    def __init__(self, confidences: np.ndarray, correct: np.ndarray) -> None:
        order = np.argsort(confidences, kind="stable")
        self.sorted = np.asarray(confidences, dtype=np.float64)[order]
        errors = 1 - np.asarray(correct, dtype=np.int64)[order]
        self.n = len(self.sorted)
        # errors_from[i] = errors among sorted[i:], so covered errors at threshold t is errors_from[searchsorted(t)]
        self.errors_from = np.concatenate([np.cumsum(errors[::-1])[::-1], [0]])

    def at(self, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        first = np.searchsorted(self.sorted, thresholds, side="left")
        return self.n - first, self.errors_from[first]


def _upper_bounds(errors: np.ndarray, covered: np.ndarray, delta: float) -> np.ndarray:
    """clopper_pearson_upper for many (errors, n) at once: one scipy call for a whole curve."""
    from scipy.stats import beta

    errors, covered = np.asarray(errors, dtype=np.float64), np.asarray(covered, dtype=np.float64)
    bounds = np.ones_like(errors)
    inside = (covered > 0) & (errors < covered)
    bounds[inside] = beta.isf(delta, errors[inside] + 1, covered[inside] - errors[inside])
    return bounds


def _row(threshold: float, covered: int, errors: int, n: int, sample_rate: float, delta_per_candidate: float,
         task_count: int, review_cost: float | None, error_cost: float | None,
         bound: float | None = None) -> dict[str, Any]:
    coverage = covered / n if n else 0.0
    risk = errors / covered if covered else None
    cost = None
    if review_cost is not None and error_cost is not None:
        cost = _number(_expected_cost(coverage, errors / n if n else 0.0, sample_rate, task_count, review_cost, error_cost))
    return {"threshold": float(threshold), "coverage": float(coverage), "risk": _number(risk),
            "risk_upper": (float(bound) if bound is not None
                           else clopper_pearson_upper(int(errors), int(covered), delta_per_candidate)),
            "workload": float(1 - coverage + sample_rate * coverage), "cost": cost,
            "covered": int(covered), "errors": int(errors)}


def _expected_cost(coverage: Any, covered_error_share: Any, sample_rate: float, task_count: int, review_cost: float,
                   error_cost: float) -> Any:
    # coverage · risk is the covered errors over all items, which stays defined at zero coverage.
    workload = 1 - coverage + sample_rate * coverage
    return review_cost * task_count * workload + error_cost * (1 - sample_rate) * covered_error_share


def _sgr_search(coverage: _Coverage, target_error: float, delta_per_candidate: float,
                steps: int) -> tuple[list[tuple[float, int, int, float]], tuple[float, int, int, float] | None]:
    """Geifman & El-Yaniv's binary search over the sorted confidences (their Algorithm 1: the midpoint
    rounds up, so the lowest confidence is never itself a candidate); returns every searched
    (threshold, covered, errors, bound) and the one of largest coverage whose bound meets the target."""
    low, high = 0, coverage.n - 1
    searched: list[tuple[float, int, int, float]] = []
    for _ in range(steps):
        middle = math.ceil((low + high) / 2)
        threshold = float(coverage.sorted[middle])
        covered, errors = (int(v[0]) for v in coverage.at(np.array([threshold])))
        bound = clopper_pearson_upper(errors, covered, delta_per_candidate)
        searched.append((threshold, covered, errors, bound))
        if bound <= target_error:
            high = middle
        else:
            low = middle
    passing = [candidate for candidate in searched if candidate[3] <= target_error]
    best = max(passing, key=lambda candidate: (candidate[1], -candidate[0])) if passing else None
    return searched, best


def propose_threshold(confidences: np.ndarray, correct: np.ndarray, *, target_error: float, delta: float = 0.05,
                      sample_rate: float = 0.0, task_count: int = 1, review_cost: float | None = None,
                      error_cost: float | None = None, compare: dict[str, float | None] | None = None,
                      max_candidates: int = 200) -> dict[str, Any]:
    """The auto-accept threshold a review flow can use (items with confidence >= threshold skip review).

    1. t_risk: SGR — k = ⌈log2 n⌉ binary-search steps over the sorted confidences, each bound at delta / k,
       so with probability >= 1 − delta the selective risk above the chosen threshold is <= target_error.
    2. t_cost: the least expected cost per item over every distinct confidence and "review everything".
    3. A risk–coverage curve of at most `max_candidates` rows, spread evenly over coverage."""
    if not 0 < target_error <= 0.5:
        raise ValueError(f"target_error: expected a rate in (0, 0.5], got {target_error}")
    if not 0 < delta < 1:
        raise ValueError(f"delta: expected a probability in (0, 1), got {delta}")
    confidences = np.asarray(confidences, dtype=np.float64)
    correct = np.asarray(correct).astype(np.int64)
    n = len(confidences)
    steps = max(1, math.ceil(math.log2(n))) if n > 1 else 1
    needed = min_items_for_bound(target_error, delta, steps)
    if n < needed:
        raise ValueError(f"calibration: the calibration part has {n} items; a bound of {target_error * 100:g} % at "
                         f"δ={delta:g} needs at least {needed} items (with no errors at all, over {steps} searched thresholds)")
    delta_per_candidate = delta / steps
    coverage = _Coverage(confidences, correct)

    def row(threshold: float, covered: int, errors: int) -> dict[str, Any]:
        return _row(threshold, covered, errors, n, sample_rate, delta_per_candidate, task_count, review_cost, error_cost)

    searched, best = _sgr_search(coverage, target_error, delta_per_candidate, steps)
    result: dict[str, Any] = {
        "target_error": float(target_error), "delta": float(delta), "searched": steps,
        "delta_per_candidate": float(delta_per_candidate), "n": n, "sample_rate": float(sample_rate),
        "task_count": int(task_count), "review_cost": _number(review_cost), "error_cost": _number(error_cost),
        # The thresholds SGR tried, in search order: the page can show why it stopped where it did.
        "search": [row(threshold, covered, errors) for threshold, covered, errors, _ in searched],
    }
    if best is None:
        result["risk"] = None
        result["reason"] = (f"no searched threshold's Clopper–Pearson upper bound on the risk (at δ={delta:g}/{steps}) is at or "
                            f"below {target_error * 100:g} %: review everything")
    else:
        result["risk"] = row(best[0], best[1], best[2])

    # Every distinct confidence, ascending, then the "review everything" threshold above the maximum.
    review_everything = max(1.0, float(np.nextafter(coverage.sorted[-1], np.inf)))
    thresholds = np.append(np.unique(coverage.sorted), review_everything)
    covered_all, errors_all = coverage.at(thresholds)
    cost_index: int | None = None
    if review_cost is not None and error_cost is not None:
        costs = _expected_cost(covered_all / n, errors_all / n, sample_rate, task_count, review_cost, error_cost)
        cost_index = int(np.argmin(costs))
        result["cost"] = row(thresholds[cost_index], covered_all[cost_index], errors_all[cost_index])
    else:
        result["cost"] = None
        result["cost_reason"] = "give both review_cost and error_cost to get a cost threshold"

    # The curve: rows nearest to evenly spaced coverages, plus the chosen ones.
    wanted_rows = max(max_candidates - 2, 2)
    coverages = covered_all / n  # descending along `thresholds`
    targets = np.linspace(coverages[0], coverages[-1], wanted_rows)
    picked = set(np.clip(np.searchsorted(-coverages, -targets, side="left"), 0, len(thresholds) - 1).tolist())
    picked.update({0, len(thresholds) - 1})
    if cost_index is not None:
        picked.add(cost_index)
    rows_at = sorted(picked)
    bounds = _upper_bounds(errors_all[rows_at], covered_all[rows_at], delta_per_candidate)
    curve = [_row(thresholds[i], covered_all[i], errors_all[i], n, sample_rate, delta_per_candidate, task_count,
                  review_cost, error_cost, bound=bound) for i, bound in zip(rows_at, bounds, strict=True)]
    if best is not None and all(candidate["threshold"] != best[0] for candidate in curve):
        curve.append(result["risk"])
    curve.sort(key=lambda candidate: candidate["threshold"])
    chosen = {row["threshold"] for row in (result["risk"], result["cost"]) if row is not None}
    while len(curve) > max(max_candidates, len(chosen)):  # only when max_candidates is tiny: drop unchosen rows, inner first
        droppable = [i for i, candidate in enumerate(curve) if candidate["threshold"] not in chosen]
        inner = [i for i in droppable if 0 < i < len(curve) - 1] or droppable
        del curve[inner[len(inner) // 2]]
    result["candidates"] = curve

    result["compared"] = {}
    for name, threshold in (compare or {}).items():
        if threshold is None:
            continue
        covered, errors = (int(v[0]) for v in coverage.at(np.array([float(threshold)])))
        result["compared"][name] = row(float(threshold), covered, errors)
    return result


def measure_threshold(confidences: np.ndarray, correct: np.ndarray, threshold: float, sample_rate: float = 0.0) -> dict[str, Any]:
    """A threshold on held-out data: {n, threshold, coverage, risk, workload, errors_accepted}; errors_accepted is
    the expected count of wrong predictions auto-accepted (covered and not drawn for the audit sample)."""
    confidences = np.asarray(confidences, dtype=np.float64)
    correct = np.asarray(correct).astype(np.int64)
    n = len(confidences)
    covered_mask = confidences >= threshold
    covered = int(covered_mask.sum())
    errors = int((1 - correct[covered_mask]).sum())
    coverage = covered / n if n else 0.0
    return {"n": n, "threshold": float(threshold), "coverage": float(coverage),
            "risk": errors / covered if covered else None, "workload": float(1 - coverage + sample_rate * coverage),
            "errors_accepted": float(errors * (1 - sample_rate)), "errors_covered": errors, "covered": covered}


# -- language models -----------------------------------------------------------------------------

def language_model_report(logits_or_token_nll: np.ndarray, targets: np.ndarray | None = None, *,
                          ignore_index: int | None = None, batch_rows: int = 64) -> dict[str, Any]:
    """{perplexity, bits_per_character, tokens} from (n, T, V) logits and (n, T) targets (torchmetrics'
    Perplexity, fed in batches of rows so the softmax never holds the whole set), or from a 1-D array
    of per-token NLL in nats (exp of its mean). bits_per_character = log2(perplexity), the figure for a
    character-level model."""
    values = np.asarray(logits_or_token_nll)
    if values.ndim == 1:
        tokens = len(values)
        perplexity = math.exp(float(values.astype(np.float64).mean())) if tokens else None
    else:
        if targets is None or values.ndim != 3:
            raise ValueError("logits: expected (n, T, V) logits with (n, T) targets, or a 1-D array of token NLL")
        import torch
        from torchmetrics.text import Perplexity

        metric = Perplexity(ignore_index=ignore_index).set_dtype(torch.float64)
        target_array = np.asarray(targets).astype(np.int64)
        for start in range(0, len(values), max(batch_rows, 1)):
            metric.update(torch.from_numpy(np.ascontiguousarray(values[start:start + batch_rows], dtype=np.float64)),
                          torch.from_numpy(np.ascontiguousarray(target_array[start:start + batch_rows])))
        tokens = int((target_array != ignore_index).sum()) if ignore_index is not None else int(target_array.size)
        perplexity = float(metric.compute()) if tokens else None
    perplexity = _number(perplexity)
    return {"perplexity": perplexity, "bits_per_character": math.log2(perplexity) if perplexity else None, "tokens": tokens}
