#!/usr/bin/env python
"""Submit → first training step, cold vs. warm, for the same job (issue 4, warm pools).

    python bench/warm_start.py [--repeat 3]

A private studio (SQLite in a temporary data dir, an embedded Redis unless REDIS_URL is
set, one real `studio worker` node) runs tabular-classifier on the demo tabular data with
log_every_steps=1, so the first metric point is the first training step; its timestamp
comes from the training process itself. Each round:

1. cold: the job with keep_alive_seconds=300 on an idle node — torch.distributed.run
   starts, the worker imports torch;
2. warm: the same job again — it lands in the pool the first left, forked from the pool's
   fork server (torch already imported) with the data cache filled.
Then the pool is expired (its fork server closes) so the next round starts cold again.
The scheduler runs in this process every 20 ms for both kinds alike. Prints each run and
the medians; targets: warm ≤ 1 s and cold/warm ≥ 5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    from studio_setup import PrivateStudio

    studio = PrivateStudio("trainyard-bench-warm-", {"STUDIO_NODE_HEARTBEAT_SECONDS": "1"})
    work = studio.work
    from django.utils import timezone

    from datasets.actions import VersionOptions, register_local_files
    from datasets.demo import write_tabular
    from datasets.validation_run import run_validation
    from jobs.actions import submit_job
    from jobs.models import Node, TrainingJob
    from jobs.scheduling import schedule_jobs
    from studio import actions

    data_dir = work / "data"
    data_dir.mkdir()
    data = write_tabular(data_dir)
    user = actions.ensure_user("bench", password="bench-password-1")
    project = actions.create_project(slug="bench", owner=user)
    version, _ = register_local_files(project=project, name="tabular", description="", user=user,
                                      files=dict(data.items()), options=VersionOptions())
    assert run_validation(version.pk) == "ready"

    def run(name: str) -> tuple[float, str]:
        submitted = time.time()
        job = submit_job(project=project, user=user, data={
            "name": name, "algorithm": "tabular-classifier", "inputs": {"train": version.pk},
            "hyperparameters": {"epochs": 1, "log_every_steps": 1}, "resources": {"instance_type": "cpu"},
            "keep_alive_seconds": 300})
        while TrainingJob.objects.filter(pk=job.pk, status="Pending").exists():
            schedule_jobs()
            time.sleep(0.02)
        deadline = time.monotonic() + 300
        while not TrainingJob.objects.get(pk=job.pk).is_finished():
            if time.monotonic() > deadline:
                raise RuntimeError("the job did not finish in 5 minutes")
            time.sleep(0.1)
        job.refresh_from_db()
        if job.status != "Completed":
            raise RuntimeError(f"job ended {job.status}: {job.failure_reason}")
        first = _first_point_time(job.pk)
        if os.environ.get("BENCH_VERBOSE"):
            for event in job.events.order_by("at", "pk"):
                print(f"    {event.at.timestamp() - submitted:6.3f} {event.status:<10} {event.message[:90]}")
            print(f"    {first - submitted:6.3f} first point")
        return first - submitted, job.warm_pool

    cold: list[float] = []
    warm: list[float] = []
    try:
        studio.start_node("bench-node")
        for i in range(args.repeat):
            seconds, pool = run(f"cold-{i}")
            assert not pool, "the first job of a round starts cold"
            cold.append(seconds)
            _wait(lambda: Node.objects.filter(name="bench-node", state="warm").exists(), "the node to turn warm")
            time.sleep(3)  # the pool's fork server finishes importing torch while the pool waits
            seconds, pool = run(f"warm-{i}")
            if not pool:
                raise RuntimeError("the second job did not start in the warm pool")
            warm.append(seconds)
            print(f"round {i + 1}: cold {cold[-1]:.2f} s, warm {warm[-1]:.2f} s (pool {pool})", flush=True)
            _wait(lambda: Node.objects.filter(name="bench-node", state="warm").exists(), "the node to turn warm")
            Node.objects.filter(name="bench-node").update(warm_until=timezone.now() - timedelta(seconds=1))
            schedule_jobs()  # expires the pool; the node's heartbeat closes its fork server
            time.sleep(3)
    finally:
        studio.close()

    cold_median, warm_median = statistics.median(cold), statistics.median(warm)
    print("submit → first training step (tabular-classifier on demo-tabular, seconds)")
    print(f"  cold (torch.distributed.run, fresh interpreters)  median {cold_median:6.2f}   all {_fmt(cold)}")
    print(f"  warm (forked from the pool's fork server)         median {warm_median:6.2f}   all {_fmt(warm)}")
    ratio = cold_median / warm_median
    print(f"  cold/warm: {ratio:.1f}x   warm ≤ 1 s: {'PASS' if warm_median <= 1 else 'FAIL'}   "
          f"≥ 5x: {'PASS' if ratio >= 5 else 'FAIL'}")
    return 0


def _fmt(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _wait(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _first_point_time(job_id: int) -> float:
    from studio.redis_conn import redis_client
    from trainyard.protocol import METRICS_STREAM, key

    entries = redis_client().xrange(key(METRICS_STREAM, job_id))
    times = [point[3] for _, fields in entries for point in json.loads(fields[b"p"])]
    if not times:
        raise RuntimeError(f"job {job_id} logged no metric point")
    return min(times)


if __name__ == "__main__":
    sys.exit(main())
