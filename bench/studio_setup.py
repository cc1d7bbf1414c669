"""A private studio for a benchmark: SQLite in a temporary data dir (nothing else is
touched), an embedded Redis unless REDIS_URL is set, and real `studio worker` nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


class PrivateStudio:
    def __init__(self, prefix: str, env: dict[str, str] | None = None) -> None:
        self.work = Path(tempfile.mkdtemp(prefix=prefix))
        os.environ["STUDIO_DATA_DIR"] = str(self.work / "studio")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
        os.environ.pop("DATABASE_URL", None)  # a private SQLite studio
        os.environ.update(env or {})
        self.redis = None
        if not os.environ.get("REDIS_URL"):
            from studio.embedded_redis import EmbeddedRedis

            self.redis = EmbeddedRedis(self.work / "redis")
            os.environ["REDIS_URL"] = self.redis.start()
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        self.nodes: list[tuple[subprocess.Popen, IO[bytes]]] = []

    def start_node(self, name: str, queue: str = "cpu", timeout: float = 60) -> subprocess.Popen:
        """A node worker; returns once it is registered and idle."""
        from jobs.models import Node

        log_path = self.work / f"{name}.log"
        log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        node = subprocess.Popen([sys.executable, "manage.py", "studio", "worker", "--queue", queue, "--name", name],
                                cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.nodes.append((node, log))
        deadline = time.monotonic() + timeout
        while not Node.objects.filter(name=name, state="idle").exists():
            if time.monotonic() > deadline or node.poll() is not None:
                raise RuntimeError(f"node {name} did not register:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        return node

    def close(self) -> None:
        for node, log in self.nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)
                node.wait(30)
            log.close()
        if self.redis:
            self.redis.stop()


# --- a studio web server for HTTP benchmarks ------------------------------------------------------
def gunicorn_command(port: int, *, worker_class: str = "gthread", workers: int = 2, threads: int = 8) -> list[str]:
    """What `studio up` runs (gthread, 2 workers × 8 threads) unless told otherwise."""
    command = [sys.executable, "-m", "gunicorn", "studio.wsgi:application", "--bind", f"127.0.0.1:{port}",
               "--workers", str(workers), "--no-control-socket", "--log-level", "warning", "-k", worker_class]
    return [*command, "--threads", str(threads)] if worker_class == "gthread" else command


def start_server(argv: list[str], env: dict[str, str], port: int, timeout: float = 30.0) -> subprocess.Popen:
    """Start a server in a session of its own; returns once it answers on `port`."""
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    try:
        wait_until_answering(port, process, timeout)
    except BaseException:
        stop_server(process)
        raise
    return process


def wait_until_answering(port: int, process: subprocess.Popen, timeout: float = 30.0) -> None:
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            stderr = process.stderr.read().decode(errors="replace")[-2000:] if process.stderr else ""
            raise RuntimeError(f"server exited with {process.returncode}: {stderr}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/login/")
            connection.getresponse().read()
            connection.close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not answer within {timeout:.0f} s")


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
