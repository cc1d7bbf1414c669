"""The node's side of a warm pool: the fork server it holds while warm.

A node whose job ended with `keep_alive_seconds` turns `warm` (jobs.runner.agent) and
starts a fork server here: a child process that has imported torch and the algorithms'
common code and waits to fork job processes (jobs.runner.process.forkserver). The next job of the
pool is launched by forking it — no interpreter start, no torch import — with the data
cache (jobs.runner.staging.DataCache) already filled by the previous job.

A script with its own requirements.txt runs with its job environment's Python
(jobs.runner.process.envs); the server of its pool is started from that Python, so the
pool's next job with the same requirements forks with the environment's packages. A job whose
interpreter is not the server's never forks from it: it starts cold, and the server is
replaced by one of its interpreter for the jobs after it.

One server per node worker process (the solo pool runs one job at a time). The worker's
heartbeat thread calls `tidy` so a node that left its pool (expired, lost, taken by the
scheduler for nothing warm) does not keep a server's memory for nothing.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# Imported in the server before it forks: what every built-in algorithm and most scripts
# pay for first. Import only: no torch op runs in the server (fork safety, see forkserver).
# torch._inductor.config: torch.use_deterministic_algorithms (every built-in algorithm
# seeds with it) imports it lazily, pulling in torch._dynamo — 1.5 s of a warm start.
# redis: trainyard.metrics imports it at a process's first log_metric (0.1-0.4 s before
# the first point can leave; import only, no connection is made here).
PRELOAD = ("torch", "torch.nn", "torch.distributed", "torch._inductor.config", "numpy", "algorithms.process",
           "algorithms.channels", "algorithms.training", "algorithms.output", "trainyard.metrics", "redis")

_lock = threading.Lock()
_server = None  # jobs.runner.process.forkserver.ForkServer
_server_python = ""  # the interpreter it runs: the node's, or a job environment's (jobs.runner.process.envs)


def socket_path() -> Path:
    # Unix socket paths are capped near 108 bytes: a short path in the temp folder, per process.
    return Path(tempfile.gettempdir()) / f"trainyard-fork-{os.getpid()}.sock"


def ensure_server(python: str = "") -> None:
    """Start the fork server unless one is alive with `python` (the node's own interpreter
    by default; a job environment's for a script with requirements.txt, so the pool's next
    job forks with that environment's packages). A server of another interpreter is
    replaced: call it only while the node runs no job forked from that server (the agent
    calls it for a job that it launched from this interpreter's server, or cold). Returns
    at once: the server imports torch in the background while the pool waits for its next job."""
    global _server, _server_python
    from jobs.runner.process.forkserver import ForkServer

    python = python or sys.executable
    with _lock:
        if _server is not None and _server.alive() and _server_python == python:
            return
        if _server is not None:
            _close(_server)
        try:
            _server = ForkServer.start(python=python, socket_path=socket_path(), preload=PRELOAD)
            _server_python = python
            log.info("warm pool: fork server started (pid %s, %s)", _server.pid, python)
        except Exception:  # noqa: BLE001 - without a server the next job starts cold, nothing worse
            log.exception("warm pool: could not start the fork server; matching jobs start cold")
            _server = None


def server_for_launch(timeout: float, python: str = ""):
    """The fork server, once ready (waiting up to `timeout` s for its imports), or None —
    also when it runs another interpreter than `python` (the job's: a forked job runs with
    its server's packages, so a job must never fork from a server of another environment)."""
    with _lock:
        server, server_python = _server, _server_python
    if server is None or not server.alive() or server_python != (python or sys.executable):
        return None
    return server if server.ready(timeout) else None


def server_python() -> str:
    """The interpreter of the live fork server, "" when there is none."""
    with _lock:
        return _server_python if _server is not None and _server.alive() else ""


def running() -> bool:
    with _lock:
        return _server is not None and _server.alive()


def close() -> None:
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        _close(server)


def _close(server) -> None:
    try:
        server.close()
        log.info("warm pool: fork server stopped")
    except Exception:  # noqa: BLE001
        log.warning("could not stop the fork server", exc_info=True)


def tidy(node_name: str) -> None:
    """Close the server when the node is neither warm nor running a job that started warm."""
    if not running():
        return
    from jobs.models import Node, NodeState

    state = Node.objects.filter(name=node_name).values_list("state", flat=True).first()
    if state not in (NodeState.WARM, NodeState.BUSY):
        close()
