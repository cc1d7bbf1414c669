"""trainyard.parallel.partition: the exact partitioner against brute force, the simple
partitions, the memory cap, and the profiler on char-lm's real layers."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from trainyard.parallel.partition import (
    MB,
    CostModel,
    LayerCost,
    PartitionError,
    auto_partition,
    balance,
    brute_force,
    even_partition,
    manual_partition,
    profile_layers,
)


def random_model(rng: random.Random, size: int, *, schedule: str = "gpipe") -> CostModel:
    layers = tuple(LayerCost(
        name=f"layer {index}",
        forward_ms=rng.uniform(0.1, 10.0),
        backward_ms=rng.uniform(0.1, 20.0),
        parameter_bytes=rng.randrange(0, 4 * MB),
        activation_bytes=rng.randrange(0, 2 * MB),
        # Sometimes a cut is nearly free, sometimes it costs as much as a layer.
        output_bytes=rng.choice([rng.randrange(0, 1_000), rng.randrange(0, 20 * MB)]),
    ) for index in range(size))
    return CostModel(layers, microbatches=rng.randint(1, 6), schedule=schedule,
                     bandwidth_bytes_per_ms=rng.choice([1e5, 1e6, 1e7]))


def test_auto_partition_is_optimal_on_300_random_models_with_and_without_a_cap():
    rng = random.Random(20240611)
    checked = capped = infeasible = 0
    for case in range(300):
        size = rng.randint(1, 8)
        stages = rng.randint(1, min(4, size))
        model = random_model(rng, size, schedule="1f1b" if case % 3 == 0 else "gpipe")
        cap = None
        if case % 2:
            # A cap around what an even split needs: sometimes loose, sometimes impossible.
            even = even_partition(size, stages).memory_bytes(model)
            cap = max(even) * rng.uniform(0.4, 1.3)
        expected = brute_force(model, stages, cap)
        if expected is None:
            with pytest.raises(PartitionError, match="memory_cap_mb"):
                auto_partition(model, stages, cap)
            infeasible += 1
            continue
        found = auto_partition(model, stages, cap)
        assert found.objective(model) == expected.objective(model), (case, found, expected)
        assert [first for first, _ in found.ranges][0] == 0 and found.ranges[-1][1] == size - 1
        assert all(last + 1 == first for (_, last), (first, _) in zip(found.ranges, found.ranges[1:], strict=False))
        assert all(first <= last for first, last in found.ranges)
        if cap is not None:
            assert max(found.memory_bytes(model)) <= cap
            capped += 1
        checked += 1
    # The cases exercised every branch, not just the easy one.
    assert checked > 200 and capped > 50 and infeasible > 5, (checked, capped, infeasible)


def test_one_stage_takes_everything_and_one_layer_per_stage_when_stages_equal_layers():
    model = random_model(random.Random(1), 5)
    assert auto_partition(model, 1).ranges == ((0, 4),)
    assert auto_partition(model, 5).ranges == ((0, 0), (1, 1), (2, 2), (3, 3), (4, 4))
    with pytest.raises(PartitionError, match="5 layers: it cannot be cut into 6"):
        auto_partition(model, 6)


def test_auto_moves_layers_off_a_heavy_end():
    # An expensive head: even puts two light layers beside it, auto gives it a stage alone.
    costs = [1.0, 1.0, 1.0, 1.0, 4.0]
    model = CostModel(tuple(LayerCost(f"l{i}", cost, cost, 0, 0, 0) for i, cost in enumerate(costs)), microbatches=1)
    even, auto = even_partition(5, 2), auto_partition(model, 2)
    assert even.ranges == ((0, 2), (3, 4)) and auto.ranges == ((0, 3), (4, 4))
    assert balance(auto.predicted_ms(model)) == 1.0 < balance(even.predicted_ms(model))


def test_an_expensive_cut_is_avoided_and_counted_on_both_sides():
    # Equal layers, but the activation after layer 1 is huge: cut elsewhere.
    outputs = [10, 50_000_000, 10, 10]
    model = CostModel(tuple(LayerCost(f"l{i}", 1.0, 1.0, 0, 0, out) for i, out in enumerate(outputs)),
                      microbatches=2, bandwidth_bytes_per_ms=1e6)
    assert auto_partition(model, 2).ranges in (((0, 0), (1, 3)), ((0, 2), (3, 3)))
    cut = model.cut_ms(1)
    assert cut == pytest.approx(2 * 50_000_000 * 2 / 1e6)
    assert model.stage_ms(0, 1) == pytest.approx(2 * 2.0 * 2 + cut) and model.stage_ms(2, 3) == pytest.approx(2 * 2.0 * 2 + cut)


def test_an_impossible_cap_names_the_cap_and_the_least_that_would_fit():
    layers = tuple(LayerCost(f"l{i}", 1.0, 1.0, 10 * MB, MB, 0) for i in range(4))
    model = CostModel(layers, microbatches=2)  # a layer alone: 40 MB of parameters × 4 + 2 MB
    with pytest.raises(PartitionError) as failure:
        auto_partition(model, 2, memory_cap_bytes=50 * MB)
    message = str(failure.value)
    assert "memory_cap_mb=50" in message and "84.0 MB" in message and "at least 84" in message
    assert auto_partition(model, 2, memory_cap_bytes=84 * MB).ranges == ((0, 1), (2, 3))


def test_one_f_one_b_holds_fewer_microbatches_on_later_stages():
    layers = tuple(LayerCost(f"l{i}", 1.0, 1.0, 0, MB, 0) for i in range(4))
    gpipe, one_f_one_b = CostModel(layers, microbatches=8), CostModel(layers, microbatches=8, schedule="1f1b")
    split = even_partition(4, 2)
    assert split.memory_bytes(gpipe) == [16 * MB, 16 * MB]
    assert split.memory_bytes(one_f_one_b) == [4 * MB, 2 * MB]


def test_even_and_manual_partitions():
    assert even_partition(5, 2).ranges == ((0, 2), (3, 4))
    assert even_partition(7, 3).counts == [3, 2, 2]
    assert even_partition(4, 4).ranges == ((0, 0), (1, 1), (2, 2), (3, 3))
    assert manual_partition([1, 3], layers=4).ranges == ((0, 0), (1, 3))
    assert manual_partition([1, 3]).mode == "manual"
    with pytest.raises(PartitionError, match="adds up to 5 layers but the model has 4"):
        manual_partition([2, 3], layers=4)
    with pytest.raises(PartitionError, match="counts ≥ 1"):
        manual_partition([0, 4])


def test_the_partitioner_does_not_import_torch():
    code = "import sys, trainyard.parallel.partition; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_profiler_measures_char_lm_layers():
    import torch

    from algorithms.charlm import build_layers, layer_names
    from trainyard.parallel.stages import summed_cross_entropy

    architecture = {"vocabulary_size": 40, "context_length": 16, "embedding_dim": 32, "layers": 2, "heads": 2,
                    "dropout": 0.0}
    torch.manual_seed(0)
    layers = build_layers(architecture)
    inputs, targets = torch.randint(1, 40, (4, 16)), torch.randint(1, 40, (4, 16))
    state = torch.get_rng_state()
    costs = profile_layers(layers, layer_names(architecture), inputs, targets, summed_cross_entropy, repeats=2)
    assert torch.equal(torch.get_rng_state(), state)  # profiling draws nothing training would
    assert [cost.name for cost in costs] == ["embedding", "block 1", "block 2", "head"]
    assert all(cost.forward_ms > 0 and cost.backward_ms > 0 for cost in costs)
    # Parameters exactly; activations: what crosses a cut is one (4, 16, 32) float32 tensor.
    assert [cost.parameter_bytes for cost in costs] == [4 * sum(p.numel() for p in layer.parameters()) for layer in layers]
    assert [cost.output_bytes for cost in costs[:3]] == [4 * 16 * 32 * 4] * 3
    assert costs[3].output_bytes == 4 * 16 * 40 * 4
    # A block keeps far more than its input for backward (attention, the 4× MLP).
    assert costs[1].activation_bytes > 4 * costs[1].output_bytes
    assert all(parameter.grad is None for layer in layers for parameter in layer.parameters())
