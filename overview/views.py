"""The overview page: datasets by status, recent versions, running jobs, nodes and the
review backlog of the projects the viewer may read."""

from __future__ import annotations

from collections import Counter

from django.conf import settings
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from datasets.models import Dataset, DatasetVersion, VersionStatus
from jobs.models import Node, TrainingJob
from review.stats import review_backlog
from studio.models import Project
from studio.views import page, project_roles, readable_projects


def dataset_status_counts(projects: QuerySet[Project]) -> dict[str, int]:
    """Datasets counted by the status of their newest version, in one query."""
    latest_status = DatasetVersion.objects.filter(dataset=OuterRef("pk")).order_by("-version").values("status")[:1]
    statuses = Dataset.objects.filter(project__in=projects).annotate(latest=Subquery(latest_status)).values_list("latest", flat=True)
    counts = Counter(statuses)
    return {status: counts.get(status, 0) for status in VersionStatus.values}


LIGHT_VERSION_FIELDS = ("id", "version", "status", "format", "num_records", "size_bytes", "progress", "created_at",
                        "validated_at", "dataset__id", "dataset__name", "dataset__project__id", "dataset__project__slug",
                        "dataset__project__name")


@page
def overview(request: HttpRequest) -> HttpResponse:
    projects = readable_projects(request)
    counts = dataset_status_counts(projects)
    recent_versions = list(
        DatasetVersion.objects.filter(dataset__project__in=projects).select_related("dataset__project")
        .only(*LIGHT_VERSION_FIELDS).order_by("-created_at")[:8]
    )
    jobs = TrainingJob.objects.filter(project__in=projects)
    nodes = list(Node.objects.order_by("instance_type", "name"))
    return render(request, "studio/overview.html", {
        "roles": project_roles(request),
        "dataset_counts": counts,
        "dataset_total": sum(counts.values()),
        "recent_versions": recent_versions,
        "running_jobs": list(jobs.running().select_related("project").order_by("-created_at")[:10]),
        "running_total": jobs.running().count(),
        "job_total": jobs.count(),
        "nodes": nodes,
        "node_states": Counter(node.state for node in nodes),
        "can_upload": any(entry.can_write for entry in project_roles(request)),
        "lost_after": settings.STUDIO_NODE_LOST_SECONDS,
        "review_backlog": review_backlog(projects),
    })
