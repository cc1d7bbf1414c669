"""The nodes page: every node (shared by all projects), a summary per queue, and the
cluster over time (charts fed by GET /api/v1/cluster/history/, static/js/nodes.js)."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from jobs.models import ClusterSample, Node, TrainingJob
from jobs.node_overview import (
    nodes_for_display,
    queue_summaries,
    readable_project_ids,
    shown_state,
    silent_not_swept,
    warm_expires_in,
)
from studio.models import Project
from studio.views import page


@dataclass(frozen=True)
class NodeRow:
    """One node as the nodes page shows it to this viewer."""

    node: Node
    state: str  # as shown: a silent node reads "lost" before the sweep marks it
    silent: bool  # lost by its heartbeat while its row still says idle/busy/warm
    job: TrainingJob | None  # the node's job, only when the viewer may read its project
    warm_project: Project | None  # the warm pool's project, only when the viewer may read it
    warm_from_job: TrainingJob | None  # the job that left the pool, likewise
    warm_expires_in: int | None


def node_rows(nodes: list[Node], readable: set[int]) -> list[NodeRow]:
    now = timezone.now()
    rows = []
    for node in nodes:
        current, warm_from = node.current_job, node.warm_from_job  # a null relation is None without a query
        job = current if current is not None and current.project_id in readable else None
        warm_project = node.warm_project if node.warm_project_id in readable else None
        warm_from_job = warm_from if warm_from is not None and warm_from.project_id in readable else None
        rows.append(NodeRow(node=node, state=shown_state(node, now), silent=silent_not_swept(node, now), job=job,
                            warm_project=warm_project, warm_from_job=warm_from_job,
                            warm_expires_in=warm_expires_in(node, now)))
    return rows


@page
def nodes(request: HttpRequest) -> HttpResponse:
    """Every node (shared by all projects) and a summary per queue. Another project's job
    or warm pool shows as busy or warm, never by name."""
    rows = node_rows(list(nodes_for_display()), readable_project_ids(request.user))
    return render(request, "studio/nodes.html", {
        "rows": rows,
        "queues": queue_summaries(),
        "lost_after": settings.STUDIO_NODE_LOST_SECONDS,
        "heartbeat_every": settings.STUDIO_NODE_HEARTBEAT_SECONDS,
        # No sample yet: the page says why instead of drawing empty axes.
        "has_samples": ClusterSample.objects.exists(),
        "sample_every": settings.CELERY_BEAT_SCHEDULE["sample-cluster"]["schedule"],
        "sample_days": settings.STUDIO_CLUSTER_SAMPLE_DAYS,
    })
