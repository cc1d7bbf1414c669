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
