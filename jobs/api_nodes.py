"""Node endpoints: GET /api/v1/nodes/ (with a summary per instance type),
GET /api/v1/nodes/<name>/, and the cluster over time, GET /api/v1/cluster/history/
(the Nodes page's charts: jobs.cluster's samples).

Any signed-in member of any project may list the nodes (they are shared by every
project), but a node's job and warm pool name another project's job or project only to
users who may read that project: others learn that the node is busy or warm, not for whom."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from django.http import Http404, QueryDict
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.cluster import DEFAULT_HISTORY, DEFAULT_HISTORY_POINTS, MAX_HISTORY_POINTS, history
from jobs.models import Node, NodeState, TrainingJob
from jobs.node_overview import (
    nodes_for_display,
    queue_summaries,
    readable_project_ids,
    shown_state,
    warm_expires_in,
    with_shown_state,
)
from studio.api import ApiError, PaginatedAPIView, paginate
from studio.models import Membership


# --- output shapes (for the OpenAPI schema and one formatting of times) --------------------------
class NodeJobSerializer(serializers.Serializer):
    id = serializers.IntegerField(allow_null=True, help_text="null when the job belongs to a project you cannot read.")
    name = serializers.CharField(required=False, help_text="Only for jobs of projects you can read.")
    project = serializers.CharField(required=False, help_text="The job's project slug; only for projects you can read.")
    busy = serializers.BooleanField()


class NodeWarmSerializer(serializers.Serializer):
    pool = serializers.CharField(help_text="The warm pool's id; every node of the pool shares it.")
    project = serializers.CharField(allow_null=True, help_text="The project the pool is kept for (null: not yours).")
    instance_count = serializers.IntegerField(help_text="Nodes in the pool: a job must ask for this many to use it.")
    until = serializers.DateTimeField(allow_null=True, help_text="When the pool expires and frees the node.")
    expires_in_seconds = serializers.IntegerField(allow_null=True)
    from_job = serializers.IntegerField(allow_null=True, help_text="The job that left the pool (null: not yours).")


class NodeSerializer(serializers.Serializer):
    name = serializers.CharField()
    hostname = serializers.CharField()
    instance_type = serializers.CharField(help_text="The queue name jobs ask for in resources.instance_type.")
    queue = serializers.CharField(help_text="The node's own Celery queue.")
    cpus = serializers.IntegerField()
    memory_bytes = serializers.IntegerField()
    gpus = serializers.IntegerField()
    version = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    state = serializers.ChoiceField(choices=NodeState.choices, help_text=(
        "lost also when the last heartbeat is older than STUDIO_NODE_LOST_SECONDS, before the sweep marks it."))
    last_heartbeat = serializers.DateTimeField()
    seconds_since_heartbeat = serializers.FloatField()
    started_at = serializers.DateTimeField()
    job = NodeJobSerializer(allow_null=True, help_text="The job the node runs, if any.")
    warm = NodeWarmSerializer(allow_null=True, help_text="The warm pool holding the node (state warm), else null.")


class InstanceTypeSummarySerializer(serializers.Serializer):
    instance_type = serializers.CharField()
    nodes = serializers.IntegerField(help_text="Nodes that are not stopped.")
    idle = serializers.IntegerField()
    busy = serializers.IntegerField()
    warm = serializers.IntegerField()
    lost = serializers.IntegerField()
    stopped = serializers.IntegerField()
    pending_jobs = serializers.IntegerField(help_text="Pending jobs (every project) that ask for this instance type.")
    running_jobs = serializers.IntegerField(help_text="Starting, Training, Uploading or Stopping jobs (every project).")


class NodeListSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    next = serializers.URLField(allow_null=True)
    previous = serializers.URLField(allow_null=True)
    results = NodeSerializer(many=True)
    instance_types = InstanceTypeSummarySerializer(many=True, help_text=(
        "Every instance type with a node or an unfinished job, whatever the page and filters."))


# --- access -------------------------------------------------------------------------------------
class InAnyProject(BasePermission):
    message = "Nodes are shown to members of a project; ask a project admin to add you."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(user.is_superuser or Membership.objects.filter(user=user).exists())


def node_json(node: Node, readable: set[int], now: datetime) -> dict:
    """One node as the API shows it to a user who may read the projects in `readable`."""
    job = None
    if node.current_job_id is not None:
        current = node.current_job
        if current is not None and current.project_id in readable:
            job = {"id": current.pk, "name": current.name, "project": current.project.slug, "busy": True}
        else:
            job = {"id": None, "busy": True}
    warm = None
    if node.state == NodeState.WARM:
        from_job = node.warm_from_job
        warm = {
            "pool": node.warm_pool,
            "project": node.warm_project.slug if node.warm_project and node.warm_project_id in readable else None,
            "instance_count": node.warm_instance_count,
            "until": node.warm_until,
            "expires_in_seconds": warm_expires_in(node, now),
            "from_job": from_job.pk if from_job is not None and from_job.project_id in readable else None,
        }
    return {
        "name": node.name, "hostname": node.hostname, "instance_type": node.instance_type, "queue": node.queue,
        "cpus": node.cpus, "memory_bytes": node.memory_bytes, "gpus": node.gpus, "version": node.version, "pid": node.pid,
        "state": shown_state(node, now), "last_heartbeat": node.last_heartbeat,
        "seconds_since_heartbeat": round((now - node.last_heartbeat).total_seconds(), 1), "started_at": node.started_at,
        "job": job, "warm": warm,
    }


# --- endpoints ------------------------------------------------------------------------------------
class NodeListView(PaginatedAPIView):
    permission_classes = [IsAuthenticated, InAnyProject]

    @extend_schema(
        operation_id="v1_nodes_list",
        parameters=[
            OpenApiParameter("instance_type", str, description="Only nodes of this instance type (queue)."),
            OpenApiParameter("state", str, enum=NodeState.values, description="Only nodes in this state (as shown)."),
        ],
        responses=NodeListSerializer,
    )
    def get(self, request: Request) -> Response:
        now = timezone.now()
        nodes = nodes_for_display()
        if instance_type := request.query_params.get("instance_type"):
            nodes = nodes.filter(instance_type=instance_type)
        if state := request.query_params.get("state"):
            if state not in NodeState.values:
                raise ApiError(f"state must be one of {', '.join(NodeState.values)}.",
                               fields={"state": [f"Not one of {', '.join(NodeState.values)}."]})
            nodes = with_shown_state(nodes, state, now)
        readable = readable_project_ids(request.user)
        response = paginate(self, request, nodes,
                            lambda page: NodeSerializer([node_json(node, readable, now) for node in page], many=True).data)
        response.data["instance_types"] = InstanceTypeSummarySerializer(
            [summary.as_json() for summary in queue_summaries(now)], many=True).data
        return response


class NodeDetailView(APIView):
    permission_classes = [IsAuthenticated, InAnyProject]

    @extend_schema(responses=NodeSerializer)
    def get(self, request: Request, name: str) -> Response:
        node = nodes_for_display().filter(name=name).first()
        if node is None:
            raise Http404(f"No node named '{name}'.")
        return Response(NodeSerializer(node_json(node, readable_project_ids(request.user), timezone.now())).data)


# --- the cluster over time ------------------------------------------------------------------------
class ClusterHistoryJobSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    project = serializers.CharField(help_text="The job's project slug.")


class ClusterPointSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="The (last) sample's time.")
    queue_depth = serializers.IntegerField(help_text="Pending jobs, every project (a bucket's highest).")
    oldest_pending_seconds = serializers.FloatField(allow_null=True, help_text=(
        "How long the oldest Pending job had waited since its submission (a bucket's highest); null: none waited."))


class NodePointSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    state = serializers.ChoiceField(choices=NodeState.choices, help_text="As the Nodes page showed it (last of a bucket).")
    cpu_percent = serializers.FloatField(allow_null=True, help_text=(
        "The node's CPU % from its job's system samples (a bucket's mean); null: no job reported one."))
    gpu_percent = serializers.FloatField(allow_null=True, help_text="Likewise for its GPUs (mean over the node's GPUs).")
    job = ClusterHistoryJobSerializer(allow_null=True, help_text=(
        "The job the node ran; null when idle or when the job belongs to a project you cannot read."))
    busy = serializers.BooleanField(help_text="Whether the node ran a job (yours or not).")


class NodeHistorySerializer(serializers.Serializer):
    name = serializers.CharField()
    points = NodePointSerializer(many=True)


class ClusterHistorySerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    samples = serializers.IntegerField(help_text="Stored samples in the window (one every STUDIO_CLUSTER_SAMPLE_SECONDS).")
    bucket_seconds = serializers.FloatField(allow_null=True, help_text=(
        "Width of each point's time bucket when the window held more samples than `points`; null: one point per sample."))
    points = ClusterPointSerializer(many=True, help_text="The queue over time.")
    nodes = NodeHistorySerializer(many=True, help_text="Per node (name order): its state and utilisation over time.")


# A '+' in an unencoded query string arrives as a space: "...T10:00:00 01:00".
_SPACED_OFFSET = re.compile(r"^(.*\d) (\d{2}:?\d{2})$")


def _time_param(params: QueryDict, name: str, default: datetime) -> datetime:
    raw = params.get(name)
    if raw in (None, ""):
        return default
    value = raw.strip()
    if match := _SPACED_OFFSET.match(value):
        value = f"{match.group(1)}+{match.group(2)}"
    try:
        when = parse_datetime(value)
    except ValueError:
        when = None
    if when is None:
        message = "Not an ISO 8601 date-time (e.g. 2026-12-01T10:00:00Z)."
        raise ApiError(f"{name}: {message}", fields={name: [message]})
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _points_param(params: QueryDict) -> int:
    raw = params.get("points")
    if raw in (None, ""):
        return DEFAULT_HISTORY_POINTS
    message = f"A whole number from 2 to {MAX_HISTORY_POINTS}."
    if not raw.isdigit() or not 2 <= int(raw) <= MAX_HISTORY_POINTS:
        raise ApiError(f"points: {message}", fields={"points": [message]})
    return int(raw)


class ClusterHistoryView(APIView):
    """The cluster over time (jobs.cluster.history). Nodes are shared, so every member sees
    every node's figures; a node's job is named only to readers of its project."""

    permission_classes = [IsAuthenticated, InAnyProject]

    @extend_schema(
        operation_id="v1_cluster_history",
        parameters=[
            OpenApiParameter("since", str, description=(
                "ISO 8601 date-time (UTC when it has no offset); default: an hour before `until`.")),
            OpenApiParameter("until", str, description="ISO 8601 date-time; default: now. Not before `since`."),
            OpenApiParameter("points", int, description=(
                f"At most this many points per series (default {DEFAULT_HISTORY_POINTS}, 2 to {MAX_HISTORY_POINTS}).")),
        ],
        responses=ClusterHistorySerializer,
    )
    def get(self, request: Request) -> Response:
        params = request.query_params
        until = _time_param(params, "until", timezone.now())
        try:
            default_since = until - DEFAULT_HISTORY
        except OverflowError:  # until within an hour of year 1
            default_since = datetime.min.replace(tzinfo=UTC)
        since = _time_param(params, "since", default_since)
        max_points = _points_param(params)
        if since >= until:
            message = "Must be before until."
            raise ApiError(f"since: {message}", fields={"since": [message]})
        found = history(since, until, max_points)
        job_ids = {point["job"] for points in found.nodes.values() for point in points if point["job"] is not None}
        readable = readable_project_ids(request.user)
        jobs = {pk: {"id": pk, "name": name, "project": slug} for pk, name, slug in
                TrainingJob.objects.filter(pk__in=job_ids, project_id__in=readable)
                .values_list("pk", "name", "project__slug")} if job_ids else {}
        body = {
            "since": since, "until": until, "samples": found.samples, "bucket_seconds": found.bucket_seconds,
            "points": found.points,
            "nodes": [{"name": name, "points": [
                {"at": p["at"], "state": p["state"], "cpu_percent": p["cpu_percent"], "gpu_percent": p["gpu_percent"],
                 "job": jobs.get(p["job"]) if p["job"] is not None else None, "busy": p["job"] is not None}
                for p in points]} for name, points in found.nodes.items()],
        }
        return Response(ClusterHistorySerializer(body).data)
