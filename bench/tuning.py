#!/usr/bin/env python
"""Hyperparameter searches run through the product: search quality, bayesian vs.
random, and the wall time of parallel trials on 2 nodes vs. 1.

    python bench/tuning.py [--seeds 5] [--trials 30] [--only quality,scaling]

A private studio (SQLite in a temporary data dir, an embedded Redis unless REDIS_URL is
set, real `studio worker` nodes) runs tuning jobs made by tuning.actions.create_tuning_job
(the API's action, after the API's serializer); this process does what the control worker
and the flusher would, every 30 ms: jobs.scheduling.schedule_jobs(), drain the metric
streams (jobs.metrics.ingest.Flusher), tick the search (tuning.engine.advance). Trials are
one script, uploaded as POST /api/v1/scripts/ stores it, whose final "loss" is a known
function of its hyperparameters (`valley` below): a curved, Rosenbrock-like valley in x
(linear, -2..2) and lr (log scale, 1e-4..1e-1) plus a penalty per optimizer
(categorical); its minimum is 0 at x = 1, lr = 1e-2, adam. Every trial's objective value
is checked against that function. The base job has keep_alive_seconds, so trials start
in the warm pool the previous trial left (forked, torch already imported); each search
reports how many did.

1. quality: 30-trial searches (max_parallel 2, on 2 nodes), strategy random and bayesian
   (TPE; its first 10 trials are random), seeds 1..5, interleaved so that load on the
   machine falls on both alike. Prints, per strategy, each seed's best loss, their mean
   and standard deviation, the known optimum and the regret (mean best − optimum), the
   baseline being random; target: bayesian's regret below random's. A random search's
   trials depend on its seed alone; a bayesian one's also on which of two parallel
   trials ended first when the next was asked for, so its per-seed figures vary a
   little from run to run (--seeds 20 gives a steadier mean).
2. scaling: one 16-trial random search (seed 1, max_parallel 2) whose trials each take
   about 1 s (4 steps of 0.25 s), first with one node, then with two. Both run warm:
   before each, warm-up jobs leave every node in a warm pool, so every trial of both
   searches forks from a fork server. Prints both wall times (create → Completed) and the
   ratio; ideal ≈ 2x.

About 2 minutes on 2 CPUs with the defaults (a warm trial of the quality searches takes
~0.4 s start to end); --seeds and --trials change it. Exits 1 when a search did not
complete or a trial's objective did not match valley(). Ends with the elapsed time and the
load average (other work on the machine slows the figures, the scaling ratio most).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import math
import os
import statistics
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TICK_SECONDS = 0.03
KEEP_ALIVE_SECONDS = 300
RANGES = {
    "x": {"type": "continuous", "min": -2, "max": 2},
    "lr": {"type": "continuous", "min": 1e-4, "max": 1e-1, "scale": "log"},
    "optimizer": {"type": "categorical", "values": ["adam", "sgd", "rmsprop"]},
}
OPTIMUM = 0.0
SCALING_TRIALS = 16
SCALING_STEPS, SCALING_STEP_SECONDS = 4, 0.25


def valley(x: float, lr: float, optimizer: str) -> float:
    """Rosenbrock's curved valley (curvature 10, not 100: a landscape 30 trials can make
    progress on) in x and log10(lr) + 3, plus a penalty per optimizer; 0 at x = 1,
    lr = 1e-2, adam."""
    u = math.log10(lr) + 3
    return (1 - x) ** 2 + 10 * (u - x**2) ** 2 + {"adam": 0.0, "sgd": 2.0, "rmsprop": 5.0}[optimizer]


# The trial script: `valley` plus a training loop that logs the loss per step, falling to
# valley(...) at the last step (the objective is the last value).
SCRIPT = textwrap.dedent('''\
    """Bench trial (bench/tuning.py): logs loss per step; the last is valley(x, lr, optimizer)."""
    import argparse
    import math
    import time

    from trainyard import log_metric

    {valley}

    parser = argparse.ArgumentParser()
    parser.add_argument("--x", type=float, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--optimizer", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step_seconds", type=float, default=0.0)
    args, _ = parser.parse_known_args()

    final = valley(args.x, args.lr, args.optimizer)
    for step in range(args.steps):
        time.sleep(args.step_seconds)
        log_metric("loss", final + (args.steps - 1 - step), step)
    ''').replace("{valley}", inspect.getsource(valley))


@dataclass
class SearchResult:
    strategy: str
    seed: int
    nodes: int
    best: float | None
    wall_seconds: float
    trials: int
    completed: int
    warm: int
    mismatched: int  # trials whose objective value is not valley(their params)
    status: str
    mean_trial_seconds: float


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..N per strategy (default 5)")
    parser.add_argument("--trials", type=int, default=30, help="trials per quality search (default 30)")
    parser.add_argument("--only", default="quality,scaling", help="quality, scaling or both (default)")
    args = parser.parse_args()
    parts = {p.strip() for p in args.only.split(",") if p.strip()}
    if not parts or parts - {"quality", "scaling"}:
        parser.error("--only takes quality, scaling or both")

    began = time.monotonic()
    from studio_setup import PrivateStudio

    studio = PrivateStudio("trainyard-bench-tuning-", {"STUDIO_NODE_HEARTBEAT_SECONDS": "1"})
    logging.disable(logging.INFO)  # the engine's and the flusher's per-job lines; warnings still show
    from jobs.scripts import store_script
    from studio import actions

    user = actions.ensure_user("bench", password="bench-password-1")
    project = actions.create_project(slug="bench", owner=user)
    stored = store_script(project.slug, "valley.py", SCRIPT.encode())
    base_job = {"script": {"uri": stored.uri, "entry_point": stored.entry_point},
                "resources": {"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1},
                "keep_alive_seconds": KEEP_ALIVE_SECONDS}
    bench = Bench(studio, project, user, base_job)

    quality: list[SearchResult] = []
    scaling: list[SearchResult] = []
    try:
        studio.start_node("bench-node-1")
        if "scaling" in parts:
            bench.warm_up(1)
            scaling.append(bench.scaling_search(nodes=1))
        studio.start_node("bench-node-2")
        bench.warm_up(2)
        if "scaling" in parts:
            scaling.append(bench.scaling_search(nodes=2))
        if "quality" in parts:
            for seed in range(1, args.seeds + 1):
                for strategy in ("random", "bayesian"):
                    result = bench.search(f"{strategy}-{seed}", strategy=strategy, seed=seed, trials=args.trials,
                                          hyperparameters={"steps": 3}, nodes=2)
                    quality.append(result)
                    print(f"  {strategy:<8} seed {seed}: best {_num(result.best)} in {result.wall_seconds:5.1f} s "
                          f"({result.completed}/{result.trials} completed, {result.warm} warm)", flush=True)
    finally:
        studio.close()

    if quality:
        report_quality(quality, args.trials)
    if scaling:
        report_scaling(scaling)
    checked = quality + scaling
    mismatched = sum(r.mismatched for r in checked)
    print(f"objective values checked against valley(): {sum(r.completed for r in checked)} trials, "
          f"{mismatched} mismatched")
    load = os.getloadavg()
    print(f"elapsed {time.monotonic() - began:.0f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
          f"on {os.cpu_count()} CPUs")
    return 1 if mismatched or any(r.status != "Completed" for r in checked) else 0


class Bench:
    def __init__(self, studio, project, user, base_job: dict) -> None:
        from jobs.metrics.ingest import Flusher

        self.studio, self.project, self.user, self.base_job = studio, project, user, base_job
        self.flusher = Flusher()

    def tick(self) -> None:
        from jobs.scheduling import schedule_jobs

        schedule_jobs()
        while self.flusher.flush_once(block_ms=0):
            pass

    def warm_up(self, count: int) -> None:
        """`count` jobs at once: every node ends in a warm pool (a job takes a warm pool
        first, an idle node next), and its fork server has imported torch."""
        from jobs.actions import submit_job
        from jobs.models import Node, TrainingJob

        ids = [submit_job(project=self.project, user=self.user, data={
            **self.base_job, "name": f"warm-up-{i}", "hyperparameters": {"x": 1, "lr": 0.01, "optimizer": "adam"}}).pk
            for i in range(count)]
        deadline = time.monotonic() + 180
        while (TrainingJob.objects.filter(pk__in=ids).exclude(status="Completed").exists()
               or Node.objects.filter(state="warm").count() < count):
            if time.monotonic() > deadline:
                raise RuntimeError(f"warm-up: {list(TrainingJob.objects.filter(pk__in=ids).values_list('status', 'failure_reason'))}, "
                                   f"nodes {list(Node.objects.values_list('name', 'state'))}")
            self.tick()
            time.sleep(TICK_SECONDS)
        time.sleep(5)  # the pools' fork servers finish importing torch

    def scaling_search(self, nodes: int) -> SearchResult:
        result = self.search(f"scaling-{nodes}-node", strategy="random", seed=1, trials=SCALING_TRIALS, nodes=nodes,
                             hyperparameters={"steps": SCALING_STEPS, "step_seconds": SCALING_STEP_SECONDS})
        print(f"  scaling, {nodes} node(s): {result.wall_seconds:5.1f} s ({result.completed}/{result.trials} "
              f"completed, {result.warm} warm, a trial's job {result.mean_trial_seconds:.2f} s)", flush=True)
        return result

    def search(self, name: str, *, strategy: str, seed: int, trials: int, nodes: int,
               hyperparameters: dict) -> SearchResult:
        """Create a tuning job as the API does and drive it until it ends."""
        from jobs.models import JobStatus, Node, NodeState
        from tuning.actions import create_tuning_job
        from tuning.engine import advance
        from tuning.serializers import TuningJobCreateSerializer

        registered = Node.objects.exclude(state__in=[NodeState.LOST, NodeState.STOPPED]).count()
        assert registered == nodes, f"{registered} nodes registered, the search wants {nodes}"
        serializer = TuningJobCreateSerializer(data={
            "project": self.project.slug, "name": name, "base_job": {**self.base_job, "hyperparameters": hyperparameters},
            "parameter_ranges": RANGES, "objective": {"metric": "loss", "goal": "minimize"}, "strategy": strategy,
            "max_trials": trials, "max_parallel": 2, "seed": seed})
        serializer.is_valid(raise_exception=True)
        started = time.monotonic()
        tuning = create_tuning_job(project=self.project, user=self.user, data=serializer.validated_data)
        deadline = started + max(300, 10 * trials)
        while True:
            self.tick()
            advance(tuning.pk)
            tuning.refresh_from_db()
            if tuning.is_finished():
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"search {name} did not end in {deadline - started:.0f} s: "
                                   f"{list(tuning.trials.values_list('trial_number', 'status', 'failure_reason'))}")
            time.sleep(TICK_SECONDS)
        wall = time.monotonic() - started
        rows = list(tuning.trials.order_by("trial_number"))
        completed = [t for t in rows if t.status == JobStatus.COMPLETED and t.objective_value is not None]
        mismatched = [t for t in completed if not math.isclose(t.objective_value, valley(**t.trial_params),
                                                                rel_tol=1e-9, abs_tol=1e-9)]
        for trial in mismatched:
            print(f"    trial {trial.trial_number} {trial.trial_params}: objective {trial.objective_value}, "
                  f"valley() {valley(**trial.trial_params)}")
        if tuning.status != "Completed":
            print(f"    search {name} ended {tuning.status} ({tuning.end_reason}): {tuning.failure_reason}")
        spans = [(t.finished_at - t.started_at).total_seconds() for t in completed if t.started_at and t.finished_at]
        return SearchResult(strategy=strategy, seed=seed, nodes=nodes, best=tuning.best_value, wall_seconds=wall,
                            trials=len(rows), completed=len(completed), warm=sum(1 for t in rows if t.warm_pool),
                            mismatched=len(mismatched), status=tuning.status,
                            mean_trial_seconds=statistics.mean(spans) if spans else float("nan"))


def report_quality(results: list[SearchResult], trials: int) -> None:
    print(f"\nbest loss after {trials} trials (max_parallel 2, 2 nodes), known optimum {OPTIMUM:g}; "
          "regret = mean best − optimum")
    regret: dict[str, float] = {}
    for strategy, label in (("random", "random (baseline)"), ("bayesian", "bayesian (TPE)")):
        bests = [r.best for r in results if r.strategy == strategy and r.best is not None]
        if not bests:
            print(f"  {label:<18} no search completed")
            continue
        regret[strategy] = statistics.mean(bests) - OPTIMUM
        spread = statistics.stdev(bests) if len(bests) > 1 else 0.0
        seconds = statistics.mean(r.wall_seconds for r in results if r.strategy == strategy)
        print(f"  {label:<18} mean {statistics.mean(bests):7.3f}  std {spread:6.3f}  regret {regret[strategy]:7.3f}  "
              f"per seed {', '.join(_num(b) for b in bests)}  ({seconds:.1f} s a search)")
    if len(regret) == 2:
        verdict = "PASS" if regret["bayesian"] < regret["random"] else "FAIL"
        ratio = regret["random"] / regret["bayesian"] if regret["bayesian"] > 0 else float("inf")
        print(f"  regret random/bayesian: {ratio:.2f}x   bayesian better than random: {verdict}")


def report_scaling(results: list[SearchResult]) -> None:
    by_nodes = {r.nodes: r for r in results}
    print(f"\nwall time of a {SCALING_TRIALS}-trial random search, max_parallel 2, trials of "
          f"{SCALING_STEPS} × {SCALING_STEP_SECONDS} s, every node warm before it")
    for nodes, result in sorted(by_nodes.items()):
        label = "1 node (baseline)" if nodes == 1 else f"{nodes} nodes"
        print(f"  {label:<18} {result.wall_seconds:6.1f} s   {result.warm}/{result.trials} trials started warm, "
              f"a trial's job {result.mean_trial_seconds:.2f} s (start → end)")
    if 1 in by_nodes and 2 in by_nodes:
        ratio = by_nodes[1].wall_seconds / by_nodes[2].wall_seconds
        print(f"  1 node / 2 nodes: {ratio:.2f}x (ideal 2x)")


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
