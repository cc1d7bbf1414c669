"""Cutting a stack of layers into pipeline stages: the cost model, an exact partitioner, the
simple ones (even, manual) and the profiler that measures what the cost model needs.

    costs = profile_layers(layers, names, sample_inputs, sample_targets, loss_fn)  # torch
    model = CostModel(costs, microbatches=4, schedule="gpipe", bandwidth_bytes_per_ms=2e6)
    partition = auto_partition(model, stages=2, memory_cap_bytes=None)
    partition.ranges  # ((0, 2), (3, 5)): first and last layer index of each stage

The partitioner and the cost model are plain Python (no torch at import): the API and the
tests use them without paying for torch. The profiler imports torch inside.

Cost model, per optimizer step of M microbatches (the figures a LayerCost carries are per
microbatch):
- a stage's time = M × Σ(forward + backward of its layers) + the time to move what crosses
  each of its cuts: the activation forward and its gradient backward, M times, at
  `bandwidth_bytes_per_ms`;
- a stage's memory = parameters × OPTIMIZER_FACTOR (weights, gradients, AdamW's two moments)
  + the activations it keeps for backward × the microbatches in flight (all M under GPipe;
  under 1F1B stage s holds at most stages − s).
auto_partition minimises the slowest stage's time over every contiguous split into
non-empty stages whose memory fits the cap: the throughput of a pipeline is set by its
slowest stage.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

OPTIMIZER_FACTOR = 4.0  # weights + gradients + AdamW's exp_avg and exp_avg_sq, all float32
MB = 1024 * 1024

StageRange = tuple[int, int]  # (first layer index, last layer index), inclusive


class PartitionError(ValueError):
    """No partition satisfies the request (too many stages, a memory cap too small, a bad
    manual list); the message says what to change."""


@dataclass(frozen=True)
class LayerCost:
    """What one layer costs for one microbatch."""

    name: str
    forward_ms: float
    backward_ms: float
    parameter_bytes: int
    activation_bytes: int  # kept for backward while its microbatch is in flight
    output_bytes: int  # what crosses a cut placed after this layer


@dataclass(frozen=True)
class CostModel:
    layers: tuple[LayerCost, ...]
    microbatches: int = 4
    schedule: str = "gpipe"  # "gpipe" | "1f1b": how many microbatches a stage holds at once
    bandwidth_bytes_per_ms: float = 2e6  # between neighbouring stages; 2e6 = 2 GB/s
    optimizer_factor: float = OPTIMIZER_FACTOR
    # Prefix sums, so a stage's figures cost O(1): the partitioner asks for O(K n²) stages.
    _compute: list[float] = field(init=False, repr=False, compare=False)
    _parameters: list[float] = field(init=False, repr=False, compare=False)
    _activations: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if not self.layers:
            raise PartitionError("a model needs at least one layer to partition")
        if self.microbatches < 1:
            raise PartitionError(f"microbatches must be ≥ 1, got {self.microbatches}")
        if self.schedule not in ("gpipe", "1f1b"):
            raise PartitionError(f"schedule must be gpipe or 1f1b, got {self.schedule!r}")
        object.__setattr__(self, "_compute", _prefix(layer.forward_ms + layer.backward_ms for layer in self.layers))
        object.__setattr__(self, "_parameters", _prefix(float(layer.parameter_bytes) for layer in self.layers))
        object.__setattr__(self, "_activations", _prefix(float(layer.activation_bytes) for layer in self.layers))

    @property
    def size(self) -> int:
        return len(self.layers)

    def cut_ms(self, after: int) -> float:
        """Time per step to move the cut after layer `after`: activations forward, their
        gradients backward, once per microbatch."""
        return 2.0 * self.layers[after].output_bytes * self.microbatches / self.bandwidth_bytes_per_ms

    def stage_ms(self, first: int, last: int) -> float:
        compute = (self._compute[last + 1] - self._compute[first]) * self.microbatches
        incoming = self.cut_ms(first - 1) if first > 0 else 0.0
        outgoing = self.cut_ms(last) if last < self.size - 1 else 0.0
        return compute + incoming + outgoing

    def in_flight(self, stage: int, stages: int) -> int:
        if self.schedule == "1f1b":
            return min(self.microbatches, stages - stage)
        return self.microbatches

    def stage_bytes(self, first: int, last: int, stage: int, stages: int) -> float:
        parameters = self._parameters[last + 1] - self._parameters[first]
        activations = self._activations[last + 1] - self._activations[first]
        return parameters * self.optimizer_factor + activations * self.in_flight(stage, stages)


@dataclass(frozen=True)
class Partition:
    ranges: tuple[StageRange, ...]
    mode: str  # "auto" | "even" | "manual"

    @property
    def counts(self) -> list[int]:
        return [last - first + 1 for first, last in self.ranges]

    def predicted_ms(self, model: CostModel) -> list[float]:
        return [model.stage_ms(first, last) for first, last in self.ranges]

    def memory_bytes(self, model: CostModel) -> list[float]:
        return [model.stage_bytes(first, last, stage, len(self.ranges)) for stage, (first, last) in enumerate(self.ranges)]

    def objective(self, model: CostModel) -> float:
        return max(self.predicted_ms(model))


def balance(times: Sequence[float]) -> float:
    """Slowest stage ÷ mean stage: 1.0 is perfect; the pipeline runs at the slowest's pace."""
    mean = sum(times) / len(times)
    return max(times) / mean if mean > 0 else 1.0


def _prefix(values: Any) -> list[float]:
    sums = [0.0]
    for value in values:
        sums.append(sums[-1] + value)
    return sums


def _check_stages(layers: int, stages: int) -> None:
    if stages < 1:
        raise PartitionError(f"stages must be ≥ 1, got {stages}")
    if stages > layers:
        raise PartitionError(f"the model has {layers} layers: it cannot be cut into {stages} non-empty stages")


# --- the simple partitions --------------------------------------------------------------------
def even_partition(layers: int, stages: int) -> Partition:
    """Equal layer counts; the first `layers % stages` stages take one more."""
    _check_stages(layers, stages)
    base, extra = divmod(layers, stages)
    return manual_partition([base + (1 if stage < extra else 0) for stage in range(stages)], mode="even")


def manual_partition(counts: Sequence[int], *, layers: int | None = None, mode: str = "manual") -> Partition:
    """Layer counts per stage, in order, as the job's `pipeline.partition` list gives them."""
    if not counts or any(not isinstance(count, int) or count < 1 for count in counts):
        raise PartitionError(f"a partition is a list of layer counts ≥ 1, one per stage; got {list(counts)}")
    if layers is not None and sum(counts) != layers:
        raise PartitionError(f"the partition {list(counts)} adds up to {sum(counts)} layers but the model has {layers}")
    ranges, first = [], 0
    for count in counts:
        ranges.append((first, first + count - 1))
        first += count
    return Partition(tuple(ranges), mode)


# --- the exact partitioner ------------------------------------------------------------------------
def auto_partition(model: CostModel, stages: int, memory_cap_bytes: float | None = None) -> Partition:
    """The contiguous split into `stages` non-empty stages with the smallest slowest-stage
    time among those whose every stage fits memory_cap_bytes; PartitionError naming the
    cap (and the smallest cap that would do) when none fits.

    Dynamic programme over prefixes, O(stages × n²): best[s][j] is the smallest
    slowest-stage time that layers[0:j] can have in s stages. A stage's figures depend
    only on its own first and last layer (its cuts are its ends) and on its index (for
    1F1B's in-flight count), so the optimum of a prefix extends to the optimum of the whole.
    """
    _check_stages(model.size, stages)
    found = _min_max_split(model.size, stages, lambda first, last, stage: model.stage_ms(first, last),
                           _fits(model, stages, memory_cap_bytes))
    if found is None:
        assert memory_cap_bytes is not None  # without a cap every split is feasible
        # The least memory any split needs for its fullest stage: what the cap must allow.
        lightest = _min_max_split(model.size, stages,
                                  lambda first, last, stage: model.stage_bytes(first, last, stage, stages), None)
        assert lightest is not None
        needed = max(model.stage_bytes(first, last, stage, stages) for stage, (first, last) in enumerate(lightest))
        raise PartitionError(
            f"no way to cut the {model.size} layers into {stages} stages fits memory_cap_mb={memory_cap_bytes / MB:g}: "
            f"the best split still needs {needed / MB:.1f} MB on its fullest stage; raise memory_cap_mb to at least "
            f"{math.ceil(needed / MB)}, use more stages or fewer microbatches")
    return Partition(tuple(found), "auto")


def _fits(model: CostModel, stages: int, cap: float | None) -> Callable[[int, int, int], bool] | None:
    if cap is None:
        return None
    return lambda first, last, stage: model.stage_bytes(first, last, stage, stages) <= cap


def _min_max_split(size: int, stages: int, cost: Callable[[int, int, int], float],
                   feasible: Callable[[int, int, int], bool] | None) -> list[StageRange] | None:
    """Ranges minimising the largest cost(first, last, stage index), or None when no split
    is feasible. Ties go to the earliest cut, so the answer is a function of the costs alone."""
    infinity = math.inf
    # best[s][j]: s stages over layers[0:j]; cut_at[s][j]: where the s-th stage starts.
    best = [[infinity] * (size + 1) for _ in range(stages + 1)]
    cut_at = [[-1] * (size + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for stage_count in range(1, stages + 1):
        stage = stage_count - 1
        # Every later stage needs at least one layer of its own.
        for end in range(stage_count, size - (stages - stage_count) + 1):
            for start in range(stage, end):
                before = best[stage][start]
                if before == infinity:
                    continue
                if feasible is not None and not feasible(start, end - 1, stage):
                    continue
                value = max(before, cost(start, end - 1, stage))
                if value < best[stage_count][end]:
                    best[stage_count][end] = value
                    cut_at[stage_count][end] = start
    if best[stages][size] == infinity:
        return None
    ranges: list[StageRange] = []
    end = size
    for stage_count in range(stages, 0, -1):
        start = cut_at[stage_count][end]
        ranges.append((start, end - 1))
        end = start
    return ranges[::-1]


def brute_force(model: CostModel, stages: int, memory_cap_bytes: float | None = None) -> Partition | None:
    """Every split, for checking auto_partition on small cases; None when none fits."""
    _check_stages(model.size, stages)
    best: tuple[float, tuple[StageRange, ...]] | None = None
    for cuts in itertools.combinations(range(1, model.size), stages - 1):
        edges = (0, *cuts, model.size)
        ranges = tuple((edges[i], edges[i + 1] - 1) for i in range(stages))
        if memory_cap_bytes is not None and any(
                model.stage_bytes(first, last, stage, stages) > memory_cap_bytes for stage, (first, last) in enumerate(ranges)):
            continue
        value = max(model.stage_ms(first, last) for first, last in ranges)
        if best is None or value < best[0]:
            best = (value, ranges)
    return None if best is None else Partition(best[1], "auto")


# --- the profiler -----------------------------------------------------------------------------
def profile_layers(layers: Sequence[nn.Module], names: Sequence[str], inputs: torch.Tensor, targets: torch.Tensor,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *, repeats: int = 5,
                   warmup: int = 1, device: torch.device | None = None) -> list[LayerCost]:
    """Each layer's cost on one microbatch, run alone: forward and backward time (median
    of `repeats` after `warmup`), parameter bytes, the bytes autograd saves for backward
    (parameters excluded: they are counted once, as parameters) and its output's bytes.
    The last layer's figures include the loss, as the pipeline's last stage computes it.
    With a device, each layer visits it only while it is measured (the whole model need
    not fit one device: that is what a pipeline is for). RNG state is restored
    afterwards, so profiling never changes what training draws."""
    import torch

    device = device or torch.device("cpu")
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    costs: list[LayerCost] = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        current, targets = inputs.to(device), targets.to(device)
        for index, (layer, name) in enumerate(zip(layers, names, strict=True)):
            last = index == len(layers) - 1
            parameter = next(iter(layer.parameters()), None)
            home = parameter.device if parameter is not None else device
            layer.to(device)
            parameters = {parameter.data_ptr() for parameter in layer.parameters()}

            def run(layer: nn.Module = layer, source: torch.Tensor = current, last: bool = last) -> tuple[torch.Tensor, torch.Tensor]:
                entry = source.detach().requires_grad_(source.is_floating_point())
                output = layer(entry)
                return output, (loss_fn(output, targets) if last else output)

            forward_times, backward_times = [], []
            for repetition in range(warmup + repeats):
                synchronize()
                started = time.perf_counter()
                output, result = run()
                synchronize()
                middle = time.perf_counter()
                if result.requires_grad:
                    gradient = None if last else torch.ones_like(result)
                    torch.autograd.backward(result, gradient)
                synchronize()
                finished = time.perf_counter()
                layer.zero_grad(set_to_none=True)
                if repetition >= warmup:
                    forward_times.append((middle - started) * 1000)
                    backward_times.append((finished - middle) * 1000)
            saved: dict[int, int] = {}

            def pack(tensor: torch.Tensor, saved: dict[int, int] = saved, parameters: set[int] = parameters) -> torch.Tensor:
                pointer = tensor.untyped_storage().data_ptr()
                if pointer not in parameters:
                    saved[pointer] = max(saved.get(pointer, 0), tensor.untyped_storage().nbytes())
                return tensor

            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                output, _ = run()
            costs.append(LayerCost(
                name=name,
                forward_ms=statistics.median(forward_times),
                backward_ms=statistics.median(backward_times),
                parameter_bytes=sum(parameter.numel() * parameter.element_size() for parameter in layer.parameters()),
                activation_bytes=sum(saved.values()),
                output_bytes=output.numel() * output.element_size(),
            ))
            current = output.detach()
            layer.to(home)
    return costs
