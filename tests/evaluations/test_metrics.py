"""trainyard.evaluation: every figure equals scikit-learn's / torchmetrics', the hand-written parts
(bins, bootstrap, temperature, SGR threshold, Clopper–Pearson) behave as their definitions say."""

from __future__ import annotations

import json
import math
from typing import Literal

import numpy as np
import pytest
import torch
from scipy.stats import beta
from sklearn import metrics as skm
from torchmetrics.functional.classification import multiclass_calibration_error
from torchmetrics.functional.classification.calibration_error import _ce_compute
from torchmetrics.functional.text import perplexity as tm_perplexity

from trainyard import evaluation

EXACT = 1e-9


def _predictions(classes: int, n: int = 600, *, empty_class: bool = False, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded probabilities loosely related to the targets; with empty_class, the last class never occurs
    as a target but is still predicted now and then."""
    rng = np.random.default_rng(seed)
    occurring = classes - 1 if empty_class else classes
    targets = rng.integers(0, occurring, size=n)
    logits = rng.normal(size=(n, classes))
    logits[np.arange(n), targets] += 1.2
    return evaluation.softmax(logits), targets


def _point_to_sklearn(report: dict, probabilities: np.ndarray, targets: np.ndarray) -> None:
    classes = probabilities.shape[1]
    ids = list(range(classes))
    predictions = probabilities.argmax(axis=1)
    assert report["accuracy"] == pytest.approx(skm.accuracy_score(targets, predictions), abs=EXACT)
    for average, key in (("macro", "macro_f1"), ("weighted", "weighted_f1")):
        expected = skm.f1_score(targets, predictions, labels=ids, average=average, zero_division=0)
        assert report[key] == pytest.approx(expected, abs=EXACT)
    assert report["macro_precision"] == pytest.approx(
        skm.precision_score(targets, predictions, labels=ids, average="macro", zero_division=0), abs=EXACT)
    assert report["macro_recall"] == pytest.approx(
        skm.recall_score(targets, predictions, labels=ids, average="macro", zero_division=0), abs=EXACT)
    assert report["log_loss"] == pytest.approx(skm.log_loss(targets, probabilities, labels=ids), abs=EXACT)
    assert report["brier"] == pytest.approx(skm.brier_score_loss(targets, probabilities, labels=ids), abs=EXACT)
    precision, recall, f1, support = skm.precision_recall_fscore_support(targets, predictions, labels=ids, zero_division=0)
    for c, row in enumerate(report["per_class"]):
        assert (row["precision"], row["recall"], row["f1"]) == pytest.approx((precision[c], recall[c], f1[c]), abs=EXACT)
        assert row["support"] == support[c]
    assert report["confusion_matrix"] == skm.confusion_matrix(targets, predictions, labels=ids).tolist()


def _curves_to_sklearn(report: dict, probabilities: np.ndarray, targets: np.ndarray, labels: list[str]) -> None:
    for label, roc in report["roc"].items():
        c = labels.index(label)
        truth = targets == c
        if not truth.any():
            assert roc["auc"] is None and report["pr"][label]["average_precision"] is None
            continue
        fpr, tpr, _ = skm.roc_curve(truth, probabilities[:, c])
        assert roc["auc"] == pytest.approx(skm.roc_auc_score(truth, probabilities[:, c]), abs=EXACT)
        assert len(roc["fpr"]) == min(len(fpr), evaluation.MAX_CURVE_POINTS)
        assert (roc["fpr"][0], roc["tpr"][0], roc["fpr"][-1], roc["tpr"][-1]) == (fpr[0], tpr[0], fpr[-1], tpr[-1])
        assert set(zip(roc["fpr"], roc["tpr"], strict=True)) <= set(zip(fpr.tolist(), tpr.tolist(), strict=True))
        pr = report["pr"][label]
        assert pr["average_precision"] == pytest.approx(skm.average_precision_score(truth, probabilities[:, c]), abs=EXACT)
        precision, recall, _ = skm.precision_recall_curve(truth, probabilities[:, c])
        assert (pr["recall"][0], pr["recall"][-1], pr["precision"][-1]) == (recall[0], recall[-1], precision[-1])


def _calibration_to_torchmetrics(report: dict, probabilities: np.ndarray, targets: np.ndarray) -> None:
    calibration = report["calibration"]
    confidences, predictions = probabilities.max(axis=1), probabilities.argmax(axis=1)
    correct = torch.from_numpy((predictions == targets).astype(np.float64))
    norms: tuple[tuple[Literal["l1", "max"], str], ...] = (("l1", "ece_width"), ("max", "mce"))
    for norm, key in norms:
        exact = float(_ce_compute(torch.from_numpy(confidences), correct, 15, norm=norm))
        assert calibration[key] == pytest.approx(exact, abs=EXACT)
        # The public function bins float32 confidences, so it agrees to float32 precision only.
        public = multiclass_calibration_error(torch.from_numpy(probabilities), torch.from_numpy(targets),
                                              num_classes=probabilities.shape[1], n_bins=15, norm=norm)
        assert calibration[key] == pytest.approx(float(public), abs=1e-6)
    n = len(targets)
    for kind, key in (("width", "ece_width"), ("mass", "ece_mass")):
        table = calibration["bins"][kind]
        assert sum(row["count"] for row in table) == n
        weighted = sum(row["count"] / n * abs(row["accuracy"] - row["confidence"]) for row in table if row["count"])
        assert weighted == pytest.approx(calibration[key], abs=EXACT)
    assert len(calibration["bins"]["width"]) in (15, 16)
    masses = [row["count"] for row in calibration["bins"]["mass"]]
    assert max(masses) - min(masses) <= 1


@pytest.mark.parametrize(("classes", "empty_class"), [(2, False), (4, True), (4, False)])
def test_report_figures_equal_the_libraries(classes: int, empty_class: bool) -> None:
    probabilities, targets = _predictions(classes, empty_class=empty_class)
    labels = [f"class-{c}" for c in range(classes)]
    report = evaluation.classification_report(probabilities, targets, labels, bootstrap=200, seed=3)
    json.dumps(report, allow_nan=False)

    _point_to_sklearn(report, probabilities, targets)
    _curves_to_sklearn(report, probabilities, targets, labels)
    _calibration_to_torchmetrics(report, probabilities, targets)
    if classes == 2:
        assert list(report["roc"]) == ["class-1"]
        assert report["roc_auc_macro"] == pytest.approx(skm.roc_auc_score(targets, probabilities[:, 1]), abs=EXACT)
    elif empty_class:
        assert report["per_class"][-1]["support"] == 0 and report["per_class"][-1]["f1"] == 0.0
        assert report["roc_auc_macro"] is None
    else:
        expected = skm.roc_auc_score(targets, probabilities, multi_class="ovr", average="macro")
        assert report["roc_auc_macro"] == pytest.approx(expected, abs=EXACT)

    identity = evaluation.bootstrap_replicates(probabilities, targets, identity=True)
    point = {**{key: report[key] for key in ("accuracy", "macro_f1", "log_loss", "brier")},
             "ece_width": report["calibration"]["ece_width"], "ece_mass": report["calibration"]["ece_mass"]}
    for key, value in point.items():
        assert float(identity[key][0]) == pytest.approx(value, abs=EXACT), key
        low, high = report["intervals"][key]
        assert low <= high and low - 0.02 <= value <= high + 0.02, key


def test_curves_are_limited_to_the_best_supported_classes() -> None:
    probabilities, targets = _predictions(6, n=400, seed=5)
    targets[:150] = 4  # class 4 becomes the best supported
    labels = list("abcdef")
    report = evaluation.classification_report(probabilities, targets, labels, bootstrap=0, curve_classes=3)
    support = np.bincount(targets, minlength=6)
    expected = sorted(range(6), key=lambda c: (-support[c], c))[:3]
    assert list(report["roc"]) == [labels[c] for c in expected] == list(report["pr"])
    assert report["curve_classes_omitted"] == 3
    assert report["intervals"] == {}


def test_bootstrap_is_seeded_and_spreads() -> None:
    probabilities, targets = _predictions(3, n=500)
    first = evaluation.bootstrap_replicates(probabilities, targets, resamples=300, seed=7)
    again = evaluation.bootstrap_replicates(probabilities, targets, resamples=300, seed=7)
    other = evaluation.bootstrap_replicates(probabilities, targets, resamples=300, seed=8)
    assert np.array_equal(first["accuracy"], again["accuracy"])
    assert not np.array_equal(first["accuracy"], other["accuracy"])
    # A resampled accuracy's spread is about sqrt(p(1 - p) / n).
    accuracy = float((probabilities.argmax(axis=1) == targets).mean())
    assert np.std(first["accuracy"]) == pytest.approx(math.sqrt(accuracy * (1 - accuracy) / 500), rel=0.2)


def test_per_class_csv_and_calibration_summary_agree_with_the_libraries() -> None:
    probabilities, targets = _predictions(4, n=300, empty_class=True)
    lines = evaluation.per_class_csv(probabilities, targets, ["a", "b", "c", "d"]).splitlines()
    assert lines[0] == "label,support,precision,recall,f1,roc_auc,average_precision"
    first = lines[1].split(",")
    assert first[0] == "a" and float(first[5]) == pytest.approx(skm.roc_auc_score(targets == 0, probabilities[:, 0]), abs=EXACT)
    assert lines[4].split(",")[1] == "0" and lines[4].split(",")[5] == ""

    summary = evaluation.calibration_summary(probabilities, targets)
    report = evaluation.classification_report(probabilities, targets, ["a", "b", "c", "d"], bootstrap=0)
    assert summary["nll"] == report["log_loss"] and summary["brier"] == report["brier"]
    assert {key: summary[key] for key in ("ece_width", "ece_mass", "mce")} == {
        key: report["calibration"][key] for key in ("ece_width", "ece_mass", "mce")}


def test_temperature_scaling_recovers_an_over_confident_model() -> None:
    rng = np.random.default_rng(0)
    n, classes = 8000, 4
    true_logits = rng.normal(size=(n, classes)) * 1.5
    true_probabilities = evaluation.softmax(true_logits)
    targets = (rng.random(n)[:, None] > np.cumsum(true_probabilities, axis=1)).sum(axis=1)
    logits = true_logits * 3  # same ranking, three times too sharp
    calibration, test = evaluation.split_indices(n, 0.5, seed=1)

    temperature = evaluation.fit_temperature(logits[calibration], targets[calibration])
    assert temperature == pytest.approx(3.0, rel=0.15)
    before = evaluation.calibration_summary(evaluation.softmax(logits[test]), targets[test])
    scaled = evaluation.softmax(logits[test], temperature)
    after = evaluation.calibration_summary(scaled, targets[test])
    assert np.array_equal(scaled.argmax(axis=1), logits[test].argmax(axis=1))
    assert after["nll"] < before["nll"] and after["ece_width"] < before["ece_width"] / 2


def test_isotonic_map_is_monotone_and_clips() -> None:
    rng = np.random.default_rng(2)
    confidences = rng.uniform(0.3, 1.0, 2000)
    correct = rng.random(2000) < confidences**2
    mapping = evaluation.fit_isotonic(confidences, correct)
    assert np.all(np.diff(mapping["y"]) >= 0) and np.all(np.diff(mapping["x"]) >= 0)
    mapped = evaluation.apply_isotonic(mapping, np.array([0.0, 0.5, 2.0]))
    assert mapped[0] == mapping["y"][0] and mapped[2] == mapping["y"][-1]
    assert mapped[1] == pytest.approx(0.25, abs=0.1)


def _selective_scores(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """c ~ U(0.5, 1) with error probability 0.3 (1 − c): the true risk above t is 0.15 (1 − t)."""
    rng = np.random.default_rng(seed)
    confidences = rng.uniform(0.5, 1.0, n)
    return confidences, rng.random(n) >= 0.3 * (1 - confidences)


def _true_risk(threshold: float) -> float:
    return 0.15 * (1 - max(threshold, 0.5))


def _true_risks_at_chosen_thresholds() -> list[float | None]:
    chosen = []
    for seed in range(20):
        confidences, correct = _selective_scores(seed, 2000)
        proposal = evaluation.propose_threshold(confidences, correct, target_error=0.05, delta=0.05)
        chosen.append(None if proposal["risk"] is None else _true_risk(proposal["risk"]["threshold"]))
    return chosen


def test_sgr_threshold_meets_the_target_risk(monkeypatch: pytest.MonkeyPatch) -> None:
    risks = _true_risks_at_chosen_thresholds()
    assert sum(risk is not None for risk in risks) >= 15  # it does choose thresholds, not "review everything"
    assert sum(risk is None or risk <= 0.05 for risk in risks) >= 19

    # The same search on the empirical risk (no bound) overshoots the target about half the time.
    monkeypatch.setattr(evaluation, "clopper_pearson_upper", lambda errors, n, delta: errors / n if n else 1.0)
    empirical = _true_risks_at_chosen_thresholds()
    assert sum(risk is not None and risk > 0.05 for risk in empirical) >= 4


def test_sgr_reports_its_search_and_candidates() -> None:
    confidences, correct = _selective_scores(0, 2000)
    proposal = evaluation.propose_threshold(confidences, correct, target_error=0.05, delta=0.05, sample_rate=0.1,
                                            review_cost=1.0, error_cost=20.0, compare={"current": 0.6, "off": None},
                                            max_candidates=50)
    json.dumps(proposal, allow_nan=False)
    assert proposal["searched"] == 11 and proposal["delta_per_candidate"] == pytest.approx(0.05 / 11)
    risk = proposal["risk"]
    assert risk["risk_upper"] <= 0.05 and risk["risk_upper"] == evaluation.clopper_pearson_upper(
        risk["errors"], risk["covered"], 0.05 / 11)
    assert risk["workload"] == pytest.approx(1 - risk["coverage"] + 0.1 * risk["coverage"])
    assert len(proposal["search"]) == 11 and risk in proposal["search"]
    thresholds = [row["threshold"] for row in proposal["candidates"]]
    assert len(thresholds) <= 50 and thresholds == sorted(thresholds)
    assert risk["threshold"] in thresholds and proposal["cost"]["threshold"] in thresholds
    assert proposal["candidates"][0]["coverage"] == 1.0 and proposal["candidates"][-1]["coverage"] == 0.0
    assert list(proposal["compared"]) == ["current"]
    assert proposal["compared"]["current"]["coverage"] == pytest.approx(float((confidences >= 0.6).mean()))


@pytest.mark.parametrize("seed", [1, 3])
def test_sgr_keeps_the_searched_threshold_of_largest_coverage_meeting_the_bound(seed: int) -> None:
    # With these seeds the last threshold searched fails the bound, so returning it (the paper's literal
    # output) would break the target.
    confidences, correct = _selective_scores(seed, 2000)
    proposal = evaluation.propose_threshold(confidences, correct, target_error=0.05)
    passing = [row for row in proposal["search"] if row["risk_upper"] <= 0.05]
    assert proposal["search"][-1]["risk_upper"] > 0.05
    assert proposal["risk"] == max(passing, key=lambda row: row["coverage"])


def test_a_short_curve_still_holds_both_chosen_rows() -> None:
    confidences, correct = _selective_scores(2, 2000)
    proposal = evaluation.propose_threshold(confidences, correct, target_error=0.05, review_cost=1.0, error_cost=5.0,
                                            max_candidates=3)
    thresholds = [row["threshold"] for row in proposal["candidates"]]
    assert len(thresholds) == 3
    assert proposal["risk"]["threshold"] in thresholds and proposal["cost"]["threshold"] in thresholds


def test_cost_threshold_is_the_brute_force_minimum() -> None:
    confidences, correct = _selective_scores(4, 300)
    confidences = np.round(confidences, 2)  # ties, so distinct thresholds matter
    review_cost, error_cost, sample_rate, task_count = 1.0, 12.0, 0.05, 2
    proposal = evaluation.propose_threshold(confidences, correct, target_error=0.1, delta=0.1, sample_rate=sample_rate,
                                            task_count=task_count, review_cost=review_cost, error_cost=error_cost)

    def cost(threshold: float) -> float:
        covered = confidences >= threshold
        coverage = covered.mean()
        risk = (~correct[covered]).mean() if covered.any() else 0.0
        workload = 1 - coverage + sample_rate * coverage
        return review_cost * task_count * workload + error_cost * coverage * (1 - sample_rate) * risk

    brute = min(cost(t) for t in [*np.unique(confidences), 1.01])
    assert proposal["cost"]["cost"] == pytest.approx(brute, abs=EXACT)
    assert cost(proposal["cost"]["threshold"]) == pytest.approx(brute, abs=EXACT)
    without = evaluation.propose_threshold(confidences, correct, target_error=0.1, delta=0.1)
    assert without["cost"] is None and without["candidates"][0]["cost"] is None


def test_no_threshold_meeting_the_bound_says_review_everything() -> None:
    confidences, correct = _selective_scores(1, 400)
    correct[:] = np.random.default_rng(0).random(400) > 0.3  # 30 % errors at every confidence
    proposal = evaluation.propose_threshold(confidences, correct, target_error=0.05)
    assert proposal["risk"] is None and "review everything" in proposal["reason"]


@pytest.mark.parametrize(("arguments", "field"), [({"target_error": 0.0}, "target_error"), ({"target_error": 0.6}, "target_error"),
                                                  ({"target_error": 0.05, "delta": 0.0}, "delta"),
                                                  ({"target_error": 0.05, "delta": 1.0}, "delta")])
def test_bad_arguments_name_their_field(arguments: dict, field: str) -> None:
    confidences, correct = _selective_scores(0, 500)
    with pytest.raises(ValueError, match=f"^{field}: "):
        evaluation.propose_threshold(confidences, correct, **arguments)


def test_too_small_calibration_part_says_how_many_items_it_needs() -> None:
    confidences, correct = _selective_scores(0, 50)
    needed = evaluation.min_items_for_bound(0.01, 0.05, 6)
    with pytest.raises(ValueError, match=f"^calibration: the calibration part has 50 items; .* at least {needed} "):
        evaluation.propose_threshold(confidences, correct, target_error=0.01)


@pytest.mark.parametrize(("target", "delta", "searched"), [(0.05, 0.05, 11), (0.01, 0.1, 1), (0.2, 0.01, 7), (0.001, 0.05, 14)])
def test_min_items_is_the_first_n_whose_zero_error_bound_meets_the_target(target: float, delta: float, searched: int) -> None:
    n = evaluation.min_items_for_bound(target, delta, searched)
    assert evaluation.clopper_pearson_upper(0, n, delta / searched) <= target
    assert evaluation.clopper_pearson_upper(0, n - 1, delta / searched) > target


def test_clopper_pearson_upper() -> None:
    assert evaluation.clopper_pearson_upper(0, 0, 0.05) == 1.0
    assert evaluation.clopper_pearson_upper(5, 5, 0.05) == 1.0
    assert evaluation.clopper_pearson_upper(0, 100, 0.05) == pytest.approx(1 - 0.05 ** (1 / 100), abs=EXACT)
    assert evaluation.clopper_pearson_upper(7, 200, 0.05) == pytest.approx(beta.ppf(0.95, 8, 193), abs=EXACT)


def test_measure_threshold_on_held_out_items() -> None:
    confidences = np.array([0.2, 0.6, 0.7, 0.9, 0.95])
    correct = np.array([0, 1, 0, 1, 1])
    measured = evaluation.measure_threshold(confidences, correct, 0.6, sample_rate=0.5)
    assert measured["coverage"] == 0.8 and measured["risk"] == 0.25
    assert measured["workload"] == pytest.approx(0.2 + 0.4) and measured["errors_accepted"] == 0.5
    assert evaluation.measure_threshold(confidences, correct, 0.99)["risk"] is None


def test_language_model_report_is_torchmetrics_perplexity() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 7, 11))
    targets = rng.integers(0, 11, size=(5, 7))
    targets[0, :3] = -100
    report = evaluation.language_model_report(logits, targets, ignore_index=-100, batch_rows=2)
    expected = float(tm_perplexity(torch.from_numpy(logits), torch.from_numpy(targets), ignore_index=-100))
    assert report["perplexity"] == pytest.approx(expected, abs=EXACT)
    assert report["bits_per_character"] == pytest.approx(math.log2(expected), abs=EXACT) and report["tokens"] == 32
    log_probabilities = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    keep = targets != -100
    token_nll = -np.take_along_axis(log_probabilities, np.where(keep, targets, 0)[..., None], axis=-1)[..., 0][keep]
    assert evaluation.language_model_report(token_nll)["perplexity"] == pytest.approx(expected, abs=EXACT)


def test_softmax_and_split() -> None:
    probabilities = evaluation.softmax(np.array([[1000.0, 0.0], [0.0, 0.0]]))
    assert probabilities.dtype == np.float64 and np.allclose(probabilities, [[1.0, 0.0], [0.5, 0.5]])
    calibration, test = evaluation.split_indices(10, 0.3, seed=4)
    assert len(calibration) == 3 and sorted([*calibration, *test]) == list(range(10))
    assert list(calibration) == sorted(calibration) and np.array_equal(calibration, evaluation.split_indices(10, 0.3, seed=4)[0])
    tiny = evaluation.split_indices(2, 0.01)
    assert len(tiny[0]) == 1 and len(tiny[1]) == 1


def test_a_tiny_delta_gives_the_exact_bound_at_once():
    """ppf(1 - δ) rounds 1 - 1e-30 to 1 (a bound of 1 for every n, and min_items_for_bound never
    stopped); the inverse survival function keeps it: with no error the bound is 1 - δ^(1/n)."""
    delta = 1e-30
    n = evaluation.min_items_for_bound(0.02, delta, 10)
    assert evaluation.clopper_pearson_upper(0, n, delta / 10) <= 0.02 < evaluation.clopper_pearson_upper(0, n - 1, delta / 10)
    assert evaluation.clopper_pearson_upper(0, n, delta / 10) == pytest.approx(1 - (delta / 10) ** (1 / n), rel=1e-9)
