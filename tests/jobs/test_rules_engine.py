"""Golden tests for jobs.rules.engine (Django-free, no database): each built-in on
synthetic curves (decreasing, plateau, overfitting, stalling, NaN at step k), the custom
"M of N" alarm with hand-computed transitions, missing-data policies, cool-down, warm-up,
the "never got data" record, and the checking of rule specs."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from jobs.rules.engine import (
    ACTION_TYPES,
    ALARM,
    BUILTIN_TYPES,
    DEFAULT_RULES,
    INSUFFICIENT_DATA,
    OK,
    RULE_TYPES,
    GpuSample,
    Point,
    RuleError,
    Transition,
    check_rule,
    check_rules,
    evaluator,
)

T0 = 1_700_000_000.0


def make(rule: dict | str, *, started_at: float = T0, state: str = INSUFFICIENT_DATA):
    return evaluator(check_rule(rule), started_at=started_at, state=state)


def curve(name: str, values: dict[int, float] | list[tuple[int, float]], *, rank: int = 0,
          seconds_per_step: float = 1.0) -> list[Point]:
    items = values.items() if isinstance(values, dict) else values
    return [Point(name, step, value, T0 + step * seconds_per_step, rank) for step, value in items]


def steps_and_states(transitions: list[Transition]) -> list[tuple[int | None, str]]:
    return [(t.step, t.to_state) for t in transitions]


def assert_json_safe(transitions: list[Transition]) -> None:
    for t in transitions:
        json.dumps(t.values, allow_nan=False)
        assert t.reason and t.from_state != t.to_state or t.values.get("never_got_data")


def feed_one_by_one(ev, points: list[Point]) -> list[Transition]:
    out: list[Transition] = []
    for point in points:
        out += ev.observe([point])
    return out


# --- non_finite -----------------------------------------------------------------------------

def test_non_finite_fires_exactly_at_the_nan_point_and_stays_alarm():
    ev = make("non_finite")
    assert ev.state == INSUFFICIENT_DATA
    assert ev.reason == "waiting for the first point of a metric matching '(?i)loss'"
    points = curve("train_loss", {s: (math.nan if s == 40 else 1.0 / s) for s in range(1, 101)})
    transitions = ev.observe(points)
    assert steps_and_states(transitions) == [(1, OK), (40, ALARM)]
    alarm = transitions[1]
    assert alarm.reason == "train_loss was NaN at step 40 (rank 0)"
    assert alarm.values == {"metric": "train_loss", "value": "NaN", "step": 40, "rank": 0}
    assert alarm.at == T0 + 40 and alarm.fire
    assert_json_safe(transitions)
    # A diverged run does not recover: finite points afterwards change nothing.
    assert ev.observe(curve("train_loss", {101: 0.5})) == []
    assert ev.state == ALARM


def test_non_finite_watches_every_rank_and_only_loss_like_metrics():
    ev = make("non_finite")
    batch = [Point("accuracy", 1, math.nan, T0), Point("train_loss", 1, 0.9, T0 + 1, rank=0),
             Point("val_Loss", 1, math.inf, T0 + 2, rank=3), Point("train_loss", 2, -math.inf, T0 + 3, rank=0)]
    transitions = ev.observe(batch)
    assert steps_and_states(transitions) == [(1, OK), (1, ALARM)]
    assert transitions[1].reason == "val_Loss was Infinity at step 1 (rank 3)"
    assert transitions[1].values["value"] == "Infinity"


def test_non_finite_first_point_nan_goes_straight_to_alarm():
    ev = make({"type": "non_finite", "parameters": {"metrics": "^loss$"}})
    transitions = ev.observe([Point("loss", 7, math.nan, T0, rank=2), Point("loss", 8, 1.0, T0 + 1)])
    assert [(t.from_state, t.to_state, t.step) for t in transitions] == [(INSUFFICIENT_DATA, ALARM, 7)]


def test_non_finite_ignores_other_metrics_while_waiting():
    ev = make("non_finite")
    assert ev.observe(curve("accuracy", {1: math.nan, 2: 0.5})) == []
    assert ev.state == INSUFFICIENT_DATA


def test_non_finite_finite_sum_overflow_is_not_an_alarm():
    ev = make("non_finite")
    transitions = ev.observe(curve("train_loss", {1: 1e308, 2: 1e308, 3: 1e308}))
    assert steps_and_states(transitions) == [(1, OK)]


def test_non_finite_with_a_pattern_that_backtracks_without_end_never_freezes_the_watcher():
    # Python's re would take hours on this name under (a|aa)+$ (and hold the GIL): the
    # watcher evaluates every job's rules, so the match is cut off and the name not watched.
    import threading

    ev = make({"type": "non_finite", "parameters": {"metrics": r"(?i)loss|(a|aa)+$"}})
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(ev.observe(
        curve("a" * 60 + "!", {1: math.nan}) + curve("train_loss", {2: math.nan}))), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the rule is stuck in a regex"
    assert steps_and_states(out) == [(2, ALARM)]


# --- loss_not_decreasing --------------------------------------------------------------------

def test_loss_not_decreasing_on_a_decreasing_curve_stays_ok():
    ev = make("loss_not_decreasing")
    transitions = ev.observe(curve("train_loss", {s: 1.0 / s for s in range(1, 301)}))
    assert steps_and_states(transitions) == [(11, OK)]  # the first comparison: step 11 with step 1


def test_loss_not_decreasing_plateau_fires_num_steps_into_it():
    values = {s: (1.0 / s if s <= 50 else 1.0 / 50) for s in range(1, 101)}
    ev = make("loss_not_decreasing")
    transitions = ev.observe(curve("train_loss", values))
    # Checked every 10 steps from the first comparison (11, 21, …): step 51 still compares
    # with step 41 (a fall); step 61 with step 51 (0 %).
    assert steps_and_states(transitions) == [(11, OK), (61, ALARM)]
    assert "changed by 0 % over 10 steps (51 → 61, 0.02 → 0.02)" in transitions[1].reason
    assert transitions[1].values["decrease_percent"] == 0.0
    # The same curve point by point gives the same transitions.
    assert steps_and_states(feed_one_by_one(make("loss_not_decreasing"), curve("train_loss", values))) == [(11, OK), (61, ALARM)]
    # A fall again clears it.
    again = ev.observe(curve("train_loss", {101: 0.01}))
    assert steps_and_states(again) == [(101, OK)]


def test_loss_not_decreasing_counts_steps_not_points_and_checks_once_per_num_steps():
    # A noisy but falling loss logged every 2 steps: each point against the one num_steps
    # points back flipped OK/ALARM at nearly every point (hundreds of notifications).
    values = {s: 1.0 / s * (1.3 if (s // 2) % 2 else 1.0) for s in range(2, 2002, 2)}
    ev = make({"type": "loss_not_decreasing", "parameters": {"num_steps": 50}})
    transitions = ev.observe(curve("train_loss", values))
    first = transitions[0]
    assert first.values["step"] - first.values["previous_step"] == 50  # 50 steps: 25 points
    checks = range(first.step, 2001, 50)
    assert len(transitions) <= len(checks) and {t.step for t in transitions} <= set(checks)
    assert steps_and_states(transitions)[0] == (52, OK)  # the first check: step 52 with step 2


def test_loss_not_decreasing_warmup_and_rank_zero_only():
    rule = {"type": "loss_not_decreasing", "parameters": {"num_steps": 5, "warmup_steps": 100}}
    ev = make(rule)
    flat = curve("train_loss", {s: 1.0 for s in range(1, 100)})
    other_rank = curve("train_loss", {s: 1.0 for s in range(100, 200)}, rank=1)
    assert ev.observe(flat + other_rank) == []
    assert ev.state == INSUFFICIENT_DATA
    transitions = ev.observe(curve("train_loss", {s: 1.0 for s in range(100, 110)}))
    assert steps_and_states(transitions) == [(105, ALARM)]


def test_loss_not_decreasing_skips_replayed_steps_of_a_resumed_run():
    ev = make({"type": "loss_not_decreasing", "parameters": {"num_steps": 3}})
    ev.observe(curve("train_loss", {s: 10.0 - s for s in range(1, 9)}))
    assert ev.state == OK
    # The run resumes from step 5 and re-sends 5..8 with the same values: no self-comparison.
    assert ev.observe(curve("train_loss", {s: 10.0 - s for s in range(5, 9)})) == []
    assert ev.state == OK


# --- overfit ---------------------------------------------------------------------------------

def overfit_stream(turn_at: int = 50) -> list[Point]:
    points = []
    for step in range(1, 101):
        points.append(Point("train_loss", step, 1.0 / step, T0 + step))
        if step % 10 == 0:
            validation = 1.05 / step if step <= turn_at else 0.04
            points.append(Point("validation_loss", step, validation, T0 + step + 0.5))
    return points


def test_overfit_fires_at_the_first_validation_point_past_the_gap():
    ev = make("overfit")
    transitions = ev.observe(overfit_stream())
    assert steps_and_states(transitions) == [(10, OK), (60, ALARM)]
    alarm = transitions[1]
    assert alarm.values["train_step"] == 60
    assert alarm.values["ratio"] == pytest.approx(0.04 * 60 - 1)
    assert "validation_loss 0.04 is 140 % above train_loss" in alarm.reason
    assert_json_safe(transitions)


def test_overfit_patience_and_decreasing_curves():
    ev = make({"type": "overfit", "parameters": {"patience": 2}})
    assert steps_and_states(ev.observe(overfit_stream())) == [(10, OK), (70, ALARM)]
    healthy = make("overfit")
    assert steps_and_states(healthy.observe(overfit_stream(turn_at=1000))) == [(10, OK)]


def test_overfit_matches_validation_with_the_train_point_received_before_it():
    ev = make("overfit")
    # The validation point of step 10 arrives before train step 10: train step 9 is its match.
    points = [Point("train_loss", 9, 1.0, T0), Point("validation_loss", 10, 1.05, T0 + 1), Point("train_loss", 10, 0.5, T0 + 2)]
    transitions = ev.observe(points)
    assert [(t.values["train_step"], t.to_state) for t in transitions] == [(9, OK)]


def test_overfit_start_step_ignores_early_validation():
    ev = make({"type": "overfit", "parameters": {"start_step": 1000}})
    assert ev.observe(overfit_stream()) == []
    assert ev.state == INSUFFICIENT_DATA


# --- overtraining ----------------------------------------------------------------------------

def test_overtraining_fires_after_patience_of_window_evaluations_without_improvement():
    values = [1.0, 0.8, 0.6, 0.5, 0.45, 0.46, 0.47, 0.48, 0.49, 0.5, 0.51]
    ev = make("overtraining")
    transitions = ev.observe(curve("validation_loss", {10 * (i + 1): v for i, v in enumerate(values)}))
    assert steps_and_states(transitions) == [(10, OK), (100, ALARM)]
    assert transitions[1].reason.startswith("validation_loss not improving for 5 of the last 10 evaluations (best 0.45 at step 50")


def test_overtraining_decreasing_curve_and_max_mode_and_delta():
    ev = make("overtraining")
    assert steps_and_states(ev.observe(curve("validation_loss", {s: 1.0 / s for s in range(1, 50)}))) == [(1, OK)]
    accuracy = make({"type": "overtraining", "parameters": {"metric": "validation_accuracy", "mode": "max", "patience": 2,
                                                            "window": 3, "delta": 0.01}})
    # 0.5 (best), 0.505 (not by more than delta), 0.6 (best), 0.601 (not): 2 of the last 3 → ALARM at step 4.
    transitions = accuracy.observe(curve("validation_accuracy", {1: 0.5, 2: 0.505, 3: 0.6, 4: 0.601, 5: 0.602}))
    assert steps_and_states(transitions) == [(1, OK), (4, ALARM)]


# --- stalled ---------------------------------------------------------------------------------

def test_stalled_alarm_on_tick_and_ok_on_activity():
    ev = make({"type": "stalled", "parameters": {"threshold_seconds": 30}})
    assert ev.tick(T0 + 10) == [Transition(INSUFFICIENT_DATA, OK, T0 + 10, "last metric or log line 10 s ago (limit 30 s)",
                                           {"last_activity_at": T0, "silent_seconds": 10.0, "threshold_seconds": 30.0}, None)]
    assert ev.observe(curve("train_loss", {5: 1.0})) == []  # at T0 + 5: OK already
    alarm = ev.tick(T0 + 36)
    assert [(t.to_state, t.reason) for t in alarm] == [(ALARM, "no metric or log line for 31 s (limit 30 s)")]
    assert alarm[0].at == T0 + 36
    ev.observe_activity(T0 + 40)  # a log line: the OK comes out of the next call
    back = ev.tick(T0 + 41)
    assert [(t.from_state, t.to_state, t.at) for t in back] == [(ALARM, OK, T0 + 40)]
    assert steps_and_states(ev.tick(T0 + 71)) == [(None, ALARM)]
    assert [(t.to_state, t.at) for t in ev.observe(curve("train_loss", {80: 1.0}))] == [(OK, T0 + 80)]


def test_stalled_counts_from_the_start():
    ev = make({"type": "stalled", "parameters": {"threshold_seconds": 60}})
    assert steps_and_states(ev.tick(T0 + 61)) == [(None, ALARM)]


# --- max_init_time ---------------------------------------------------------------------------

def test_max_init_time_alarm_without_a_first_step_and_ok_with_one():
    late = make("max_init_time")
    assert late.tick(T0 + 600) == []
    assert late.state == INSUFFICIENT_DATA
    transitions = late.tick(T0 + 1300)
    assert [(t.to_state, t.reason) for t in transitions] == [(ALARM, "no first step 1300 s after the start (limit 1200 s)")]
    assert late.observe(curve("train_loss", {1: 1.0}, seconds_per_step=1400)) == []  # late: stays ALARM
    in_time = make("max_init_time")
    assert [(t.to_state, t.at) for t in in_time.observe(curve("train_loss", {1: 1.0}, seconds_per_step=100))] == [(OK, T0 + 100)]
    by_tick = make("max_init_time")
    assert steps_and_states(by_tick.tick(T0 + 2000, first_step_at=T0 + 50)) == [(None, OK)]


# --- low_gpu_utilization ---------------------------------------------------------------------

def test_low_gpu_utilization_names_the_host_and_gpu_after_warmup():
    ev = make({"type": "low_gpu_utilization", "parameters": {"window": 100, "warmup_samples": 50}})
    samples = [GpuSample("node-a", gpu, 0.0, T0 + i) for i in range(50) for gpu in (0, 1)]  # warm-up: idle, ignored
    assert ev.observe_gpu(samples) == []
    history: dict[int, list[float]] = {0: [], 1: []}
    transitions = []
    expected_alarm_at = None
    for i in range(300):
        for gpu in (0, 1):
            value = 90.0 if gpu == 0 or i < 20 else 20.0
            history[gpu].append(value)
            transitions += ev.observe_gpu([GpuSample("node-a", gpu, value, T0 + 100 + i)])
            window = history[gpu][-100:]
            if (expected_alarm_at is None and len(window) >= 10
                    and (np.percentile(window, 95) < 70 or np.percentile(window, 5) < 10)):
                expected_alarm_at = T0 + 100 + i
    assert [t.to_state for t in transitions] == [OK, ALARM]
    alarm = transitions[1]
    assert alarm.at == expected_alarm_at
    assert alarm.values["host"] == "node-a" and alarm.values["gpu_index"] == 1
    assert alarm.values["p95"] < 70
    assert "GPU 1 on node-a: p95" in alarm.reason
    assert_json_safe(transitions)


def test_low_gpu_utilization_p5_catches_an_idle_share():
    ev = make({"type": "low_gpu_utilization", "parameters": {"window": 100, "warmup_samples": 0}})
    samples = [GpuSample("h", 3, 0.0 if i % 10 == 0 else 95.0, T0 + i) for i in range(100)]
    transitions = ev.observe_gpu(samples)  # one call: evaluated once, at its latest sample
    assert [(t.to_state, t.at, t.values["gpu_index"]) for t in transitions] == [(ALARM, T0 + 99, 3)]
    assert transitions[0].values["p5"] < 10 <= transitions[0].values["p95"]


# --- step_outlier ----------------------------------------------------------------------------

def test_step_outlier_fires_on_a_slow_step_and_clears_on_the_next():
    points, clock = [], T0
    for step in range(1, 201):
        clock += 2.0 if step == 150 else 0.1 + 0.001 * ((step * 7) % 5)
        points.append(Point("train_loss", step, 1.0, clock))
    ev = make("step_outlier")
    transitions = ev.observe(points)
    assert steps_and_states(transitions) == [(12, OK), (150, ALARM), (151, OK)]
    alarm = transitions[1]
    assert alarm.values["step_seconds"] == pytest.approx(2.0)
    assert alarm.values["mean"] == pytest.approx(0.102, abs=0.002)
    assert steps_and_states(feed_one_by_one(make("step_outlier"), points)) == [(12, OK), (150, ALARM), (151, OK)]


def test_step_outlier_restart_gap_is_not_a_step_time():
    points = [Point("train_loss", s, 1.0, T0 + s) for s in range(1, 30)]
    # Resumed from step 20 after an hour's gap, then regular again.
    points += [Point("train_loss", s, 1.0, T0 + 3600 + s) for s in range(20, 40)]
    ev = make("step_outlier")
    assert steps_and_states(ev.observe(points)) == [(12, OK)]


# --- budget ----------------------------------------------------------------------------------

def test_budget_on_cost_and_projected_cost():
    ev = make({"type": "budget", "parameters": {"limit": 100}})
    assert ev.tick(T0 + 1) == []
    assert steps_and_states(ev.tick(T0 + 2, cost=10.0, projected_cost=50.0)) == [(None, OK)]
    alarm = ev.tick(T0 + 3, cost=20.0, projected_cost=150.0)
    assert [(t.to_state, t.reason) for t in alarm] == [
        (ALARM, "projected cost passes the limit 100.00 (cost 20.00, projected 150.00)")]
    assert check_rule({"type": "budget", "parameters": {"limit": 100}})["actions"] == [{"type": "stop"}]
    actual_only = make({"type": "budget", "parameters": {"limit": 100, "projected": False}})
    assert steps_and_states(actual_only.tick(T0, cost=20.0, projected_cost=150.0)) == [(None, OK)]
    assert steps_and_states(actual_only.tick(T0, cost=120.0, projected_cost=150.0)) == [(None, ALARM)]


# --- custom: M of N --------------------------------------------------------------------------

MEAN_2_OF_3 = {"type": "custom", "name": "loss-high", "parameters": {
    "metric": "train_loss", "statistic": "mean", "window": 2, "comparison": ">", "threshold": 1.0,
    "datapoints_to_alarm": 2, "evaluation_periods": 3}}
# Periods of two points (closing at even steps): 0.6 N, 1.6 B, 0.3 N | 2.0 B | 0.1 N | 3.0 B | 3.0 B | 0 N | 0 N
MEAN_CURVE = {1: 0.5, 2: 0.7, 3: 1.5, 4: 1.7, 5: 0.2, 6: 0.4, 7: 2.0, 8: 2.0, 9: 0.1, 10: 0.1, 11: 3, 12: 3,
              13: 3, 14: 3, 15: 0, 16: 0, 17: 0, 18: 0}
MEAN_EXPECTED = [(6, OK), (8, ALARM), (10, OK), (12, ALARM), (18, OK)]


def test_custom_m_of_n_fires_exactly_when_its_definition_says():
    ev = make(MEAN_2_OF_3)
    transitions = ev.observe(curve("train_loss", MEAN_CURVE))
    assert steps_and_states(transitions) == MEAN_EXPECTED
    alarm = transitions[1]
    assert alarm.values["datapoints"] == pytest.approx([1.6, 0.3, 2.0])
    assert alarm.values["breaching"] == [True, False, True]
    assert alarm.reason.startswith("2 of the last 3 datapoints breached (2 of 3 alarm): the mean of train_loss over 2 point(s) > 1")
    assert_json_safe(transitions)
    # Point by point, and in uneven batches, the same.
    assert steps_and_states(feed_one_by_one(make(MEAN_2_OF_3), curve("train_loss", MEAN_CURVE))) == MEAN_EXPECTED
    points, uneven, chunked = curve("train_loss", MEAN_CURVE), make(MEAN_2_OF_3), []
    for start, end in ((0, 3), (3, 4), (4, 11), (11, 18)):
        chunked += uneven.observe(points[start:end])
    assert steps_and_states(chunked) == MEAN_EXPECTED


def test_custom_m_breaching_alarms_before_n_datapoints_exist():
    ev = make(MEAN_2_OF_3)
    assert steps_and_states(ev.observe(curve("train_loss", {1: 2, 2: 2, 3: 2, 4: 2}))) == [(4, ALARM)]
    waiting = make(MEAN_2_OF_3)
    assert waiting.observe(curve("train_loss", {1: 0, 2: 0, 3: 0, 4: 0})) == []  # 2 of 3 periods, none breaching
    assert waiting.state == INSUFFICIENT_DATA


def test_custom_comparisons_and_cloudwatch_names():
    rule = check_rule({"type": "custom", "parameters": {"metric": "acc", "comparison": "LessThanOrEqualToThreshold",
                                                        "threshold": 0.5}})
    assert rule["parameters"]["comparison"] == "<="
    assert rule["name"] == "custom-acc"
    ev = evaluator(rule, started_at=T0)
    assert steps_and_states(ev.observe(curve("acc", {1: 0.6, 2: 0.5, 3: 0.7}))) == [(1, OK), (2, ALARM), (3, OK)]


def test_custom_compare_to_previous_window():
    rule = {"type": "custom", "parameters": {"metric": "train_loss", "compare_to": "previous_window", "comparison": ">",
                                             "threshold": 0.5}}
    ev = make(rule)
    # Changes: +20 % (N), +66.7 % (B), +5 % (N); the first window only sets the base.
    transitions = ev.observe(curve("train_loss", {1: 1.0, 2: 1.2, 3: 2.0, 4: 2.1}))
    assert steps_and_states(transitions) == [(2, OK), (3, ALARM), (4, OK)]
    assert transitions[1].values["datapoints"] == [pytest.approx(2.0 / 1.2 - 1)]
    assert check_rule(rule | {"parameters": {"metric": "x", "compare_to": "previous_window"}})["parameters"]["threshold"] == 0.0
    # Threshold 0 with "<": any window lower than the one before.
    falling = make({"type": "custom", "parameters": {"metric": "m", "compare_to": "previous_window", "comparison": "<",
                                                     "window": 2, "statistic": "max"}})
    assert steps_and_states(falling.observe(curve("m", {1: 5, 2: 6, 3: 4, 4: 6.5, 5: 1, 6: 2}))) == [(4, OK), (6, ALARM)]


def test_custom_percentile_statistics():
    values = {s: float(s) for s in range(1, 11)}  # one window of 10: p90 = 9.1, p50 = 5.5 (linear)
    p90 = make({"type": "custom", "parameters": {"metric": "m", "statistic": "p90", "window": 10, "threshold": 9.0}})
    transitions = p90.observe(curve("m", values))
    assert steps_and_states(transitions) == [(10, ALARM)]
    assert transitions[0].values["datapoints"] == [pytest.approx(np.percentile(list(values.values()), 90))]
    p50 = make({"type": "custom", "parameters": {"metric": "m", "statistic": "p50", "window": 10, "comparison": ">",
                                                 "threshold": 5.5}})
    assert steps_and_states(p50.observe(curve("m", values))) == [(10, OK)]
    assert check_rule({"type": "custom", "parameters": {"metric": "m", "statistic": "p099", "threshold": 1}})[
        "parameters"]["statistic"] == "p99"
    assert check_rule({"type": "custom", "parameters": {"metric": "m", "statistic": "p99.9", "threshold": 1}})[
        "parameters"]["statistic"] == "p99.9"
    for bad in ("p101", "p-1", "median", "p", 90):
        with pytest.raises(RuleError) as info:
            check_rule({"type": "custom", "parameters": {"metric": "m", "statistic": bad, "threshold": 1}})
        assert info.value.field == "parameters.statistic"


@pytest.mark.parametrize(("statistic", "expected"), [("last", 3.0), ("mean", 2.0), ("min", 1.0), ("max", 3.0), ("sum", 6.0)])
def test_custom_simple_statistics(statistic, expected):
    ev = make({"type": "custom", "parameters": {"metric": "m", "statistic": statistic, "window": 3, "threshold": 100}})
    transitions = ev.observe(curve("m", {1: 2.0, 2: 1.0, 3: 3.0}))
    assert transitions[0].values["datapoints"] == [expected]


def missing_rule(policy: str) -> dict:
    return {"type": "custom", "parameters": {"metric": "m", "threshold": 1.0, "evaluation_periods": 2,
                                             "missing_after_seconds": 60, "treat_missing_data": policy}}


def test_custom_missing_data_policy_missing():
    ev = make(missing_rule("missing"))
    assert steps_and_states(ev.observe(curve("m", {10: 0.0, 20: 0.0}))) == [(20, OK)]
    assert ev.tick(T0 + 70) == []  # 50 s since the last point
    transitions = ev.tick(T0 + 200)  # 180 s: three missing periods, two fill the window
    assert [(t.from_state, t.to_state, t.at) for t in transitions] == [(OK, INSUFFICIENT_DATA, T0 + 200)]
    assert transitions[0].reason == "no datapoint in the last 2 period(s): no point of m for 180 s (a period is missing after 60 s)"
    assert transitions[0].values["datapoints"] == [None, None]
    # Data again: [missing, breaching] is 1 of 2 (OK), then [breaching, breaching].
    assert steps_and_states(ev.observe(curve("m", {300: 5.0, 310: 5.0}))) == [(300, OK), (310, ALARM)]


def test_a_rule_whose_data_went_missing_does_not_say_at_the_end_it_never_got_data():
    # Found by a new user: OK, then INSUFFICIENT_DATA when m stopped coming, then the job's
    # end recorded "the job ended before this rule got data" though it had judged two points.
    ev = make(missing_rule("missing"))
    ev.observe(curve("m", {10: 0.0, 20: 0.0}))
    assert steps_and_states(ev.tick(T0 + 200)) == [(None, INSUFFICIENT_DATA)]
    assert ev.tick(T0 + 300, finished=True) == []
    assert ev.reason.startswith("no datapoint in the last 2 period(s)")
    # A watcher restarted on such a rule knows it too (the engine is told it had data).
    restored = evaluator(check_rule(missing_rule("missing")), started_at=T0, state=INSUFFICIENT_DATA, had_data=True)
    assert restored.tick(T0 + 300, finished=True) == []
    [record] = make(missing_rule("missing")).tick(T0 + 300, finished=True)
    assert record.values["never_got_data"] is True


def test_custom_missing_data_policy_breaching():
    ev = make(missing_rule("breaching"))
    ev.observe(curve("m", {10: 0.0, 20: 0.0}))
    assert [(t.to_state, t.at) for t in ev.tick(T0 + 200)] == [(ALARM, T0 + 200)]
    # No data at all from the start is breaching too: a rule that alarms on silence.
    silent = make(missing_rule("breaching"))
    assert silent.tick(T0 + 59) == []
    assert steps_and_states(silent.tick(T0 + 125)) == [(None, ALARM)]
    # A NaN datapoint follows the policy as well.
    nan = make(missing_rule("breaching") | {"parameters": {"metric": "m", "threshold": 1.0, "treat_missing_data": "breaching"}})
    assert steps_and_states(nan.observe(curve("m", {1: 0.0, 2: math.nan}))) == [(1, OK), (2, ALARM)]


def test_custom_missing_data_policy_not_breaching():
    ev = make(missing_rule("notBreaching"))
    assert steps_and_states(ev.observe(curve("m", {10: 5.0, 20: 5.0}))) == [(20, ALARM)]
    assert steps_and_states(ev.tick(T0 + 200)) == [(None, OK)]
    nan = make({"type": "custom", "parameters": {"metric": "m", "threshold": 1.0, "treat_missing_data": "notBreaching"}})
    assert steps_and_states(nan.observe(curve("m", {1: 5.0, 2: math.nan}))) == [(1, ALARM), (2, OK)]


def test_custom_missing_data_policy_ignore():
    ev = make(missing_rule("ignore"))
    assert steps_and_states(ev.observe(curve("m", {10: 5.0, 20: 5.0}))) == [(20, ALARM)]
    assert ev.tick(T0 + 10_000) == []
    assert ev.state == ALARM
    assert ev.observe(curve("m", {30: math.nan, 40: math.nan})) == []  # NaN datapoints ignored too
    assert steps_and_states(ev.observe(curve("m", {50: 0.0, 60: 0.0}))) == [(50, OK)]  # [breaching, not]: 1 of 2


def test_custom_nan_values_inside_a_period_are_dropped():
    ev = make({"type": "custom", "parameters": {"metric": "m", "statistic": "max", "window": 3, "threshold": 10}})
    transitions = ev.observe(curve("m", {1: 1.0, 2: math.nan, 3: 2.0, 4: math.inf, 5: 1.0, 6: 1.0}))
    assert steps_and_states(transitions) == [(3, OK), (6, ALARM)]
    assert transitions[1].values["datapoints"] == ["Infinity"]


def test_custom_cooldown_records_alarms_without_firing():
    ev = make({"type": "custom", "parameters": {"metric": "m", "threshold": 1.0, "cooldown_seconds": 100}})
    points = [Point("m", 1, 2.0, T0), Point("m", 2, 0.0, T0 + 10), Point("m", 3, 2.0, T0 + 20),
              Point("m", 4, 0.0, T0 + 30), Point("m", 5, 2.0, T0 + 150)]
    transitions = ev.observe(points)
    assert [(t.step, t.to_state, t.fire) for t in transitions] == [
        (1, ALARM, True), (2, OK, True), (3, ALARM, False), (4, OK, True), (5, ALARM, True)]


def test_cooldown_applies_to_builtins_and_survives_a_restart():
    rule = check_rule({"type": "step_outlier", "parameters": {"cooldown_seconds": 3600}})
    assert rule["parameters"]["cooldown_seconds"] == 3600.0
    ev = evaluator(check_rule({"type": "stalled", "parameters": {"threshold_seconds": 10, "cooldown_seconds": 60}}),
                   started_at=T0)
    assert [t.fire for t in ev.tick(T0 + 11)] == [True]
    ev.observe_activity(T0 + 12)
    assert [(t.to_state, t.fire) for t in ev.tick(T0 + 30)] == [(OK, True), (ALARM, False)]
    restored = evaluator(check_rule({"type": "stalled", "parameters": {"threshold_seconds": 10, "cooldown_seconds": 60}}),
                         started_at=T0, state=OK, last_fired_at=T0 + 11)
    assert [t.fire for t in restored.tick(T0 + 30)] == [False]


def test_custom_warmup_steps_and_rank():
    ev = make({"type": "custom", "parameters": {"metric": "m", "threshold": 1.0, "warmup_steps": 5}})
    assert ev.observe(curve("m", {s: 9.0 for s in range(1, 5)})) == []
    assert ev.observe(curve("m", {s: 9.0 for s in range(5, 9)}, rank=1)) == []  # rank 1: not this rule's
    assert steps_and_states(ev.observe(curve("m", {5: 0.5, 6: 2.0}))) == [(5, OK), (6, ALARM)]
    ranked = make({"type": "custom", "parameters": {"metric": "m", "threshold": 1.0, "rank": 1}})
    assert steps_and_states(ranked.observe(curve("m", {1: 5.0}, rank=1) + curve("m", {2: 0.0}))) == [(1, ALARM)]


def test_custom_replayed_and_out_of_order_steps_are_skipped():
    ev = make({"type": "custom", "parameters": {"metric": "m", "window": 3, "statistic": "sum", "threshold": 100}})
    first = ev.observe(curve("m", {s: 1.0 for s in range(1, 7)}))
    assert steps_and_states(first) == [(3, OK)]
    # A resumed run re-sends 4..6 with huge values, then goes on: only 7.. count.
    replay = ev.observe(curve("m", {4: 1e6, 5: 1e6, 6: 1e6, 3: 1e6, 7: 1.0, 8: 1.0, 9: 1e6}))
    assert steps_and_states(replay) == [(9, ALARM)]


def test_restored_state_is_kept_until_the_window_is_full():
    ev = make(MEAN_2_OF_3, state=ALARM)
    assert ev.reason.startswith("ALARM when the watcher restarted")
    assert ev.observe(curve("train_loss", {1: 0, 2: 0, 3: 0, 4: 0})) == []
    assert steps_and_states(ev.observe(curve("train_loss", {5: 0, 6: 0}))) == [(6, OK)]


# --- finished without data -------------------------------------------------------------------

def test_finished_without_data_says_what_it_wanted_and_what_it_saw_once():
    ev = make("non_finite")
    names = [f"metric_{i}" for i in range(15)]
    ev.observe([Point(name, 1, 1.0, T0) for name in names])
    transitions = ev.tick(T0 + 100, finished=True)
    assert len(transitions) == 1
    record = transitions[0]
    assert (record.from_state, record.to_state, record.at, record.step) == (INSUFFICIENT_DATA, INSUFFICIENT_DATA, T0 + 100, None)
    assert "it waited for the first point of a metric matching '(?i)loss'" in record.reason
    assert record.values["wanted"] == ["(?i)loss"]
    assert record.values["seen"] == names[:10]
    assert "metric_9" in record.reason and "metric_10" not in record.reason
    assert ev.tick(T0 + 200, finished=True) == []
    assert ev.observe(curve("train_loss", {2: math.nan})) == []
    assert ev.state == INSUFFICIENT_DATA


def test_finished_after_data_records_nothing_and_stops_evaluating():
    ev = make({"type": "stalled", "parameters": {"threshold_seconds": 10}})
    assert steps_and_states(ev.tick(T0 + 5)) == [(None, OK)]
    assert ev.tick(T0 + 1000, finished=True) == []  # silence after the end is not a stall
    assert ev.tick(T0 + 2000) == []
    quiet = make({"type": "overfit"})
    [record] = quiet.tick(T0, finished=True)
    assert record.values["wanted"] == ["train_loss", "validation_loss"]
    assert "the job reported no metric points" in record.reason


def test_disabled_rule_evaluates_nothing():
    ev = make({"type": "non_finite", "enabled": False})
    assert ev.observe(curve("train_loss", {1: math.nan})) == []
    assert ev.tick(T0, finished=True) == []


# --- checking rule specs ---------------------------------------------------------------------

def rule_error(raw: object, **kwargs) -> RuleError:
    with pytest.raises(RuleError) as info:
        check_rule(raw, **kwargs)
    assert info.value.message and str(info.value) == f"{info.value.field}: {info.value.message}"
    return info.value


def test_check_rule_normalizes_with_defaults():
    rule = check_rule({"type": "overtraining"})
    assert rule == {"name": "overtraining", "type": "overtraining", "enabled": True, "actions": [],
                    "parameters": {"metric": "validation_loss", "mode": "min", "patience": 5, "window": 10, "delta": 0.0,
                                   "cooldown_seconds": 0.0}}
    assert check_rule("non_finite")["actions"] == [{"type": "stop"}]
    actions = check_rule({"type": "stalled", "name": "quiet", "actions": ["notify", {"type": "tag"}, "stop",
                                                                          {"type": "notify", "channels": ["ops"]},
                                                                          {"type": "tag", "tag": "stalled!"}]})["actions"]
    assert actions == [{"type": "notify", "channels": None}, {"type": "tag", "tag": "alarm:quiet"}, {"type": "stop"},
                       {"type": "notify", "channels": ["ops"]}, {"type": "tag", "tag": "stalled!"}]
    assert check_rule({"type": "stalled", "actions": []})["actions"] == []
    assert check_rule({"type": "custom", "parameters": {"metric": "loss/train", "threshold": 2}})["name"] == "custom-loss_train"
    assert check_rule({"type": "loss_not_decreasing", "parameters": {"num_steps": 20.0}})["parameters"]["num_steps"] == 20
    assert set(RULE_TYPES) == set(BUILTIN_TYPES) | {"custom"} and ACTION_TYPES == ("stop", "notify", "tag")


@pytest.mark.parametrize(("raw", "field", "says"), [
    ({"type": "nan_checker"}, "type", "non_finite"),
    ({}, "type", "custom"),
    ("nope", "type", "one of"),
    (["non_finite"], "", "must be an object"),
    ({"type": "stalled", "colour": "red"}, "colour", "name, type, parameters, actions or enabled"),
    ({"type": "stalled", "parameters": {"threshold": 5}}, "parameters.threshold", "threshold_seconds"),
    ({"type": "stalled", "parameters": {"threshold_seconds": "30"}}, "parameters.threshold_seconds", "from 1 to"),
    ({"type": "stalled", "parameters": {"threshold_seconds": 0}}, "parameters.threshold_seconds", "from 1 to"),
    ({"type": "stalled", "parameters": {"threshold_seconds": True}}, "parameters.threshold_seconds", "not true"),
    ({"type": "loss_not_decreasing", "parameters": {"num_steps": 10001}}, "parameters.num_steps", "from 1 to 10000"),
    ({"type": "loss_not_decreasing", "parameters": {"num_steps": 2.5}}, "parameters.num_steps", "integer"),
    ({"type": "loss_not_decreasing", "parameters": {"num_steps": False}}, "parameters.num_steps", "integer"),
    ({"type": "custom", "parameters": {"metric": "m", "threshold": math.nan}}, "parameters.threshold", "finite"),
    ({"type": "custom", "parameters": {"metric": "m", "threshold": math.inf}}, "parameters.threshold", "finite"),
    ({"type": "custom", "parameters": {"metric": "m"}}, "parameters.threshold", "required"),
    ({"type": "custom", "parameters": {"threshold": 1}}, "parameters.metric", "required"),
    ({"type": "custom", "parameters": {"metric": "m", "threshold": 1, "datapoints_to_alarm": 3, "evaluation_periods": 2}},
     "parameters.datapoints_to_alarm", "from 1 to evaluation_periods (2)"),
    ({"type": "custom", "parameters": {"metric": "m", "threshold": 1, "evaluation_periods": 1001}},
     "parameters.evaluation_periods", "1000"),
    ({"type": "custom", "parameters": {"metric": "m", "threshold": 1, "comparison": "=="}}, "parameters.comparison",
     "GreaterThanThreshold"),
    ({"type": "custom", "parameters": {"metric": "m", "threshold": 1, "treat_missing_data": "zero"}},
     "parameters.treat_missing_data", "notBreaching"),
    ({"type": "non_finite", "parameters": {"metrics": "(loss"}}, "parameters.metrics", "not a valid regular expression"),
    ({"type": "budget"}, "parameters.limit", "required"),
    ({"type": "budget", "parameters": {"limit": 0}}, "parameters.limit", "more than 0"),
    ({"type": "overtraining", "parameters": {"patience": 11}}, "parameters.patience", "at most window (10)"),
    ({"type": "overfit", "parameters": {"train_metric": "loss", "validation_metric": "loss"}}, "parameters.validation_metric",
     "differ"),
    ({"type": "stalled", "actions": "stop"}, "actions", "list"),
    ({"type": "stalled", "actions": ["stop", "page"]}, "actions[1].type", "stop, notify or tag"),
    ({"type": "stalled", "actions": [42]}, "actions[0]", "stop, notify or tag"),
    ({"type": "stalled", "actions": [{"kind": "stop"}]}, "actions[0]", "must name an action"),
    ({"type": "stalled", "actions": ["stop", {"type": "notify", "channels": []}]}, "actions[1].channels", "non-empty list"),
    ({"type": "stalled", "actions": [{"type": "notify", "channels": "ops"}]}, "actions[0].channels", "channel names"),
    ({"type": "stalled", "actions": [{"type": "notify", "channels": ["ops", 3]}]}, "actions[0].channels[1]", "channel name"),
    ({"type": "stalled", "actions": [{"type": "tag", "tag": "x" * 65}]}, "actions[0].tag", "1 to 64"),
    ({"type": "stalled", "actions": [{"type": "stop", "now": True}]}, "actions[0].now", "keys are type"),
    ({"type": "stalled", "name": "has space"}, "name", "letters, digits"),
    ({"type": "stalled", "name": "x" * 101}, "name", "1 to 100"),
    ({"type": "stalled", "enabled": "yes"}, "enabled", "true or false"),
    ({"type": "stalled", "parameters": [1]}, "parameters", "object"),
])
def test_check_rule_errors_name_the_field(raw, field, says):
    error = rule_error(raw)
    assert error.field == field
    assert says in error.message


def test_check_rule_patch_merges_and_cannot_change_type():
    existing = check_rule(MEAN_2_OF_3)
    patched = check_rule({"parameters": {"threshold": 2.5, "window": None}, "enabled": False}, partial=existing)
    assert patched["parameters"]["threshold"] == 2.5
    assert patched["parameters"]["window"] == 1  # null: back to the default
    assert patched["parameters"]["statistic"] == "mean" and patched["enabled"] is False and patched["name"] == "loss-high"
    assert existing["parameters"]["threshold"] == 1.0  # the existing rule is not changed in place
    error = rule_error({"type": "stalled"}, partial=existing)
    assert error.field == "type" and "cannot change" in error.message
    assert check_rule({"type": "custom"}, partial=existing)["type"] == "custom"
    assert rule_error({"parameters": {"window": 0}}, partial=existing).field == "parameters.window"
    assert rule_error({"colour": 1}, partial=existing).field == "colour"
    # M defaulted to N: changing N alone keeps "all of N"; an explicit M is kept and checked.
    all_of = check_rule({"type": "custom", "parameters": {"metric": "m", "threshold": 1, "evaluation_periods": 3}})
    assert check_rule({"parameters": {"evaluation_periods": 5}}, partial=all_of)["parameters"]["datapoints_to_alarm"] == 5
    assert rule_error({"parameters": {"evaluation_periods": 1}}, partial=existing).field == "parameters.datapoints_to_alarm"


def test_check_rules_defaults_duplicates_and_paths():
    assert check_rules(None) == list(DEFAULT_RULES)
    assert DEFAULT_RULES[0]["name"] == "non_finite" and DEFAULT_RULES[0]["actions"] == [{"type": "stop"}]
    assert check_rules(None, defaults=False) == []
    off = check_rules([{"type": "non_finite", "enabled": False}])
    assert [(r["name"], r["enabled"]) for r in off] == [("non_finite", False)]
    added = check_rules([{"type": "non_finite", "name": "nan-accuracy", "parameters": {"metrics": "acc"}}, "stalled"])
    assert [r["name"] for r in added] == ["nan-accuracy", "stalled", "non_finite"]
    added[2]["parameters"]["metrics"] = "changed"
    assert DEFAULT_RULES[0]["parameters"]["metrics"] == "(?i)loss"  # a copy, not the shared default
    with pytest.raises(RuleError) as info:
        check_rules(["stalled", "overfit", {"type": "custom", "parameters": {"metric": "m", "window": 0, "threshold": 1}}])
    assert info.value.field == "rules[2].parameters.window"
    with pytest.raises(RuleError) as info:
        check_rules(["stalled", "overfit", "budget", {"type": "max_init_time", "name": "overfit"}])
    assert info.value.field == "rules[2].parameters.limit"
    with pytest.raises(RuleError) as info:
        check_rules(["stalled", "overfit", {"type": "budget", "parameters": {"limit": 5}}, {"type": "max_init_time", "name": "overfit"}])
    assert info.value.field == "rules[3].name" and "rules[1]" in info.value.message
    with pytest.raises(RuleError) as info:
        check_rules({"type": "stalled"})
    assert info.value.field == "rules"


def test_odd_points_never_raise():
    specs = [check_rule(t) for t in BUILTIN_TYPES if t != "budget"]
    specs += [check_rule({"type": "budget", "parameters": {"limit": 1}}), check_rule(MEAN_2_OF_3)]
    odd = [Point("train_loss", 10**30, math.nan, T0), Point("train_loss", -5, math.inf, T0 - 1e9),
           Point("validation_loss", 3, -math.inf, T0, rank=7), Point("train_loss", 3, 0.0, T0), Point("train_loss", 3, 0.0, T0),
           Point("validation_loss", 4, 0.0, T0), Point("train_loss", 2, 1e308, math.nan)]
    for spec in specs:
        ev = evaluator(spec, started_at=T0)
        transitions = ev.observe(odd) + ev.observe_gpu([GpuSample("h", 0, math.nan, T0)]) + ev.tick(T0 + 1e9, cost=math.nan)
        assert_json_safe(transitions)
        ev.tick(T0 + 2e9, finished=True)


@pytest.mark.parametrize("seed", range(6))
def test_batches_of_any_size_give_the_same_transitions_as_points_one_by_one(seed):
    """Batches take shortcuts (a whole batch on the state's side moves nothing); one point per
    call takes none: both must agree, on noisy curves with NaNs, replays and plateaus."""
    rng = np.random.default_rng(seed)
    values = np.concatenate([rng.normal(1.0, 0.3, 400), rng.normal(2.0, 0.3, 300), rng.normal(0.5, 0.1, 300)])
    values[rng.choice(len(values), 15, replace=False)] = np.nan
    values[rng.choice(len(values), 2, replace=False)] = np.inf  # a window with ±Inf takes the careful path
    points, clock = [], T0
    for step, value in enumerate(values.tolist(), start=1):
        clock += float(rng.choice([0.1, 0.11, 0.1, 3.0], p=[0.5, 0.45, 0.04, 0.01]))
        points.append(Point("train_loss", step, value, clock))
        if step % 25 == 0:
            points.append(Point("validation_loss", step, value * 1.1 + step / 1000, clock))
        if step == 600:  # a resumed run re-sends 550..600
            points += [Point("train_loss", s, 9.0, clock + 1) for s in range(550, 601)]
    rules: list[dict | str] = [
        {"type": "custom", "parameters": {"metric": "train_loss", "statistic": statistic, "window": window,
                                          "comparison": comparison, "threshold": 1.5, "evaluation_periods": n,
                                          "datapoints_to_alarm": m, "treat_missing_data": policy}}
        for statistic, window, comparison, n, m, policy in [
            ("last", 1, ">", 5, 3, "missing"), ("mean", 4, ">=", 3, 2, "breaching"), ("p90", 7, "<", 4, 4, "notBreaching"),
            ("max", 1, "<=", 1, 1, "ignore"), ("min", 3, ">", 10, 1, "missing"),
            ("mean", 10, ">", 5, 3, "ignore")]]
    rules.append({"type": "custom", "parameters": {"metric": "train_loss", "statistic": "sum", "window": 6, "comparison": ">",
                                                   "threshold": 8.0, "evaluation_periods": 3, "datapoints_to_alarm": 2}})
    rules += [{"type": "custom", "parameters": {"metric": "train_loss", "compare_to": "previous_window", "window": w,
                                                "statistic": "mean", "comparison": ">", "threshold": 0.2,
                                                "evaluation_periods": 3, "datapoints_to_alarm": 2}} for w in (1, 5)]
    rules += ["non_finite", {"type": "loss_not_decreasing", "parameters": {"num_steps": 20, "diff_percent": 1.0}},
              "overfit", "overtraining", "step_outlier"]
    sizes = [int(x) for x in rng.integers(1, 400, 200)]
    for rule in rules:
        expected = feed_one_by_one(make(rule), points)
        batched, ev, start = [], make(rule), 0
        for size in sizes:
            batched += ev.observe(points[start:start + size])
            start += size
        batched += ev.observe(points[start:])
        assert [(t.step, t.to_state, t.reason) for t in batched] == [(t.step, t.to_state, t.reason) for t in expected], rule
        assert expected or rule == "overtraining", rule


def test_a_batch_list_refilled_in_place_is_grouped_again_and_iterables_work():
    rule = {"type": "custom", "parameters": {"metric": "m", "threshold": 1.0}}
    first, second = make(rule), make(rule)
    buffer = curve("m", {1: 0.0, 2: 0.0})
    assert steps_and_states(first.observe(buffer)) == [(1, OK)]
    buffer[:] = curve("m", {3: 5.0, 4: 5.0})  # the watcher reuses its list: same object, same length
    assert steps_and_states(first.observe(buffer)) == [(3, ALARM)]
    assert steps_and_states(second.observe(buffer)) == [(3, ALARM)]
    assert steps_and_states(first.observe(p for p in curve("m", {5: 0.0}))) == [(5, OK)]


def test_budget_takes_decimal_costs():
    from decimal import Decimal

    ev = make({"type": "budget", "parameters": {"limit": 100, "projected": False}})
    [alarm] = ev.tick(T0, cost=Decimal("100.01"))
    assert alarm.to_state == ALARM and alarm.values["cost"] == 100.01
    assert alarm.reason == "cost passes the limit 100.00 (cost 100.01)"


# --- speed (printed, not asserted) -----------------------------------------------------------

def test_speed_of_observe_for_100_rules(capsys):
    metrics = ["train_loss", "validation_loss", "learning_rate", "grad_norm", "tokens_per_second", "accuracy",
               "throughput", "memory", "epoch", "loss_scale"]
    specs = [check_rule("non_finite"), check_rule("loss_not_decreasing"), check_rule("overfit"), check_rule("overtraining"),
             check_rule("stalled"), check_rule("max_init_time"), check_rule("step_outlier")]
    index = 0
    while len(specs) < 100:
        specs.append(check_rule({"type": "custom", "name": f"c{index}", "parameters": {
            "metric": metrics[index % len(metrics)], "statistic": ("mean", "p90", "last", "max")[index % 4],
            "window": (1, 10, 50)[index % 3], "threshold": 1e9, "evaluation_periods": 5, "datapoints_to_alarm": 3}}))
        index += 1
    evaluators = [evaluator(spec, started_at=T0) for spec in specs]
    total, batch_size = 500_000, 5_000
    steps = total // len(metrics)
    points = [Point(name, step, 1.0 / (step + 1), T0 + step * 0.01) for step in range(steps) for name in metrics]
    batches = [points[i:i + batch_size] for i in range(0, len(points), batch_size)]
    started = time.perf_counter()
    for batch in batches:
        for ev in evaluators:
            ev.observe(batch)
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(f"\nrules engine: {total:,} points × {len(evaluators)} rules in {elapsed:.2f} s: "
              f"{total / elapsed:,.0f} points/s through all 100 rules "
              f"({elapsed / total / len(evaluators) * 1e9:.0f} ns per point per rule; 1M points ≈ {elapsed * 1e6 / total:.1f} s)")
