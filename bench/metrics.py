"""Metrics, end to end, each figure beside a baseline measured in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/metrics.py

1. `trainyard.log_metric` cost per call (median, p99 over 1e6 calls) beside MLflow's
   `log_metric`, synchronous and asynchronous, against a local `mlflow server` the bench
   starts on a free loopback port. MLflow is a bench-only extra: it pins a gunicorn that
   conflicts with ours, so it lives in its own venv (var/bench-mlflow-venv, installed from
   bench/requirements-mlflow.txt on first use; --no-mlflow skips it).
2. Ingest: points/s through the real path (SDK → Redis stream → run_flusher → DB:
   points upserted and their M4 rollups merged in the same transaction) over --points
   points, beside Django's plain bulk_create of MetricPoint rows.
3. A 1,000,000-point series (the ingest's "loss") downsampled to ≤ 2,000 points from the
   database as the API serves it (read_series: from the rollup chunks), beside the raw
   path — reading every point (packed) and bucketing it exactly, which is what
   read_series did before rollups — and a plain values_list fetch. It also checks that
   the series' global minimum and maximum are among the points kept.
4. Live latency: log_metric → the SSE `metric` event in an HTTP client of gunicorn
   (gthread, as `studio up` runs it), p50/p95, beside polling the history API every
   second (with the flusher running, as a dashboard that refreshes would).

With DATABASE_URL pointing at PostgreSQL the bench creates its own database on that
server (trainyard_bench_<pid>) and drops it at the end; without it, a temporary SQLite
file (the figures then say so). Redis: always an embedded one of its own, so a running
studio's flusher cannot take the bench's points. Bounded: a few minutes (plus about a
minute to install MLflow the first time). --only runs some parts (downsample implies the
ingest that writes its series).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from statistics import median
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
MLFLOW_VENV = ROOT / "var" / "bench-mlflow-venv"
MLFLOW_REQUIREMENTS = ROOT / "bench" / "requirements-mlflow.txt"
SDK_CALLS = 1_000_000
MLFLOW_SYNC_CALLS = 200
MLFLOW_ASYNC_CALLS = 1_000
BULK_CREATE_POINTS = 200_000
LIVE_SECONDS = 8.0
LIVE_INTERVAL = 0.01
PARTS = ("sdk", "ingest", "downsample", "live")

sys.path.insert(0, str(ROOT))

from studio_setup import stop_server  # noqa: E402 - bench/ is the script's dir


def pct(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def row(label: str, figure: str, baseline: str = "", note: str = "") -> None:
    print(f"  {label:<44} {figure:<26} {baseline:<34} {note}")


def free_port() -> int:
    from studio.embedded_redis import free_port as port

    return port()


# --- the database ----------------------------------------------------------------------------
def prepare_database(workdir: Path) -> tuple[str, str | None]:
    """(label, name of a PostgreSQL database to drop at the end). Sets DATABASE_URL."""
    base = os.environ.get("DATABASE_URL", "")
    if base.startswith(("postgres://", "postgresql://")):
        import psycopg

        url = urlparse(base)
        name = f"trainyard_bench_{os.getpid()}"
        admin = url._replace(path="/postgres").geturl()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        os.environ["DATABASE_URL"] = url._replace(path=f"/{name}").geturl()
        return "PostgreSQL", name
    os.environ.pop("DATABASE_URL", None)
    return "SQLite (set DATABASE_URL for PostgreSQL)", None


def drop_database(name: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    admin = urlparse(os.environ["DATABASE_URL"])._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- 1. log_metric cost ----------------------------------------------------------------------
def sdk_cost(job_id: int, redis_url: str) -> dict[str, float]:
    from trainyard.metrics import MetricsLogger

    logger = MetricsLogger(job_id, redis_url)
    clock = time.perf_counter_ns
    costs: list[int] = []
    append = costs.append
    log_metric = logger.log_metric
    started = time.perf_counter()
    for step in range(SDK_CALLS):
        before = clock()
        log_metric("loss", 0.5, step)
        append(clock() - before)
    issued = time.perf_counter() - started
    assert logger.flush(60), "the SDK could not drain to Redis"
    durable = time.perf_counter() - started
    # These million points are not the ingest's: left in an active stream, the ingest's
    # flusher would write them too, in its own time.
    import redis

    from trainyard.protocol import ACTIVE_METRIC_JOBS, METRICS_STREAM, key

    client = redis.Redis.from_url(redis_url)
    client.srem(ACTIVE_METRIC_JOBS, job_id)
    client.delete(key(METRICS_STREAM, job_id))
    costs.sort()
    return {"n": SDK_CALLS, "median_ns": costs[len(costs) // 2], "p99_ns": costs[int(len(costs) * 0.99)],
            "issued_s": issued, "durable_s": durable, "dropped": logger.dropped}


MLFLOW_SCRIPT = """
import json, sys, time
import mlflow
mlflow.set_tracking_uri(sys.argv[1])
mode, n = sys.argv[2], int(sys.argv[3])
clock = time.perf_counter_ns
costs = []
with mlflow.start_run():
    started = time.perf_counter()
    for step in range(n):
        before = clock()
        mlflow.log_metric("loss", 0.5, step=step, synchronous=(mode == "sync"))
        costs.append(clock() - before)
    issued = time.perf_counter() - started
    if mode == "async":
        mlflow.flush_async_logging()
    durable = time.perf_counter() - started
costs.sort()
print("RESULT " + json.dumps({"n": n, "median_ns": costs[n // 2], "p99_ns": costs[int(n * 0.99)],
                              "issued_s": issued, "durable_s": durable}))
"""


def mlflow_python() -> tuple[Path | None, str]:
    python = MLFLOW_VENV / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import mlflow"], capture_output=True).returncode == 0:
        return python, ""
    print(f"  installing MLflow into {MLFLOW_VENV} (bench only, once; about a minute) …", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(MLFLOW_VENV)], check=True, capture_output=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "-r", str(MLFLOW_REQUIREMENTS)], check=True,
                       capture_output=True, timeout=600)
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        return None, f"MLflow could not be installed: {exc} {detail.decode(errors='replace')[-300:]}"
    return python, ""


def mlflow_baselines(workdir: Path) -> dict[str, dict | str]:
    python, problem = mlflow_python()
    if python is None:
        return {"sync": problem, "async": problem}
    port = free_port()
    store = workdir / "mlflow"
    store.mkdir()
    server = subprocess.Popen([str(python), "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{store}/mlflow.db", "--default-artifact-root",
                               str(store / "artifacts"), "--workers", "1"],
                              cwd=store, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    results: dict[str, dict | str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            return {"sync": "mlflow server did not start in 120 s", "async": "mlflow server did not start"}
        for mode, calls in (("sync", MLFLOW_SYNC_CALLS), ("async", MLFLOW_ASYNC_CALLS)):
            try:
                done = subprocess.run([str(python), "-c", MLFLOW_SCRIPT, f"http://127.0.0.1:{port}", mode, str(calls)],
                                      capture_output=True, text=True, timeout=240, cwd=store)
                line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
                results[mode] = json.loads(line[7:]) if line else f"failed: {done.stderr[-300:]}"
            except subprocess.TimeoutExpired:
                results[mode] = "timed out after 240 s"
    finally:
        stop_server(server)
    return results


# --- 2. ingest -------------------------------------------------------------------------------
def ingest(job, redis_url: str, points: int, *, pipelined: bool) -> dict[str, float]:
    """Fill the job's stream through the SDK, then time the flusher until it is drained:
    `run_flusher` (what `studio flusher` runs: on PostgreSQL two connections, one batch's
    commit overlapping the next batch's statements) or a plain flush_once loop."""
    from jobs.metrics.ingest import Flusher, run_flusher
    from jobs.models import MetricPoint
    from trainyard.metrics import MetricsLogger

    logger = MetricsLogger(job.pk, redis_url)
    steps = points // 2
    for start in range(0, steps, 100_000):
        for step in range(start, min(steps, start + 100_000)):
            logger.log_metrics({"loss": 1.0 / (step + 1), "acc": step / steps}, step)
        assert logger.flush(60)
    flusher = Flusher(discover_running=False)
    started = time.perf_counter()
    if pipelined:
        stop = threading.Event()
        stop.set()  # no waiting for new points: drain what is there, then return
        run_flusher(stop, flusher=flusher, drain_seconds=3600)
    else:
        while True:
            flusher.flush_once(block_ms=0)
            if flusher.last_entries == 0:
                break
    elapsed = time.perf_counter() - started
    stored = MetricPoint.objects.filter(job=job).count()
    assert stored == 2 * steps, f"{stored} stored of {2 * steps}"
    return {"points": 2 * steps, "seconds": elapsed, "rate": 2 * steps / elapsed}


def bulk_create_baseline(job) -> dict[str, float]:
    from datetime import UTC, datetime

    from jobs.models import MetricPoint

    now = datetime.now(UTC)
    started = time.perf_counter()
    rows = [MetricPoint(job=job, name="loss", step=step, rank=0, value=0.5, time=now) for step in range(BULK_CREATE_POINTS)]
    MetricPoint.objects.bulk_create(rows, batch_size=5000)
    elapsed = time.perf_counter() - started
    return {"points": BULK_CREATE_POINTS, "seconds": elapsed, "rate": BULK_CREATE_POINTS / elapsed}


# --- 3. downsampling -------------------------------------------------------------------------
def downsampling(job) -> dict[str, float | int | bool]:
    """read_series as the API calls it (from the rollups), beside the raw path: reading
    every point (packed on PostgreSQL) and bucketing it exactly — what read_series did
    before rollups — and plain values_list."""
    import numpy as np
    from django.db import connection

    from jobs.metrics.downsample import downsample, fetch_chunks, fetch_series, read_series
    from jobs.models import MetricPoint

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in ("jobs_metricpoint", "jobs_metricchunk"):
                cursor.execute(f"VACUUM ANALYZE {table}")  # what autovacuum does in a live studio
    runs, raw_runs = [], []
    for _ in range(5):
        started = time.perf_counter()
        series = read_series(job.pk, "loss", 0, 2000)
        runs.append(time.perf_counter() - started)
    for _ in range(3):
        started = time.perf_counter()
        steps, values = fetch_series(job.pk, "loss", 0)
        downsample(steps, values, 2000)
        raw_runs.append(time.perf_counter() - started)
    started = time.perf_counter()
    list(MetricPoint.objects.filter(job=job, name="loss", rank=0).order_by("step").values_list("step", "value"))
    values_list = time.perf_counter() - started
    # No spike lost: the series' global extremes are among the points kept.
    kept = dict(zip(series.steps.tolist(), series.values.tolist(), strict=True))
    extremes = [int(steps[np.argmin(values)]), int(steps[np.argmax(values)])]
    assert series.total == len(steps), (series.total, len(steps))
    return {"total": series.total, "kept": len(series.steps), "end_to_end": median(runs), "raw_path": median(raw_runs),
            "values_list": values_list, "chunks": len(fetch_chunks(job.pk, "loss", 0)),
            "extremes_kept": all(kept.get(step) == values[steps == step][0] for step in extremes)}


# --- 4. live latency -------------------------------------------------------------------------
def live_latency(job, token: str, redis_url: str, env: dict[str, str], workdir: Path) -> dict[str, object]:
    from trainyard.metrics import MetricsLogger

    port = free_port()
    with open(workdir / "web.log", "wb") as web_log, open(workdir / "flusher.log", "wb") as flusher_log:
        web = subprocess.Popen([sys.executable, "-m", "gunicorn", "studio.wsgi:application", "-k", "gthread", "--workers",
                                "2", "--threads", "8", "--bind", f"127.0.0.1:{port}", "--no-control-socket"],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=web_log, start_new_session=True)
        flusher = subprocess.Popen([sys.executable, "manage.py", "studio", "flusher", "--block-ms", "200"], cwd=ROOT,
                                   env=env, stdout=subprocess.DEVNULL, stderr=flusher_log, start_new_session=True)
    sse_latency: list[float] = []
    poll_latency: list[float] = []
    stop = threading.Event()
    connected = threading.Event()
    headers = {"Authorization": f"Bearer {token}"}

    def sse_client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", f"/api/v1/jobs/{job.pk}/stream", headers={**headers, "Accept": "text/event-stream"})
        reply = conn.getresponse()
        connected.set()
        kind = ""
        while not stop.is_set():
            try:
                line = reply.readline()
            except TimeoutError:
                continue
            if not line:
                break
            text = line.decode().rstrip("\n")
            if text.startswith("event: "):
                kind = text[7:]
            elif text.startswith("data: ") and kind == "metric":
                seen = time.time()
                sse_latency.extend(seen - point[3] for point in json.loads(text[6:])["points"])
        conn.close()

    def poll_client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        cursor = -1
        while not stop.wait(1.0):
            conn.request("GET", f"/api/v1/jobs/{job.pk}/metrics/?name=live&raw=1&limit=10000&cursor={cursor}", headers=headers)
            body = json.loads(conn.getresponse().read())
            seen = time.time()
            for step, _, _ in body.get("points", []):
                poll_latency.append(seen - sent_at[step])
                cursor = step
        conn.close()

    sent_at: dict[int, float] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.3)
        threads = [threading.Thread(target=sse_client, daemon=True), threading.Thread(target=poll_client, daemon=True)]
        for thread in threads:
            thread.start()
        connected.wait(30)
        time.sleep(0.5)
        logger = MetricsLogger(job.pk, redis_url)
        step = 0
        started = time.monotonic()
        while time.monotonic() - started < LIVE_SECONDS:
            sent_at[step] = time.time()
            logger.log_metric("live", float(step), step)
            step += 1
            time.sleep(LIVE_INTERVAL)
        logger.flush(10)
        time.sleep(2.5)  # the last points reach both clients
        stop.set()
        for thread in threads:
            thread.join(10)
    finally:
        for process in (web, flusher):
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
    return {"sent": step, "sse": sse_latency, "poll": poll_latency}


# --- main ------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=2_000_000, help="points ingested (default 2,000,000)")
    parser.add_argument("--no-mlflow", action="store_true", help="skip the MLflow baselines")
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    if unknown := parts - set(PARTS):
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")

    from studio.embedded_redis import EmbeddedRedis

    workdir = Path(tempfile.mkdtemp(prefix="trainyard-bench-metrics-"))
    redis = EmbeddedRedis(data_dir=workdir / "redis")
    redis_url = redis.start()
    os.environ.update({"REDIS_URL": redis_url, "STUDIO_DATA_DIR": str(workdir / "data"),
                       "DJANGO_SETTINGS_MODULE": "studio.settings", "STUDIO_LOG_LEVEL": "WARNING"})
    label, pg_name = prepare_database(workdir)
    try:
        import django

        django.setup()
        from django.core.management import call_command

        from jobs.models import JobStatus, TrainingJob
        from studio import actions
        from studio.models import Role

        call_command("migrate", interactive=False, verbosity=0)
        project = actions.create_project(slug="bench", name="Bench")
        user = actions.ensure_user("bench", password="bench-password-1")
        actions.set_membership(project=project, user=user, role=Role.ADMIN)
        token = actions.issue_token(user, name="bench")[1]
        jobs = {name: TrainingJob.objects.create(project=project, name=name, status=JobStatus.TRAINING)
                for name in ("sdk", "ingest", "sequential", "baseline", "live")}
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}

        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"Trainyard metrics bench — database: {label}; Redis: embedded {redis_url}; {os.cpu_count()} CPUs, "
              f"load average {load} (other work on the machine slows every figure alike)\n")
        print(f"  {'what':<44} {'Trainyard':<26} {'baseline (same run)':<34} note")

        if "sdk" in parts:
            log_metric_cost(jobs["sdk"].pk, redis_url, workdir, mlflow=not args.no_mlflow)
        if "ingest" in parts or "downsample" in parts:
            ingest_and_downsampling(jobs, redis_url, args.points, downsample="downsample" in parts,
                                    ingest_baselines="ingest" in parts)
        if "live" in parts:
            live_report(jobs["live"], token, redis_url, env, workdir)
        print()
        return 0
    finally:
        if pg_name:
            drop_database(pg_name)
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def log_metric_cost(job_id: int, redis_url: str, workdir: Path, *, mlflow: bool) -> None:
    sdk = sdk_cost(job_id, redis_url)
    row("log_metric per call: median / p99", f"{sdk['median_ns'] / 1000:.2f} / {sdk['p99_ns'] / 1000:.2f} µs", "",
        f"{sdk['n']:,} calls; all in Redis after {sdk['durable_s']:.2f} s, {sdk['dropped']} dropped (target median ≤ 5 µs)")
    if not mlflow:
        row("  MLflow log_metric", "", "skipped (--no-mlflow)")
        return
    for mode, result in mlflow_baselines(workdir).items():
        if isinstance(result, dict):
            ratio = result["median_ns"] / sdk["median_ns"]
            row(f"  vs MLflow log_metric ({mode}) median / p99", "",
                f"{result['median_ns'] / 1000:,.1f} / {result['p99_ns'] / 1000:,.1f} µs",
                f"{result['n']:,} calls, durable after {result['durable_s']:.1f} s; ours is {ratio:,.0f}× cheaper")
        else:
            row(f"  vs MLflow log_metric ({mode})", "", "unavailable", result)


def ingest_and_downsampling(jobs: dict, redis_url: str, points: int, *, downsample: bool, ingest_baselines: bool) -> None:
    """The downsampled series is the one the ingest wrote: its rollups come from the flusher."""
    flow = ingest(jobs["ingest"], redis_url, points, pipelined=True)
    if ingest_baselines:
        plain = ingest(jobs["sequential"], redis_url, max(2, points // 4), pipelined=False)
        base = bulk_create_baseline(jobs["baseline"])
        row("ingest: SDK → Redis → run_flusher → DB", f"{flow['rate']:,.0f} points/s", f"bulk_create {base['rate']:,.0f} points/s",
            f"{flow['points']:,} points in {flow['seconds']:.1f} s, idempotent upsert + M4 rollups (target ≥ 100,000/s)")
        row("  the same, one flush_once after another", f"{plain['rate']:,.0f} points/s", "",
            f"{plain['points']:,} points in {plain['seconds']:.1f} s (no overlap of commit and reads)")
    if downsample:
        down = downsampling(jobs["ingest"])
        row(f"{down['total']:,}-point series → ≤ 2,000 points", f"{down['end_to_end'] * 1000:.0f} ms",
            f"raw read + M4 {down['raw_path'] * 1000:,.0f} ms (values_list {down['values_list'] * 1000:,.0f} ms)",
            f"from {down['chunks']:,} rollup chunks, {down['kept']} kept, extremes kept: {down['extremes_kept']} "
            f"(target ≤ 200 ms)")


def live_report(job, token: str, redis_url: str, env: dict[str, str], workdir: Path) -> None:
    live = live_latency(job, token, redis_url, env, workdir)
    sse, poll = live["sse"], live["poll"]
    assert isinstance(sse, list) and isinstance(poll, list)
    if sse:
        row("live: log_metric → SSE event p50 / p95", f"{pct(sse, .5) * 1000:.0f} / {pct(sse, .95) * 1000:.0f} ms",
            f"poll 1 s: {pct(poll, .5) * 1000:.0f} / {pct(poll, .95) * 1000:.0f} ms" if poll else "poll: no points",
            f"{len(sse):,} of {live['sent']:,} points seen (target p95 ≤ 500 ms)")
    else:
        row("live: log_metric → SSE event", "no events received", "", f"see {workdir}/web.log")


if __name__ == "__main__":
    sys.exit(main())
