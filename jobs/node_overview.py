"""What the nodes page and the nodes API show: each node's state as a person should read it,
its warm pool, and a summary per instance type (queue).

Read-only. The lost-node sweep (jobs.nodes) is what marks a silent node lost and
re-queues its work; until it runs, a node whose heartbeat is older than
STUDIO_NODE_LOST_SECONDS is *shown* as lost here, so no page says "idle" about a dead
machine."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import Case, CharField, Count, F, Q, QuerySet, Value, When
from django.utils import timezone

from jobs.models import JobStatus, Node, NodeState, TrainingJob
from studio.models import Project

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User

RUNNING_STATUSES = (JobStatus.STARTING, JobStatus.TRAINING, JobStatus.UPLOADING, JobStatus.STOPPING)
DEFAULT_INSTANCE_TYPE = "cpu"  # TrainingJob.instance_type's default for jobs without one


def lost_cutoff(now: datetime | None = None) -> datetime:
    return (now or timezone.now()) - timedelta(seconds=settings.STUDIO_NODE_LOST_SECONDS)


def shown_state(node: Node, now: datetime | None = None) -> str:
    """The stored state, except that a silent node not yet swept reads "lost"."""
    if node.state in (NodeState.LOST, NodeState.STOPPED):
        return node.state
    if node.last_heartbeat < lost_cutoff(now):
        return NodeState.LOST
    return node.state


def silent_not_swept(node: Node, now: datetime | None = None) -> bool:
    """Lost by its heartbeat although its row still says idle, busy or warm."""
    return node.state not in (NodeState.LOST, NodeState.STOPPED) and node.last_heartbeat < lost_cutoff(now)


def shown_state_expression(now: datetime | None = None) -> Case:
    """shown_state() in SQL, for counting by state in one query."""
    return Case(
        When(state__in=[NodeState.LOST, NodeState.STOPPED], then=F("state")),
        When(last_heartbeat__lt=lost_cutoff(now), then=Value(str(NodeState.LOST))),
        default=F("state"),
        output_field=CharField(),
    )


def with_shown_state(nodes: QuerySet[Node], state: str, now: datetime | None = None) -> QuerySet[Node]:
    """Nodes whose shown state is `state` (the API's ?state= filter)."""
    cutoff = lost_cutoff(now)
    if state == NodeState.LOST:
        return nodes.filter(Q(state=NodeState.LOST) | (Q(last_heartbeat__lt=cutoff) & ~Q(state=NodeState.STOPPED)))
    if state == NodeState.STOPPED:
        return nodes.filter(state=NodeState.STOPPED)
    return nodes.filter(state=state, last_heartbeat__gte=cutoff)


def nodes_for_display() -> QuerySet[Node]:
    """Nodes with what their rows show of their job and warm pool, in one query."""
    return (Node.objects.select_related("current_job__project", "warm_project", "warm_from_job")
            .only(*(f.name for f in Node._meta.concrete_fields if not f.is_relation),
                  "current_job", "warm_project", "warm_from_job",
                  "current_job__id", "current_job__name", "current_job__status", "current_job__project__id",
                  "current_job__project__slug", "current_job__project__name", "warm_project__id", "warm_project__slug",
                  "warm_project__name", "warm_from_job__id", "warm_from_job__name", "warm_from_job__project_id")
            .order_by("instance_type", "name"))


def readable_project_ids(user: User | AnonymousUser) -> set[int]:
    """Projects whose jobs the user may open: only their job names and links are shown."""
    return set(Project.objects.readable_by(user).values_list("pk", flat=True))


def warm_expires_in(node: Node, now: datetime | None = None) -> int | None:
    if node.warm_until is None:
        return None
    return max(0, int((node.warm_until - (now or timezone.now())).total_seconds()))


# --- per instance type ----------------------------------------------------------------------------
@dataclass(frozen=True)
class QueueSummary:
    instance_type: str
    nodes: int  # not stopped
    idle: int
    busy: int
    warm: int
    lost: int
    stopped: int
    pending_jobs: int
    running_jobs: int

    def as_json(self) -> dict:
        return {"instance_type": self.instance_type, "nodes": self.nodes, "idle": self.idle, "busy": self.busy,
                "warm": self.warm, "lost": self.lost, "stopped": self.stopped, "pending_jobs": self.pending_jobs,
                "running_jobs": self.running_jobs}


def queue_summaries(now: datetime | None = None) -> list[QueueSummary]:
    """One row per instance type that has a node or an unfinished job, in name order: nodes
    by shown state, Pending jobs and running ones (all projects: counts only, no names).
    Two grouped queries, however many nodes and jobs."""
    node_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    rows = Node.objects.annotate(shown=shown_state_expression(now)).values("instance_type", "shown").annotate(n=Count("pk"))
    for row in rows.order_by():
        node_counts[row["instance_type"]][row["shown"]] += row["n"]
    job_counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    jobs = (TrainingJob.objects.filter(status__in=[JobStatus.PENDING, *RUNNING_STATUSES])
            .values("status", "resources__instance_type").annotate(n=Count("pk")).order_by())
    for row in jobs:
        kind = row["resources__instance_type"] or DEFAULT_INSTANCE_TYPE
        job_counts[str(kind)]["pending" if row["status"] == JobStatus.PENDING else "running"] += row["n"]
    summaries = []
    for instance_type in sorted(set(node_counts) | set(job_counts)):
        states = node_counts.get(instance_type, {})
        summaries.append(QueueSummary(
            instance_type=instance_type,
            nodes=sum(n for state, n in states.items() if state != NodeState.STOPPED),
            idle=states.get(NodeState.IDLE, 0), busy=states.get(NodeState.BUSY, 0), warm=states.get(NodeState.WARM, 0),
            lost=states.get(NodeState.LOST, 0), stopped=states.get(NodeState.STOPPED, 0),
            pending_jobs=job_counts.get(instance_type, {}).get("pending", 0),
            running_jobs=job_counts.get(instance_type, {}).get("running", 0),
        ))
    return summaries
