"""Endpoint invocation over HTTP against the predictor called in-process, in one run.

    .venv/bin/python bench/hosting.py

1. A private SQLite studio (temporary data dir, embedded Redis unless REDIS_URL is set).
2. A small real tabular model: the demo table's recipe, 1,500 rows, 3 epochs, trained
   in-process by the built-in algorithm, tarred into the object store as the runner does,
   registered from a Completed job and deployed as an endpoint.
3. Baseline: predictor.predict([row]) in this process (no HTTP, no Django).
4. gunicorn gthread (2 workers × 8 threads, what `studio up` runs), one keep-alive
   connection: POST /api/v1/endpoints/<name>/invocations with one row, p50/p99 and the
   ratio to the baseline; then 1,000 rows per request, rows/s.
Bounded to about a minute. The client shares the machine's cores with the server.
"""

from __future__ import annotations

import csv
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from studio_setup import gunicorn_command, start_server, stop_server  # noqa: E402 - bench/ is the script's dir

ONE_ROW_SECONDS = 12.0
ONE_ROW_MAX = 3000
BATCH_ROWS = 1000
BATCH_SECONDS = 8.0
BASELINE_CALLS = 1000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def prepare(data_dir: Path) -> tuple[str, list[dict], Path]:
    """A studio with a deployed demo model; returns (token, rows to send, model dir)."""
    os.environ["STUDIO_DATA_DIR"] = str(data_dir)
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from datasets.demo import write_tabular
    from datasets.storage import object_uri
    from hosting import actions as hosting
    from jobs.models import JobStatus, TrainingJob
    from jobs.runner.artifacts import upload_archive
    from studio import actions
    from studio.models import Role
    from tests.algorithms.test_algorithms import JobDir, assert_ok, run_in_process

    call_command("migrate", interactive=False, verbosity=0)
    project = actions.create_project(slug="bench", name="Bench")
    user = actions.ensure_user("bench", password="bench-password-1")
    actions.set_membership(project=project, user=user, role=Role.SCIENTIST)
    demo = data_dir / "demo"
    demo.mkdir()
    files = write_tabular(demo)
    job_dir = JobDir(data_dir / "job", {"epochs": 3, "batch_size": 64, "log_every_steps": 100, "label_column": "label"})
    with open(files["train.csv"], newline="") as inp, open(job_dir.channel("train") / "train.csv", "w", newline="") as out:
        out.writelines(islice(inp, 1501))
    started = time.monotonic()
    assert_ok(run_in_process(job_dir, "algorithms.tabular"))
    print(f"trained the demo tabular model (1,500 rows, 3 epochs) in {time.monotonic() - started:.1f} s")
    uri = object_uri("bench/model.tar.gz")
    upload_archive(job_dir.model, uri)
    config = json.loads((job_dir.model / "config.json").read_text())
    job = TrainingJob.objects.create(project=project, name="bench", algorithm="tabular-classifier",
                                     status=JobStatus.COMPLETED, model_uri=uri, final_metrics=config["metrics"])
    version = hosting.register_model(project=project, name="biomes", job=job, user=user)
    hosting.create_endpoint(project=project, name="bench", model_version=version, user=user)
    _, token = actions.issue_token(user, name="bench")
    with open(files["validation.csv"], newline="") as inp:
        rows = [{k: v for k, v in row.items() if k != "label"} for row in islice(csv.DictReader(inp), BATCH_ROWS)]
    return token, rows, job_dir.model


def baseline(model_dir: Path, row: dict) -> list[float]:
    from algorithms.predict import load_predictor

    predictor = load_predictor(model_dir)
    for _ in range(50):
        predictor.predict([row])
    timings = []
    for _ in range(BASELINE_CALLS):
        begun = time.perf_counter()
        predictor.predict([row])
        timings.append((time.perf_counter() - begun) * 1000)
    return timings


def post_many(port: int, token: str, body: bytes, seconds: float, limit: int) -> tuple[list[float], int]:
    """Sequential requests on one keep-alive connection; (latencies ms, errors)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(latencies) < limit:
        begun = time.perf_counter()
        connection.request("POST", "/api/v1/endpoints/bench/invocations", body=body, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        latencies.append((time.perf_counter() - begun) * 1000)
        if response.status != 200:
            errors += 1
            if errors == 1:
                print(f"error {response.status}: {payload[:300]!r}")
    connection.close()
    return latencies, errors


def main() -> int:
    begun = time.monotonic()
    data_dir = Path(tempfile.mkdtemp(prefix="trainyard-bench-hosting-"))
    redis = None
    process = None
    try:
        if not os.environ.get("REDIS_URL"):
            from studio.embedded_redis import EmbeddedRedis

            redis = EmbeddedRedis(data_dir / "redis")
            os.environ["REDIS_URL"] = redis.start()
        token, rows, model_dir = prepare(data_dir)
        local = baseline(model_dir, rows[0])
        from studio.embedded_redis import free_port

        port = free_port()
        env = {**os.environ, "STUDIO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
        process = start_server(gunicorn_command(port), env, port)
        one = json.dumps({"instances": [rows[0]]}).encode()
        batch = json.dumps({"instances": rows}).encode()
        # Warm both workers (each loads the predictor once) on several connections.
        for _ in range(6):
            post_many(port, token, one, 5, 10)
        latencies, errors = post_many(port, token, one, ONE_ROW_SECONDS, ONE_ROW_MAX)
        post_many(port, token, batch, 5, 2)
        batch_latencies, batch_errors = post_many(port, token, batch, BATCH_SECONDS, 200)
    finally:
        if process is not None:
            stop_server(process)
        if redis is not None:
            redis.stop()
        shutil.rmtree(data_dir, ignore_errors=True)

    local_p50 = statistics.median(local)
    http_p50 = statistics.median(latencies)
    rows_per_second = BATCH_ROWS * len(batch_latencies) / (sum(batch_latencies) / 1000)
    print(f"\n{os.cpu_count()} CPUs shared by client and server; gunicorn gthread 2×8; SQLite; one keep-alive connection\n")
    print(f"{'measure':<44} {'n':>6} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'predictor.predict([row]) in-process':<44} {len(local):>6} {local_p50:>8.2f} {percentile(local, 0.99):>8.2f}")
    print(f"{'POST invocations, 1 row, over HTTP':<44} {len(latencies):>6} {http_p50:>8.2f} {percentile(latencies, 0.99):>8.2f}")
    print(f"{'POST invocations, 1,000 rows, over HTTP':<44} {len(batch_latencies):>6} "
          f"{statistics.median(batch_latencies):>8.2f} {percentile(batch_latencies, 0.99):>8.2f}")
    print(f"\none row over HTTP / in-process: {http_p50 / local_p50:.1f}× (p50); target p50 ≤ 10 ms: "
          f"{'met' if http_p50 <= 10 else 'NOT met'}")
    print(f"batch of 1,000 rows: {rows_per_second:,.0f} rows/s")
    print(f"errors: {errors + batch_errors}; total {time.monotonic() - begun:.0f} s")
    return 0 if latencies and batch_latencies and not errors and not batch_errors else 1


if __name__ == "__main__":
    sys.exit(main())
