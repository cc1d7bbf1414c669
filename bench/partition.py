#!/usr/bin/env python
"""Pipeline partitions: `auto` (profiled, exact min-max split) beside the baseline `even`
(equal layer counts), on a deliberately unbalanced model.

    python bench/partition.py [--steps 20] [--repeat 3] [--stages 2 3] [--vocabulary 3000]

The model is char-lm's own stack (algorithms.charlm.build_layers) with a huge
vocabulary: a big embedding (cheap to run, many parameters), 8 transformer blocks and an
output head over the vocabulary that costs as much as several blocks. For each stage
count and partition it prints
1. predicted balance: slowest stage ÷ mean stage, from the profile and the cost model
   (trainyard.parallel.partition) the pipeline itself uses;
2. measured balance: each stage run for real, alone, on this machine (one thread, the
   forward and backward of a whole step's microbatches, median of --steps);
3. pipeline step: the wall time of a training step of a real two-process pipeline
   (torch.distributed.run, gloo, one thread each: trainyard.parallel.stages's StageRunner
   over torch.distributed.pipelining, GPipe) — its fastest step and its median step —
   with its stages' own compute balance ("in-pipeline"). Runs of the two partitions
   alternate, --repeat times, and the best of each is compared: on a shared machine the
   fastest step is the one a neighbour's burst of CPU did not touch. Only
   for 2 stages: three processes on this machine's two cores would measure the machine,
   not the partition.
Each figure sits beside the `even` baseline from the same run. Target: auto balance ≤ 1.10.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `datasets` here is our app, not a PyPI package
BATCH, MICROBATCHES = 16, 4
RESULT = "bench-result "


def architecture(vocabulary: int) -> dict:
    return {"vocabulary_size": vocabulary, "context_length": 64, "embedding_dim": 96, "layers": 8, "heads": 4,
            "dropout": 0.0}


def build(vocabulary: int):
    import torch

    from algorithms.charlm import build_layers, layer_names

    torch.manual_seed(0)
    config = architecture(vocabulary)
    return build_layers(config), layer_names(config)


def batch(vocabulary: int, size: int):
    import torch

    generator = torch.Generator().manual_seed(1)
    shape = (size, architecture(vocabulary)["context_length"])
    return torch.randint(1, vocabulary, shape, generator=generator), torch.randint(1, vocabulary, shape, generator=generator)


def measure_stages(layers, ranges, vocabulary: int, steps: int) -> list[float]:
    """Each stage alone: a step's microbatches forward, then backward with a gradient of its
    output's shape (the last stage from the loss), as the pipeline runs it; median ms."""
    import torch

    from trainyard.parallel.stages import summed_cross_entropy

    inputs, targets = batch(vocabulary, BATCH)
    micro_inputs, micro_targets = inputs.chunk(MICROBATCHES), targets.chunk(MICROBATCHES)
    # What enters each stage: the previous stages' output for each microbatch.
    entries = [list(micro_inputs)]
    with torch.no_grad():
        for first, last in ranges[:-1]:
            entries.append([torch.nn.Sequential(*layers[first:last + 1])(x) for x in entries[-1]])
    times = []
    for stage, (first, last) in enumerate(ranges):
        module = torch.nn.Sequential(*layers[first:last + 1])
        samples = []
        for _ in range(steps + 1):  # the first is a warm-up
            started = time.perf_counter()
            outputs = []
            for entry in entries[stage]:
                source = entry.detach().requires_grad_(entry.is_floating_point())
                outputs.append(module(source))
            for index, output in enumerate(outputs):
                if stage == len(ranges) - 1:
                    summed_cross_entropy(output, micro_targets[index], 1.0 / targets.numel()).backward()
                else:
                    output.backward(torch.ones_like(output))
            samples.append((time.perf_counter() - started) * 1000)
            module.zero_grad(set_to_none=True)
        times.append(statistics.median(samples[1:]))
    return times


def run_pipeline(ranges, vocabulary: int, steps: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(len(ranges)),
               str(Path(__file__).resolve()), "--worker", json.dumps(ranges), "--vocabulary", str(vocabulary),
               "--steps", str(steps)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    for line in done.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    raise RuntimeError(f"pipeline run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")


def worker(ranges: list[list[int]], vocabulary: int, steps: int) -> None:
    """One process of the real pipeline: its stage of the same seeded model, GPipe steps."""
    from collections import OrderedDict

    import torch

    from trainyard.parallel.stages import PipelineSettings, StageRunner

    torch.distributed.init_process_group("gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    layers, _ = build(vocabulary)
    first, last = ranges[rank]
    module = torch.nn.Sequential(OrderedDict((str(index), layers[index]) for index in range(first, last + 1)))
    optimizer = torch.optim.AdamW(module.parameters(), lr=1e-3)
    runner = StageRunner(module, rank, world, torch.device("cpu"),
                         PipelineSettings(stages=world, microbatches=MICROBATCHES, schedule="gpipe"))
    inputs, targets = batch(vocabulary, BATCH)
    step_ms = []
    for step in range(steps + 2):  # two warm-ups: the first also sets the stages up
        if step == 2:
            runner.clock.seconds, runner.clock.steps = 0.0, 0
        torch.distributed.barrier()
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        runner.train_step(inputs, targets)
        optimizer.step()
        torch.distributed.barrier()
        step_ms.append((time.perf_counter() - started) * 1000)
    stage_ms: list[float | None] = [None] * world
    torch.distributed.all_gather_object(stage_ms, runner.clock.ms_per_step)
    if rank == 0:
        print(RESULT + json.dumps({"step_ms": statistics.median(step_ms[2:]), "fastest_ms": min(step_ms[2:]),
                                   "stage_ms": stage_ms}), flush=True)
    torch.distributed.destroy_process_group()


def show(ranges) -> str:
    return " ".join(f"[{first}-{last}]" for first, last in ranges)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3, help="pipeline runs of each partition, alternating; best kept")
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--vocabulary", type=int, default=3_000)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker), args.vocabulary, args.steps)
        return 0

    import torch

    from trainyard.parallel.partition import CostModel, auto_partition, balance, even_partition, profile_layers
    from trainyard.parallel.stages import BANDWIDTH_BYTES_PER_MS, summed_cross_entropy

    torch.set_num_threads(1)  # as each pipeline process runs
    started = time.monotonic()
    layers, names = build(args.vocabulary)
    parameters = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    print(f"model: {len(layers)} layers ({', '.join(names)}), vocabulary {args.vocabulary}, "
          f"batch {BATCH} × {architecture(args.vocabulary)['context_length']} characters in {MICROBATCHES} microbatches")
    print(f"parameters per layer: {', '.join(f'{name}={count / 1e6:.2f}M' for name, count in zip(names, parameters, strict=True))}")
    inputs, targets = batch(args.vocabulary, BATCH // MICROBATCHES)
    costs = profile_layers(layers, names, inputs, targets, summed_cross_entropy, repeats=5)
    print("profiled fwd+bwd ms per microbatch: " + ", ".join(f"{cost.name}={cost.forward_ms + cost.backward_ms:.1f}"
                                                           for cost in costs))
    model = CostModel(tuple(costs), microbatches=MICROBATCHES, schedule="gpipe",
                      bandwidth_bytes_per_ms=BANDWIDTH_BYTES_PER_MS["gloo"])
    for stages in args.stages:
        print(f"\n{stages} stages")
        print(f"  {'partition':<16}{'stages (layers)':<26}{'predicted':>10}{'measured':>10}"
              f"{'step fastest':>22}{'median':>9}{'in-pipeline':>13}")
        partitions = (even_partition(len(layers), stages), auto_partition(model, stages))
        best: list[dict | None] = [None, None]
        for _ in range(args.repeat if stages == 2 else 0):
            for index, partition in enumerate(partitions):
                result = run_pipeline([list(pair) for pair in partition.ranges], args.vocabulary, args.steps)
                if best[index] is None or result["fastest_ms"] < best[index]["fastest_ms"]:
                    best[index] = result
        for partition, result in zip(partitions, best, strict=True):
            predicted = balance(partition.predicted_ms(model))
            measured = balance(measure_stages(layers, [list(pair) for pair in partition.ranges], args.vocabulary, args.steps))
            step = median = inside = "-"
            if result is not None:
                step, median = f"{result['fastest_ms']:.0f} ms", f"{result['step_ms']:.0f} ms"
                inside = f"{balance(result['stage_ms']):.3f}"
                if partition is partitions[1] and best[0] is not None:
                    step += f" ({result['fastest_ms'] / best[0]['fastest_ms']:.2f}× even)"
            label = "even (baseline)" if partition.mode == "even" else "auto"
            print(f"  {label:<16}{show(partition.ranges):<26}{predicted:>10.3f}{measured:>10.3f}{step:>22}{median:>9}"
                  f"{inside:>13}", flush=True)
    load = os.getloadavg()[0]
    print(f"\nbalance = slowest stage ÷ mean stage (target for auto ≤ 1.10); done in {time.monotonic() - started:.0f}s; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs" + (" (busy: step times are noisy)" if load > 1.5 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
