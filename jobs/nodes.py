"""Nodes: registration, heartbeats and the lost-node sweep.

A node is one `studio worker` process. It registers (or re-registers) its row at start,
heartbeats from a daemon thread while it runs, and marks itself stopped on a clean
shutdown. The control worker's beat runs `mark_lost_nodes` every few seconds, so a node
whose process died without saying so (SIGKILL, power loss, network split) is seen as lost
instead of "idle forever", and no job stays running after its process died.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from jobs.models import Node, NodeState
from studio.version import node_software

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MachineResources:
    cpus: int
    memory_bytes: int
    gpus: int


def node_queue(name: str) -> str:
    """The node's own Celery queue: tasks for exactly this node, never shared."""
    return f"node.{name}"


def count_gpus() -> int:
    """GPUs that NVML sees; 0 on machines without an NVIDIA driver (nvmlInit raises
    NVMLError_LibraryNotFound there) or without the pynvml module."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError:
        return 0
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def machine_resources() -> MachineResources:
    import psutil

    return MachineResources(cpus=os.cpu_count() or 1, memory_bytes=int(psutil.virtual_memory().total), gpus=count_gpus())


def register_node(*, name: str, instance_type: str = "cpu", hostname: str | None = None, pid: int | None = None,
                  resources: MachineResources | None = None) -> Node:
    """Create or refresh the node's row. A restarted worker reuses its name, so its row
    (and anything that refers to it) carries on; state goes back to idle because a fresh
    process runs nothing yet."""
    resources = resources or machine_resources()
    now = timezone.now()
    previous = Node.objects.filter(name=name).values("pid", "current_job_id", "current_job__attempt").first()
    # A restarted worker's node leaves its warm pool: bill the time it was held (jobs.cost).
    from jobs import cost

    cost.end_warm(cost.warm_nodes(Node.objects.filter(name=name).exclude(warm_pool="")), now)
    node, _ = Node.objects.update_or_create(
        name=name,
        defaults={
            "hostname": hostname or socket.gethostname(),
            "instance_type": instance_type,
            "queue": node_queue(name),
            "cpus": resources.cpus,
            "memory_bytes": resources.memory_bytes,
            "gpus": resources.gpus,
            "version": node_software(),
            "pid": pid if pid is not None else os.getpid(),
            "state": NodeState.IDLE,
            # A fresh process runs nothing and holds no warm pool.
            "current_job": None,
            "warm_pool": "",
            "warm_until": None,
            "warm_project": None,
            "warm_instance_count": 0,
            "warm_from_job": None,
            "started_at": now,
            "last_heartbeat": now,
        },
    )
    if previous and previous["current_job_id"]:
        # The node's previous process died with a job (a crash, kill -9, a reboot): that
        # attempt is over. End it now rather than when its lease runs out.
        from jobs.recovery import end_attempt

        end_attempt(previous["current_job_id"], previous["current_job__attempt"], lost_nodes=[name],
                    cause=f"node {name} restarted: its previous worker process (pid {previous['pid']}) died mid-job")
    return node


def heartbeat(node_name: str, usage: tuple[float | None, float | None] | None = None) -> None:
    """Record that the node is alive, and (usage) its own CPU and GPU use, %. Targeted
    updates only: the heartbeat must never overwrite a state that the scheduler set in
    between (busy, warm)."""
    now = timezone.now()
    figures: dict = {}
    if usage is not None:
        figures = {"cpu_percent": usage[0], "gpu_percent": usage[1], "utilisation_at": now}
    # A node the sweep marked lost while it was merely slow (a long GC, a stalled disk)
    # comes back as idle. Compare-and-set on `lost` so a concurrent state change by the
    # scheduler is not undone.
    revived = Node.objects.filter(name=node_name, state=NodeState.LOST).update(state=NodeState.IDLE, last_heartbeat=now,
                                                                               **figures)
    if revived:
        log.warning("node %s heartbeats again after being marked lost; it is idle again", node_name)
        return
    Node.objects.filter(name=node_name).exclude(state=NodeState.STOPPED).update(last_heartbeat=now, **figures)


class NodeUsage:
    """The machine's CPU use since the last reading and its GPUs' mean utilisation (NVML
    where there is a driver), for the heartbeat. CPU from its own cpu_times() deltas: psutil's
    cpu_percent(None) keeps one module-wide baseline, which a job's system sampler in this
    process also moves."""

    def __init__(self) -> None:
        import psutil

        from jobs.runner.process.guard import _open_nvml

        self._psutil = psutil
        self._last = self._times()
        self._nvml = _open_nvml()

    def _times(self) -> tuple[float, float]:
        times = self._psutil.cpu_times()
        total = sum(times)
        return total, total - times.idle - getattr(times, "iowait", 0.0)

    def read(self) -> tuple[float | None, float | None]:
        from jobs.runner.process.guard import _gpu_usage

        try:
            now = self._times()
            total, busy = now[0] - self._last[0], now[1] - self._last[1]
            self._last = now
            cpu: float | None = round(min(100.0, max(0.0, 100.0 * busy / total)), 1) if total > 0 else None
        except Exception:  # noqa: BLE001 - a figure is a nicety; the heartbeat is not
            cpu = None
        return cpu, _gpu_usage(self._nvml)[0]


def mark_lost_nodes() -> int:
    """Mark nodes whose last heartbeat is older than STUDIO_NODE_LOST_SECONDS as lost, end
    the attempts they were running (jobs.recovery: retry from the last checkpoint, or
    fail) and return how many nodes. The UPDATE repeats the staleness test: a heartbeat
    that lands first makes the row no longer match, one that lands after revives the node."""
    from jobs.recovery import busy_jobs_of, end_attempt

    lost_after = settings.STUDIO_NODE_LOST_SECONDS
    cutoff = timezone.now() - timedelta(seconds=lost_after)
    stale = Node.objects.filter(last_heartbeat__lt=cutoff).exclude(state__in=[NodeState.LOST, NodeState.STOPPED])
    names = list(stale.values_list("name", flat=True))
    if not names:
        return 0
    count = stale.filter(name__in=names).update(state=NodeState.LOST)
    lost = list(Node.objects.filter(name__in=names, state=NodeState.LOST).values_list("name", flat=True))
    if count:
        log.warning("marked %d node(s) lost (no heartbeat for %d s): %s", count, lost_after, ", ".join(lost))
    for job_id, nodes in busy_jobs_of(lost).items():
        from jobs.models import TrainingJob

        attempt = TrainingJob.objects.filter(pk=job_id).values_list("attempt", flat=True).first()
        if attempt is None:
            continue
        try:
            end_attempt(job_id, attempt, lost_nodes=nodes,
                        cause=f"node {', '.join(nodes)} was lost (no heartbeat for {lost_after} s)")
        except Exception:  # noqa: BLE001 - one job's trouble must not stop the sweep; the next sweep retries
            log.exception("could not end job %s's attempt on lost node(s) %s", job_id, nodes)
    # Lost warm nodes leave their pool; the pool's other nodes stay warm until it expires.
    # Their warm time so far is billed to the job that left the pool (jobs.cost).
    from jobs import cost

    leaving = Node.objects.filter(name__in=lost).exclude(warm_pool="")
    cost.end_warm(cost.warm_nodes(leaving), timezone.now())
    Node.objects.filter(name__in=lost).exclude(warm_pool="").update(warm_pool="", warm_until=None, warm_project=None,
                                                                     warm_instance_count=0, warm_from_job=None)
    return count


def mark_stopped(name: str) -> bool:
    """A clean shutdown: the node will not take work until it registers again."""
    return bool(Node.objects.filter(name=name).exclude(state=NodeState.STOPPED).update(state=NodeState.STOPPED))


class HeartbeatThread(threading.Thread):
    """Heartbeats every `interval` seconds until stopped. A daemon thread, so a worker that
    exits abruptly is not held up by it; a failed beat (database restarting) is logged and
    retried at the next tick rather than ending the thread."""

    def __init__(self, node_name: str, interval: float | None = None) -> None:
        super().__init__(name=f"heartbeat-{node_name}", daemon=True)
        self.node_name = node_name
        self.interval = float(interval if interval is not None else settings.STUDIO_NODE_HEARTBEAT_SECONDS)
        self._stopping = threading.Event()

    def run(self) -> None:
        usage = None
        try:
            usage = NodeUsage()
        except Exception:  # noqa: BLE001 - no figures, still heartbeats
            log.warning("node %s: its CPU and GPU use cannot be read; heartbeats carry none", self.node_name, exc_info=True)
        try:
            while not self._stopping.wait(self.interval):
                try:
                    close_old_connections()
                    heartbeat(self.node_name, usage.read() if usage is not None else None)
                    from jobs.runner import warm

                    warm.tidy(self.node_name)
                except Exception:  # noqa: BLE001 - a missed beat must not end the heartbeats
                    log.exception("heartbeat for node %s failed; retrying in %.0f s", self.node_name, self.interval)
                    connection.close()
        finally:
            connection.close()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        if self.is_alive() and self is not threading.current_thread():
            self.join(timeout)
