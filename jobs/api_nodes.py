"""Node endpoints: GET /api/v1/nodes/ (with a summary per instance type) and
GET /api/v1/nodes/<name>/.

Any signed-in member of any project may list the nodes (they are shared by every
project), but a node's job and warm pool name another project's job or project only to
users who may read that project: others learn that the node is busy or warm, not for whom."""

from __future__ import annotations

from datetime import datetime

from django.http import Http404
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from jobs.models import Node, NodeState
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
