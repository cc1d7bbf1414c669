"""Which server runs the web process: the same API under each candidate, in one run.

    .venv/bin/python bench/serving.py

Starts gunicorn with gthread workers (what `studio up` runs), gunicorn with sync workers,
and uvicorn when it is installed (it is not in requirements.txt), each on a free port
against one temporary SQLite studio holding a user, a token and 50 datasets. Then a small
keep-alive client (http.client, one connection per thread) sends a bounded number of
`GET /api/v1/datasets/?project=bench` per server and concurrency, and prints req/s,
p50/p99 and the ratio to gthread. Bounded to about a minute in all.

The client runs on the same cores as the servers, so absolute figures are lower than a
separate load generator (wrk) would show; the ratios are what this is for.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from studio_setup import gunicorn_command, start_server, stop_server  # noqa: E402 - bench/ is the script's dir

DATASETS = 50
CONCURRENCY = (4, 32)
# The list the brief names, plus a light authenticated endpoint: when the view itself is
# expensive every server looks alike, so the light one shows the server's own overhead.
PATHS = {"datasets": "/api/v1/datasets/?project=bench", "projects": "/api/v1/projects/"}
REQUESTS_PER_PHASE = 1500
PHASE_SECONDS = 4.5
WARMUP_REQUESTS = 40
TOTAL_BUDGET_SECONDS = 60.0


@dataclass
class Result:
    server: str
    endpoint: str
    connections: int
    requests: int
    errors: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def percentile(self, fraction: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def prepare_studio(data_dir: Path) -> str:
    """Migrate a fresh SQLite studio and fill it; returns a bearer token."""
    os.environ["STUDIO_DATA_DIR"] = str(data_dir)
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    from datasets.models import Dataset, DatasetVersion
    from studio import actions
    from studio.models import Role

    call_command("migrate", interactive=False, verbosity=0)
    project = actions.create_project(slug="bench", name="Bench")
    user = actions.ensure_user("bench", password="bench-password-1")
    actions.set_membership(project=project, user=user, role=Role.SCIENTIST)
    datasets = Dataset.objects.bulk_create(
        Dataset(project=project, name=f"dataset-{i:03d}", description="benchmark row", created_by=user) for i in range(DATASETS)
    )
    DatasetVersion.objects.bulk_create(
        DatasetVersion(dataset=d, version=1, status="ready", source_kind="upload", source_uri="upload",
                       root_uri=f"file:///tmp/{d.name}", format="csv", num_records=1000, size_bytes=123_456,
                       files=[{"path": "train.csv", "uri": f"file:///tmp/{d.name}/train.csv", "size": 123_456}])
        for d in datasets
    )
    _, token = actions.issue_token(user, name="bench")
    return token


def free_port() -> int:
    from studio.embedded_redis import free_port as pick

    return pick()


def server_commands(port: int) -> dict[str, list[str]]:
    commands = {
        "gunicorn gthread (2×8)": gunicorn_command(port),
        "gunicorn sync (2)": gunicorn_command(port, worker_class="sync"),
    }
    if importlib.util.find_spec("uvicorn") is not None:
        commands["uvicorn (2)"] = [sys.executable, "-m", "uvicorn", "studio.asgi:application", "--host", "127.0.0.1",
                                   "--port", str(port), "--workers", "2", "--log-level", "warning"]
    return commands


def hammer(port: int, token: str, connections: int, requests: int, seconds: float, server: str,
           endpoint: str = "datasets") -> Result:
    """`connections` threads share a budget of `requests`, each on its own keep-alive
    connection (http.client reconnects by itself when a server closes after a response)."""
    path = PATHS[endpoint]
    headers = {"Authorization": f"Bearer {token}", "Connection": "keep-alive"}
    remaining = [requests]
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    deadline = time.monotonic() + seconds

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine: list[float] = []
        while time.monotonic() < deadline:
            with lock:
                if remaining[0] <= 0:
                    break
                remaining[0] -= 1
            started = time.perf_counter()
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                response.read()
                ok = response.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                connection.close()
            if ok:
                mine.append((time.perf_counter() - started) * 1000)
            else:
                with lock:
                    errors[0] += 1
        connection.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(connections)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    return Result(server, endpoint, connections, len(latencies), errors[0], elapsed, latencies)


def main() -> int:
    begun = time.monotonic()
    data_dir = Path(tempfile.mkdtemp(prefix="trainyard-bench-"))
    results: list[Result] = []
    try:
        token = prepare_studio(data_dir)
        env = {**os.environ, "STUDIO_DATA_DIR": str(data_dir), "PYTHONUNBUFFERED": "1"}
        env.pop("DATABASE_URL", None)
        port = free_port()
        commands = server_commands(port)
        if "uvicorn (2)" not in commands:
            print("note: uvicorn is not installed (not in requirements.txt); skipping it")
        print(f"datasets = GET {PATHS['datasets']} ({DATASETS} rows), projects = GET {PATHS['projects']} (1 row); "
              f"up to {REQUESTS_PER_PHASE} requests or {PHASE_SECONDS:.1f} s per phase; {os.cpu_count()} CPUs shared "
              "by client and servers\n")
        phases = [(endpoint, connections) for endpoint in PATHS for connections in CONCURRENCY]
        for name, argv in commands.items():
            if time.monotonic() - begun > TOTAL_BUDGET_SECONDS - len(phases) * PHASE_SECONDS - 5:
                print(f"note: time budget spent; skipping {name}")
                continue
            process = start_server(argv, env, port)
            try:
                hammer(port, token, 2, WARMUP_REQUESTS, 10, name)  # import paths, DB connections, caches
                for endpoint, connections in phases:
                    results.append(hammer(port, token, connections, REQUESTS_PER_PHASE, PHASE_SECONDS, name, endpoint))
            finally:
                stop_server(process)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)

    baseline = {(r.endpoint, r.connections): r.rate for r in results if r.server.startswith("gunicorn gthread")}
    print(f"{'server':<24} {'endpoint':<9} {'conns':>5} {'req/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} "
          f"{'vs gthread':>10}")
    for r in sorted(results, key=lambda r: (r.endpoint, r.connections)):
        base = baseline.get((r.endpoint, r.connections))
        ratio = r.rate / base if base else float("nan")
        print(f"{r.server:<24} {r.endpoint:<9} {r.connections:>5} {r.rate:>7.0f} {r.percentile(0.5):>8.1f} "
              f"{r.percentile(0.99):>8.1f} {r.errors:>6} {ratio:>9.2f}×")
    print(f"\ntotal {time.monotonic() - begun:.0f} s")
    return 0 if results and not any(r.errors for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
