"""Rules on the live metric stream: what the rule watcher costs the ingest path, and how
fast a NaN stops a job — each figure beside a baseline measured in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/rules.py

1. Ingest with rules: --points points across 50 running jobs, drained by the flusher
   (`run_flusher`, as `studio flusher` runs it) with the rule watcher running beside it on a
   thread of the same process (as `studio flusher` runs it), evaluating 100 rules: each job
   has the default `non_finite` and a custom "M of N" rule on a window mean, so every
   payload is parsed and every point evaluated. Baseline: the same drain with no watcher.
   Pairs alternate which goes first; the figure is the median ratio of throughputs
   (target: ≥ 0.95, i.e. ≤ 5 % overhead; the bench exits 1 below it). Also the watcher's own rate (points/s through
   100 rules) and whether it kept up (its lag when the flusher finished).
2. Stop latency: `trainyard.log_metric(NaN)` in the SDK → the job's stop request
   (`stop_requested_at`), p50/p95 over --trials jobs, with the flusher and the watcher
   running as above. Baseline: the same point's trip to the database by the flusher
   (log_metric → the MetricPoint row of a finite point sent in the same call), timed in the
   same trials.

Database and Redis as bench/metrics.py: PostgreSQL when DATABASE_URL says so (a database of
its own, dropped at the end), else a temporary SQLite file; an embedded Redis of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from metrics import drop_database, pct, prepare_database, row  # noqa: E402 - bench/ is the script's dir

JOBS = 50
CUSTOM_RULE = {"name": "loss-high", "type": "custom",
               "parameters": {"metric": "loss", "statistic": "mean", "window": 10, "comparison": ">", "threshold": 100.0,
                              "datapoints_to_alarm": 3, "evaluation_periods": 5}}


def make_jobs(project, label: str, count: int = JOBS) -> list:
    from django.db import transaction
    from django.utils import timezone

    from jobs.models import JobRule, JobStatus, TrainingJob
    from jobs.rules.engine import check_rules

    jobs = []
    for i in range(count):
        # The job and its rules in one transaction, as a submission makes them: a watcher that
        # looked in between would watch the job with half its rules, and the other half would
        # miss the job's first point (the latency trials then waited for ever).
        with transaction.atomic():
            job = TrainingJob.objects.create(project=project, name=f"{label}-{i}", status=JobStatus.TRAINING,
                                             started_at=timezone.now(), training_started_at=timezone.now())
            for spec in check_rules([CUSTOM_RULE]):
                JobRule.objects.create(job=job, name=spec["name"], type=spec["type"], parameters=spec["parameters"],
                                       actions=spec["actions"], enabled=spec["enabled"])
        jobs.append(job)
    return jobs


def fill(jobs: list, redis_url: str, points: int) -> None:
    from trainyard.metrics import MetricsLogger

    steps = points // (2 * len(jobs))
    for job in jobs:
        logger = MetricsLogger(job.pk, redis_url)
        for step in range(steps):
            logger.log_metrics({"loss": 1.0 / (step + 1), "acc": step / steps}, step)
        assert logger.flush(60)


def _watcher_process(ready, done, stop) -> None:
    """A watcher in a process of its own (forked: Django is set up; fresh connections)."""
    from django.db import connections

    from jobs.rules.watcher import RuleWatcher, run_watcher

    connections.close_all()
    os.nice(int(os.environ.get("BENCH_WATCHER_NICE", "0")))
    watcher = RuleWatcher(discover_seconds=0.5)
    thread = threading.Thread(target=run_watcher, args=(stop,), kwargs={"watcher": watcher}, daemon=True)
    thread.start()
    ready.set()
    while not stop.is_set():
        done.value = watcher.entries_seen
        time.sleep(0.02)
    thread.join(30)


def drain_with_process(jobs: list) -> dict[str, float]:
    """As drain(with_watcher=True), the watcher in its own process (`studio flusher --no-rules`
    beside `studio rules`)."""
    import multiprocessing

    from django.db import connections

    from jobs.metrics.ingest import Flusher, run_flusher
    from jobs.models import MetricPoint
    from trainyard.protocol import METRICS_STREAM, key

    settle()
    connections.close_all()
    context = multiprocessing.get_context("fork")
    ready, stop, done = context.Event(), context.Event(), context.Value("q", 0)
    process = context.Process(target=_watcher_process, args=(ready, done, stop), daemon=True)
    process.start()
    ready.wait(30)
    time.sleep(1.5)  # its discovery
    flusher = Flusher(discover_running=False)
    entries = sum(flusher.redis.xlen(key(METRICS_STREAM, j.pk)) for j in jobs)
    stop_flusher = threading.Event()
    stop_flusher.set()
    started = time.perf_counter()
    run_flusher(stop_flusher, flusher=flusher, drain_seconds=3600)
    elapsed = time.perf_counter() - started
    lag = entries - done.value
    deadline = time.monotonic() + 120
    while done.value < entries and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    process.join(30)
    ids = [j.pk for j in jobs]
    stored = MetricPoint.objects.filter(job_id__in=ids).count()
    MetricPoint.objects.filter(job_id__in=ids).delete()
    return {"points": stored, "seconds": elapsed, "rate": stored / elapsed, "lag_entries": lag}


def settle() -> None:
    """Before each timed drain, on PostgreSQL: the previous drain's deleted rows vacuumed and
    the dirty pages flushed, so neither side of a pair pays for the other's autovacuum or
    checkpoint (they ran at random inside drains and were measured as ±25 % on either side)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        for table in ("jobs_metricpoint", "jobs_metricchunk", "jobs_alarmtransition", "jobs_jobrule"):
            cursor.execute(f"VACUUM ANALYZE {table}")
        cursor.execute("CHECKPOINT")


def drain(jobs: list, *, with_watcher: bool) -> dict[str, float]:
    """Time the flusher draining the jobs' streams; with the watcher on a thread beside it."""
    from jobs.metrics.ingest import Flusher, run_flusher
    from jobs.models import MetricPoint
    from jobs.rules.watcher import RuleWatcher, run_watcher
    from trainyard.protocol import METRICS_STREAM, key

    watcher_stop = threading.Event()
    watcher = RuleWatcher(discover_seconds=0.5) if with_watcher else None
    thread = None
    if watcher is not None:
        thread = threading.Thread(target=run_watcher, args=(watcher_stop,), kwargs={"watcher": watcher}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while len(watcher.jobs) < len(jobs) and time.monotonic() < deadline:
            time.sleep(0.05)  # it has found the jobs (its discovery is not what is timed)
    flusher = Flusher(discover_running=False)
    settle()
    stop = threading.Event()
    stop.set()  # drain what is there, then return
    started = time.perf_counter()
    run_flusher(stop, flusher=flusher, drain_seconds=3600)
    elapsed = time.perf_counter() - started
    ids = [j.pk for j in jobs]
    stored = MetricPoint.objects.filter(job_id__in=ids).count()
    result = {"points": stored, "seconds": elapsed, "rate": stored / elapsed}
    if watcher is not None:
        entries = sum(flusher.redis.xlen(key(METRICS_STREAM, j.pk)) for j in jobs)
        lag_entries = entries - watcher.entries_seen
        deadline = time.monotonic() + 120
        while watcher.entries_seen < entries and time.monotonic() < deadline:
            time.sleep(0.05)
        result["watcher_seconds"] = time.perf_counter() - started
        result["watcher_lag_points"] = stored * lag_entries / max(1, entries)  # entries hold equal shares
        result["watcher_seen"] = stored * watcher.entries_seen / max(1, entries)
        result["watcher_cpu"] = watcher.cpu_seconds
        watcher_stop.set()
        assert thread is not None
        thread.join(30)
    MetricPoint.objects.filter(job_id__in=ids).delete()
    return result


def ingest_overhead(project, redis_url: str, points: int, repeats: int, *, process: bool = False) -> float:
    """Returns the median ratio of throughputs (with the watcher / without)."""
    ratios, base_rates, rule_rates, watcher_rates, lags = [], [], [], [], []
    for repeat in range(repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        got = {}
        for with_watcher in order:
            jobs = make_jobs(project, f"r{repeat}-{'w' if with_watcher else 'b'}")
            fill(jobs, redis_url, points)
            got[with_watcher] = drain(jobs, with_watcher=with_watcher)
            from jobs.models import TrainingJob

            TrainingJob.objects.filter(pk__in=[j.pk for j in jobs]).update(status="Completed")
        ratios.append(got[True]["rate"] / got[False]["rate"])
        base_rates.append(got[False]["rate"])
        rule_rates.append(got[True]["rate"])
        watcher_rates.append(got[True]["watcher_seen"] / got[True]["watcher_seconds"])
        lags.append(got[True]["watcher_lag_points"])
        print(f"    pair {repeat + 1}: no rules {got[False]['rate']:,.0f} pts/s, with the watcher "
              f"{got[True]['rate']:,.0f} pts/s → {ratios[-1]:.3f}×; watcher lag at the flusher's end "
              f"{got[True]['watcher_lag_points']:,.0f} points; its CPU {got[True]['watcher_cpu']:.2f} s of the drain's "
              f"{got[True]['seconds']:.2f} s", flush=True)
    row("ingest with 100 rules on 50 jobs", f"{median(rule_rates):,.0f} points/s", f"{median(base_rates):,.0f} without rules",
        f"median ratio {median(ratios):.3f}× (range {min(ratios):.3f}–{max(ratios):.3f}); target ≥ 0.95")
    if process:
        proc_ratios = []
        for repeat in range(repeats):
            base_jobs = make_jobs(project, f"p{repeat}-b")
            fill(base_jobs, redis_url, points)
            base = drain(base_jobs, with_watcher=False)
            from jobs.models import TrainingJob

            TrainingJob.objects.filter(pk__in=[j.pk for j in base_jobs]).update(status="Completed")
            proc_jobs = make_jobs(project, f"p{repeat}-p")
            fill(proc_jobs, redis_url, points)
            apart = drain_with_process(proc_jobs)
            TrainingJob.objects.filter(pk__in=[j.pk for j in proc_jobs]).update(status="Completed")
            proc_ratios.append(apart["rate"] / base["rate"])
            print(f"    pair {repeat + 1} (watcher in its own process): no rules {base['rate']:,.0f} pts/s, "
                  f"with {apart['rate']:,.0f} pts/s → {proc_ratios[-1]:.3f}×; its lag {apart['lag_entries']:.0f} entries",
                  flush=True)
        row("… the watcher in its own process", f"median ratio {median(proc_ratios):.3f}×", "",
            f"range {min(proc_ratios):.3f}–{max(proc_ratios):.3f}")
    row("the watcher (100 rules), while the flusher ran", f"{median(watcher_rates):,.0f} points/s", "",
        f"lag when the flusher finished: median {median(lags):,.0f} points")
    return median(ratios)


def stop_latency(project, redis_url: str, trials: int) -> None:
    from django.db import close_old_connections

    from jobs.metrics.ingest import run_flusher
    from jobs.models import JobRule, JobStatus, MetricPoint, RuleState, TrainingJob
    from jobs.rules.watcher import RuleWatcher, run_watcher
    from trainyard.metrics import MetricsLogger

    stop = threading.Event()
    watcher = RuleWatcher()
    threads = [threading.Thread(target=run_flusher, args=(stop,), daemon=True),
               threading.Thread(target=run_watcher, args=(stop,), kwargs={"watcher": watcher}, daemon=True)]
    for thread in threads:
        thread.start()
    to_stop, to_store = [], []
    try:
        for trial in range(trials):
            job = make_jobs(project, f"latency-{trial}", count=1)[0]
            logger = MetricsLogger(job.pk, redis_url)
            logger.log_metric("loss", 1.0, 1)
            assert logger.flush(10)
            deadline = time.monotonic() + 30
            while not JobRule.objects.filter(job=job, name="non_finite", state=RuleState.OK).exists():
                if time.monotonic() > deadline:
                    raise AssertionError("the watcher never saw the job's first point")
                time.sleep(0.02)
            sent = time.time()
            # One call: the NaN loss and a finite accuracy, whose row is the baseline's "stored"
            # (a NaN is not stored as a number on every database).
            logger.log_metrics({"loss": float("nan"), "acc": 0.5}, 2)
            stopped_at = stored_at = None
            deadline = time.monotonic() + 30
            while (stopped_at is None or stored_at is None) and time.monotonic() < deadline:
                close_old_connections()
                if stopped_at is None:
                    stopped_at = TrainingJob.objects.filter(pk=job.pk).values_list("stop_requested_at", flat=True).get()
                if stored_at is None and MetricPoint.objects.filter(job=job, name="acc", step=2).exists():
                    stored_at = time.time()
                time.sleep(0.005)
            assert stopped_at is not None, "no stop request within 30 s"
            to_stop.append(stopped_at.timestamp() - sent)
            to_store.append((stored_at or time.time()) - sent)
            logger.flush(5)
            TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.STOPPED)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    row("NaN log_metric → stop request", f"p50 {pct(to_stop, 0.5) * 1000:,.0f} ms, p95 {pct(to_stop, 0.95) * 1000:,.0f} ms",
        f"→ stored: p50 {pct(to_store, 0.5) * 1000:,.0f} ms, p95 {pct(to_store, 0.95) * 1000:,.0f} ms",
        f"{trials} jobs; includes the SDK's send interval")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=1_000_000, help="points per drain, across 50 jobs (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs of drains (default 3)")
    parser.add_argument("--trials", type=int, default=20, help="jobs stopped by a NaN for the latency (default 20)")
    parser.add_argument("--process", action="store_true", help="also time the watcher in a process of its own")
    parser.add_argument("--only", default="ingest,latency", help="ingest, latency or both (default)")
    args = parser.parse_args()
    parts = set(args.only.split(","))

    from studio.embedded_redis import EmbeddedRedis

    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-rules-"))
    redis = EmbeddedRedis(data_dir=workdir / "redis")
    redis_url = redis.start()
    os.environ.update({"REDIS_URL": redis_url, "STUDIO_DATA_DIR": str(workdir / "data"),
                       "DJANGO_SETTINGS_MODULE": "studio.settings", "STUDIO_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING")})
    label, pg_name = prepare_database(workdir)
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from studio import actions

        call_command("migrate", interactive=False, verbosity=0)
        project = actions.create_project(slug="bench", name="Bench")
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"Trainyard rules bench — database: {label}; Redis: embedded {redis_url}; {os.cpu_count()} CPUs, "
              f"load average {load}\n")
        print(f"  {'what':<44} {'Trainyard':<26} {'baseline (same run)':<34} note")
        missed = []
        if "ingest" in parts and (ratio := ingest_overhead(project, redis_url, args.points, args.repeats,
                                                           process=args.process)) < 0.95:
            missed.append(f"ingest with rules at {ratio:.3f}× of the baseline (target ≥ 0.95)")
        if "latency" in parts:
            stop_latency(project, redis_url, args.trials)
        print()
        for line in missed:
            print(f"MISSED: {line}")
        return 1 if missed else 0
    finally:
        if pg_name:
            drop_database(pg_name)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
