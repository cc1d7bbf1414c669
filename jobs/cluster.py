"""The cluster over time, for the Nodes page's charts and /metrics: what the nodes are doing
now (state, CPU and GPU use of their job), one ClusterSample of it every
STUDIO_CLUSTER_SAMPLE_SECONDS (beat: jobs.tasks.sample_cluster_task), and the samples of a
window downsampled for a chart.

Utilisation comes from the job processes' system samples (SystemMetric, written by the
flusher): a node has a figure only while it runs a job that reported one in the last
UTILISATION_WINDOW. An idle node is not measured (no series rather than a made-up 0).
The GPU figure is the sampler's mean over the node's GPUs (per-GPU figures are not
recorded)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypedDict

from django.conf import settings
from django.db.models import Count, Min
from django.utils import timezone

from jobs.models import ClusterSample, JobStatus, Node, NodeState, SystemMetric, TrainingJob
from jobs.node_overview import DEFAULT_INSTANCE_TYPE, shown_state_expression

UTILISATION_WINDOW = timedelta(seconds=60)
DEFAULT_HISTORY = timedelta(hours=1)
DEFAULT_HISTORY_POINTS = 500
MAX_HISTORY_POINTS = 5000


class NodeSampleFigures(TypedDict):
    state: str
    cpu_percent: float | None
    gpu_percent: float | None
    job: int | None


@dataclass(frozen=True)
class Utilisation:
    """A node's latest system sample of the job it runs, else its own heartbeat's figures."""

    job_id: int | None
    cpu_percent: float
    gpu_percent: float | None
    at: datetime


# --- now ---------------------------------------------------------------------------------------
def node_utilisation(now: datetime | None = None) -> dict[str, Utilisation]:
    """{node name: its latest figures of the last minute}: for a node running a job, that
    job's latest system sample; for any other (idle, warm) — or a busy one whose job sent
    none — what its own heartbeat measured. Two queries: the nodes, then the running jobs'
    samples of that minute (a sampler writes one every few seconds), newest first."""
    now = now or timezone.now()
    since = now - UTILISATION_WINDOW
    nodes = list(Node.objects.exclude(state__in=[NodeState.LOST, NodeState.STOPPED])
                 .values_list("name", "current_job_id", "cpu_percent", "gpu_percent", "utilisation_at"))
    running = {name: job_id for name, job_id, *_ in nodes if job_id is not None}
    latest: dict[str, Utilisation] = {}
    if running:
        samples = (SystemMetric.objects.filter(job_id__in=set(running.values()), node_name__in=list(running),
                                               time__gte=since)
                   .order_by("-time").values_list("node_name", "job_id", "cpu_percent", "gpu_percent", "time"))
        for node_name, job_id, cpu, gpu, at in samples:
            if node_name not in latest and running.get(node_name) == job_id:
                latest[node_name] = Utilisation(job_id=job_id, cpu_percent=cpu, gpu_percent=gpu, at=at)
    for name, job_id, own_cpu, own_gpu, own_at in nodes:
        if name not in latest and own_cpu is not None and own_at is not None and own_at >= since:
            latest[name] = Utilisation(job_id=job_id, cpu_percent=own_cpu, gpu_percent=own_gpu, at=own_at)
    return latest


@dataclass(frozen=True)
class PendingQueue:
    instance_type: str
    jobs: int
    oldest_created_at: datetime


def pending_queues() -> list[PendingQueue]:
    """Pending jobs per instance type and the oldest one's submission time (one grouped query).
    A job's wait runs from its submission: one re-queued after a lost node counts from then too."""
    rows = (TrainingJob.objects.filter(status=JobStatus.PENDING).values("resources__instance_type")
            .annotate(n=Count("pk"), oldest=Min("created_at")).order_by())
    merged: dict[str, PendingQueue] = {}
    for row in rows:
        kind = str(row["resources__instance_type"] or DEFAULT_INSTANCE_TYPE)
        seen = merged.get(kind)  # null and "cpu" are one queue
        merged[kind] = PendingQueue(kind, row["n"] + (seen.jobs if seen else 0),
                                    min(row["oldest"], seen.oldest_created_at) if seen else row["oldest"])
    return [merged[kind] for kind in sorted(merged)]


def sample_cluster(now: datetime | None = None) -> ClusterSample:
    """1. Queue depth (every Pending job) and the oldest pending job's wait.
    2. Per node that is not stopped: its shown state (a silent node reads lost), its job's
       latest CPU and GPU % of the last minute, its job's id.
    3. Write one ClusterSample; delete those older than STUDIO_CLUSTER_SAMPLE_DAYS."""
    now = now or timezone.now()
    queues = pending_queues()
    oldest = min((queue.oldest_created_at for queue in queues), default=None)
    use = node_utilisation(now)
    nodes: dict[str, NodeSampleFigures] = {}
    rows = (Node.objects.exclude(state=NodeState.STOPPED).annotate(shown=shown_state_expression(now))
            .values_list("name", "shown", "current_job_id").order_by("name"))
    for name, shown, job_id in rows:
        figures = use.get(name)
        nodes[name] = NodeSampleFigures(state=shown, cpu_percent=figures.cpu_percent if figures else None,
                                        gpu_percent=figures.gpu_percent if figures else None, job=job_id)
    sample = ClusterSample.objects.create(
        at=now, queue_depth=sum(queue.jobs for queue in queues),
        oldest_pending_seconds=round((now - oldest).total_seconds(), 3) if oldest else None, nodes=nodes)
    ClusterSample.objects.filter(at__lt=now - timedelta(days=settings.STUDIO_CLUSTER_SAMPLE_DAYS)).delete()
    return sample


# --- over time ---------------------------------------------------------------------------------
class HistoryPoint(TypedDict):
    at: datetime
    queue_depth: int
    oldest_pending_seconds: float | None


class NodeHistoryPoint(TypedDict):
    at: datetime
    state: str
    cpu_percent: float | None
    gpu_percent: float | None
    job: int | None


@dataclass(frozen=True)
class History:
    since: datetime
    until: datetime
    samples: int  # stored samples in the window
    bucket_seconds: float | None  # None: every sample is a point
    points: list[HistoryPoint]
    nodes: dict[str, list[NodeHistoryPoint]]  # by node name, in name order


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 2) if values else None


def history(since: datetime, until: datetime, max_points: int = DEFAULT_HISTORY_POINTS) -> History:
    """The samples in [since, until], at most `max_points` per series: past that, the window is
    cut into equal time buckets and each bucket with samples becomes one point at its last
    sample's time, with the bucket's highest queue depth and wait (a spike stays visible),
    its mean CPU and GPU % per node, and the node's last state and job. Buckets without a
    sample give no point, so the chart shows a gap where sampling stopped."""
    rows = list(ClusterSample.objects.filter(at__gte=since, at__lte=until).order_by("at")
                .values_list("at", "queue_depth", "oldest_pending_seconds", "nodes"))
    if len(rows) <= max_points:
        groups = [[row] for row in rows]
        bucket_seconds = None
    else:
        bucket_seconds = (until - since).total_seconds() / max_points
        grouped: dict[int, list[Any]] = {}
        for row in rows:
            index = min(max_points - 1, math.floor((row[0] - since).total_seconds() / bucket_seconds))
            grouped.setdefault(index, []).append(row)
        groups = [grouped[index] for index in sorted(grouped)]
    points: list[HistoryPoint] = []
    per_node: dict[str, list[NodeHistoryPoint]] = {}
    for group in groups:
        at = group[-1][0]
        waits = [row[2] for row in group if row[2] is not None]
        points.append(HistoryPoint(at=at, queue_depth=max(row[1] for row in group),
                                   oldest_pending_seconds=max(waits) if waits else None))
        names = sorted({name for row in group for name in (row[3] or {})})
        for name in names:
            seen = [row[3][name] for row in group if name in (row[3] or {})]
            last = seen[-1]
            per_node.setdefault(name, []).append(NodeHistoryPoint(
                at=at, state=str(last.get("state", "")),
                cpu_percent=_mean([v["cpu_percent"] for v in seen if v.get("cpu_percent") is not None]),
                gpu_percent=_mean([v["gpu_percent"] for v in seen if v.get("gpu_percent") is not None]),
                job=last.get("job")))
    return History(since=since, until=until, samples=len(rows), bucket_seconds=bucket_seconds, points=points,
                   nodes={name: per_node[name] for name in sorted(per_node)})
