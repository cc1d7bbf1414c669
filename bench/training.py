#!/usr/bin/env python
"""Platform overhead and cold start of a training job, each beside its baseline.

    python bench/training.py [--epochs 40] [--repeat 2]

1. Bare: `python -m algorithms.tabular` in one process over the demo tabular data, with
   the SM_* environment of a hand-made job directory (no studio, no torchrun, no Redis).
2. As a job: the same algorithm, data and hyperparameters submitted to a real studio
   (SQLite in a temporary data dir, an embedded Redis when REDIS_URL is unset, one real
   `studio worker` node): scheduled, staged, launched with torch.distributed.run, logs and
   metrics captured and published live.
Both runs print the algorithm's own `trained steps a..b in Xs (N steps/s)` line; the ratio
job/bare is the platform overhead on the training loop (target ≥ 0.95). The job's timeline
gives submit → Starting → Training → first metric point (cold: a new node process, nothing
cached, torch imported afresh).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `datasets` here is our app, not a PyPI package
STEPS_LINE = re.compile(r"trained steps (\d+)\.\.(\d+) in ([0-9.]+)s \(([0-9.]+) steps/s\)")


def parse_steps_per_second(text: str) -> float:
    found = STEPS_LINE.findall(text)
    if not found:
        raise RuntimeError(f"no 'trained steps' line in the output:\n{text[-3000:]}")
    return float(found[-1][3])


def run_bare(data: dict[str, Path], hyperparameters: dict, work: Path) -> float:
    base = work / "bare"
    for sub in ("model", "output/data", "checkpoints", "input/config"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    channels = {}
    for name, path in data.items():
        channel = name.split(".")[0]
        folder = base / "input" / "data" / channel
        folder.mkdir(parents=True, exist_ok=True)
        (folder / path.name).symlink_to(path)
        channels[channel] = str(folder)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "SM_"))},
        "SM_MODEL_DIR": str(base / "model"), "SM_OUTPUT_DIR": str(base / "output"),
        "SM_OUTPUT_DATA_DIR": str(base / "output/data"), "SM_CHECKPOINT_DIR": str(base / "checkpoints"),
        "SM_CHANNELS": json.dumps(sorted(channels)), "SM_HPS": json.dumps(hyperparameters),
        "SM_HOSTS": json.dumps(["bare"]), "SM_CURRENT_HOST": "bare", "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
        **{f"SM_CHANNEL_{k.upper()}": v for k, v in channels.items()},
    }
    done = subprocess.run([sys.executable, "-m", "algorithms.tabular"], cwd=base, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"bare run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return parse_steps_per_second(done.stdout + done.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind, interleaved; the best of each is compared")
    args = parser.parse_args()

    from studio_setup import PrivateStudio

    studio = PrivateStudio("trainyard-bench-training-")
    work = studio.work
    from datasets.actions import VersionOptions, register_local_files
    from datasets.demo import write_tabular
    from datasets.validation_run import run_validation
    from jobs.actions import submit_job
    from jobs.models import TrainingJob
    from jobs.scheduling import schedule_jobs
    from studio import actions

    data_dir = work / "data"
    data_dir.mkdir()
    data = write_tabular(data_dir)
    hyperparameters = {"epochs": args.epochs, "log_every_steps": 20}

    bare: list[float] = []
    user = actions.ensure_user("bench", password="bench-password-1")
    project = actions.create_project(slug="bench", owner=user)
    version, _ = register_local_files(project=project, name="tabular", description="", user=user, files=dict(data.items()),
                                      options=VersionOptions())
    assert run_validation(version.pk) == "ready"

    try:
        studio.start_node("bench-node")
        jobs_runs: list[tuple[float, dict]] = []
        for i in range(args.repeat):
            # Interleaved with the job runs, so a drift in the machine's load hits both alike.
            bare.append(run_bare(data, hyperparameters, work / f"bare-{i}"))
            submitted = time.time()
            job = submit_job(project=project, user=user, data={
                "name": f"bench-{i}", "algorithm": "tabular-classifier", "hyperparameters": hyperparameters,
                "inputs": {"train": version.pk}, "resources": {"instance_type": "cpu"}})
            while TrainingJob.objects.filter(pk=job.pk, status="Pending").exists():
                schedule_jobs()
                time.sleep(0.05)
            deadline = time.monotonic() + 600
            while not TrainingJob.objects.get(pk=job.pk).is_finished():
                if time.monotonic() > deadline:
                    raise RuntimeError("the job did not finish in 10 minutes")
                time.sleep(0.2)
            job.refresh_from_db()
            if job.status != "Completed":
                raise RuntimeError(f"job ended {job.status}: {job.failure_reason}")
            events = {e.status: e.at.timestamp() for e in reversed(list(job.events.all()))}  # first of each status
            log_text = _read_rank_log(job.output_uri)
            first_point = _first_metric_time(job.pk)
            jobs_runs.append((parse_steps_per_second(log_text), {
                "starting": events.get("Starting", submitted) - submitted,
                "training": events.get("Training", submitted) - submitted,
                "first_metric": (first_point - submitted) if first_point else float("nan"),
                "completed": events.get("Completed", submitted) - submitted,
            }))
    finally:
        studio.close()

    best_bare, best_job = max(bare), max(r[0] for r in jobs_runs)
    cold = jobs_runs[0][1]
    print(f"tabular-classifier, demo-tabular, epochs={args.epochs}, best of {args.repeat}")
    print(f"{'run':<34}{'steps/s':>12}")
    print(f"{'bare loop, one process':<34}{best_bare:>12.1f}   (all: {', '.join(f'{v:.0f}' for v in bare)})")
    print(f"{'as a Trainyard job':<34}{best_job:>12.1f}   (all: {', '.join(f'{r[0]:.0f}' for r in jobs_runs)})")
    print(f"ratio job/bare: {best_job / best_bare:.3f}  {'PASS' if best_job / best_bare >= 0.95 else 'BELOW'} (target >= 0.95)")
    print("cold start of the first job (seconds after submit):")
    for label, key in (("scheduled, Starting", "starting"), ("launched, Training", "training"),
                       ("first metric point (step 20)", "first_metric"), ("Completed", "completed")):
        print(f"  {label:<32}{cold[key]:>8.2f}")
    return 0


def _read_rank_log(output_uri: str) -> str:
    from datasets.storage import store_for

    uri = f"{output_uri}/logs/rank-0.log"
    with store_for(uri).open_read(uri) as stream:
        return stream.read().decode(errors="replace")


def _first_metric_time(job_id: int) -> float | None:
    from studio.redis_conn import redis_client
    from trainyard.protocol import METRICS_STREAM, key

    entries = redis_client().xrange(key(METRICS_STREAM, job_id), count=1)
    if not entries:
        return None
    points = json.loads(entries[0][1][b"p"] if b"p" in entries[0][1] else entries[0][1]["p"])
    return min(point[3] for point in points)


if __name__ == "__main__":
    sys.exit(main())
