"""Which predictions start human loops: confidence below a threshold, a random sample, or
both; and StartHumanLoop by name."""

from __future__ import annotations

import random

import pytest

from review.actions.loops import start_human_loop, start_loops_for_predictions
from review.activation import activation_reason, check_activation
from review.errors import LoopNameTaken, ReviewError
from review.models import HumanLoop, LoopStatus

SAMPLE_PERCENT = 10.0


def predictions(n: int, seed: int = 7) -> list[tuple[dict, dict]]:
    rng = random.Random(seed)
    items = []
    for i in range(n):
        confidence = round(rng.random(), 4)
        items.append(({"text": f"item {i}"}, {"label": "cat", "confidence": confidence,
                                              "probabilities": {"cat": confidence, "dog": 1 - confidence}}))
    return items


@pytest.mark.django_db
def test_loops_start_for_predictions_under_the_threshold_plus_the_sampled_share(make_flow):
    flow = make_flow(activation={"confidence_below": 0.8, "sample_percent": SAMPLE_PERCENT, "combine": "any"})
    items = predictions(2000)
    names = start_loops_for_predictions(flow, items, source={"endpoint": "demo"}, rng=random.Random(42))
    loops = list(HumanLoop.objects.filter(flow_definition=flow))
    assert sorted(names) == sorted(loop.name for loop in loops)
    assert all(name.startswith(f"{flow.name}-") for name in names)
    unsure = [p for _, p in items if p["confidence"] < 0.8]
    confident = [p for _, p in items if p["confidence"] >= 0.8]
    below = [loop for loop in loops if loop.activation_reason == "confidence_below"]
    sampled = [loop for loop in loops if loop.activation_reason == "sampled"]
    assert len(below) == len(unsure) and all(loop.confidence < 0.8 for loop in below)
    assert all(loop.confidence >= 0.8 for loop in sampled)
    # About 10 % of the ~400 confident predictions, and exactly what the seed decides.
    assert 0.04 * len(confident) < len(sampled) < 0.18 * len(confident)
    replay = random.Random(42)
    expected = sum(1 for _, p in items
                   if activation_reason(flow.activation, p["confidence"], replay) == "sampled")
    assert len(sampled) == expected
    loop = below[0]
    assert loop.status == LoopStatus.IN_PROGRESS and loop.source == {"endpoint": "demo"}
    assert (loop.answers_needed, loop.open_slots) == (flow.task_count, flow.task_count)
    assert loop.prediction["label"] == "cat"


@pytest.mark.django_db
def test_starting_loops_for_a_call_is_one_insert(make_flow, django_assert_num_queries):
    flow = make_flow(activation={"confidence_below": 1.0, "sample_percent": 0, "combine": "any"})
    with django_assert_num_queries(1):
        names = start_loops_for_predictions(flow, predictions(20), source={"batch": 3}, rng=random.Random(1))
    assert len(names) == 20
    records = sorted(loop.source["record"] for loop in HumanLoop.objects.filter(flow_definition=flow))
    assert records == list(range(20))


@pytest.mark.django_db
def test_no_flow_or_nothing_selected_starts_nothing(make_flow, django_assert_num_queries):
    assert start_loops_for_predictions(None, predictions(5), source={}) == []
    flow = make_flow(activation={"confidence_below": 0.0, "sample_percent": 0, "combine": "any"})
    with django_assert_num_queries(0):
        assert start_loops_for_predictions(flow, predictions(5), source={}) == []


def test_combine_all_needs_both_conditions():
    activation = {"confidence_below": 0.5, "sample_percent": 50.0, "combine": "all"}
    rng = random.Random(3)
    reasons = [activation_reason(activation, c, rng) for c in [0.9] * 200 + [0.1] * 200]
    assert set(reasons[:200]) == {None}
    started = [r for r in reasons[200:] if r]
    assert set(started) == {"confidence_below"} and 60 < len(started) < 140


def test_sampling_alone_and_no_conditions():
    rng = random.Random(5)
    assert activation_reason({"confidence_below": None, "sample_percent": 100.0, "combine": "any"}, 0.99, rng) == "sampled"
    assert activation_reason({"confidence_below": None, "sample_percent": 0, "combine": "any"}, 0.01, rng) is None
    assert activation_reason({"confidence_below": 0.8, "sample_percent": 0, "combine": "any"}, None, rng) is None


@pytest.mark.parametrize(("activation", "field"), [
    ({"confidence_below": 1.5}, "activation.confidence_below"),
    ({"confidence_below": -0.1}, "activation.confidence_below"),
    ({"confidence_below": "0.5"}, "activation.confidence_below"),
    ({"sample_percent": 101}, "activation.sample_percent"),
    ({"sample_percent": -1}, "activation.sample_percent"),
    ({"combine": "xor"}, "activation.combine"),
    ({"confidence": 0.5}, "activation"),
    ([0.5], "activation"),
])
def test_bad_activations_name_their_field(activation, field):
    clean, errors = check_activation(activation)
    assert clean == {} and field in errors


@pytest.mark.django_db
def test_start_human_loop_by_name_once(make_flow, owner):
    flow = make_flow()
    loop = start_human_loop(name="manual-1", flow=flow, input_content={"text": "hello"}, user=owner)
    assert loop.activation_reason == "api" and loop.open_slots == flow.task_count
    with pytest.raises(LoopNameTaken) as info:
        start_human_loop(name="manual-1", flow=flow, input_content={"text": "again"}, user=owner)
    assert info.value.status == 409
    with pytest.raises(ReviewError) as bad:
        start_human_loop(name="manual-2", flow=flow, input_content=["not", "an", "object"])
    assert bad.value.field == "input_content"
