"""Studio pages: sign-in, the overview and the section pages.

Every page goes through `@page`, which asks for a login, sends reviewer-only users to
their inbox and remembers the project chosen in the switcher."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone

from datasets.models import Dataset, DatasetVersion, VersionStatus
from jobs.models import Node, TrainingJob
from jobs.node_overview import (
    nodes_for_display,
    queue_summaries,
    readable_project_ids,
    shown_state,
    silent_not_swept,
    warm_expires_in,
)
from review.stats import review_backlog
from studio.access import is_reviewer_only
from studio.models import WRITE_ROLES, Membership, Project, Role

SESSION_PROJECT_KEY = "studio_project"


@dataclass(frozen=True)
class ProjectRole:
    project: Project
    role: str

    @property
    def can_write(self) -> bool:
        return self.role in WRITE_ROLES


def project_roles(request: HttpRequest) -> list[ProjectRole]:
    """The user's projects with their role, fetched once per request (navigation, the
    switcher and the page itself all ask)."""
    cached = getattr(request, "_studio_project_roles", None)
    if cached is not None:
        return cached
    user = request.user
    if not user.is_authenticated:
        roles: list[ProjectRole] = []
    elif user.is_superuser:
        roles = [ProjectRole(p, str(Role.ADMIN)) for p in Project.objects.order_by("slug")]
    else:
        memberships = Membership.objects.filter(user=user).select_related("project").order_by("project__slug")
        roles = [ProjectRole(m.project, m.role) for m in memberships]
    request._studio_project_roles = roles  # type: ignore[attr-defined]
    return roles


def reviewer_only(request: HttpRequest) -> bool:
    """studio.access.is_reviewer_only, asked once per request (the guard and the navigation)."""
    cached = getattr(request, "_studio_reviewer_only", None)
    if cached is None:
        cached = is_reviewer_only(request.user)
        request._studio_reviewer_only = cached  # type: ignore[attr-defined]
    return cached


def current_project(request: HttpRequest) -> Project | None:
    """The project chosen in the switcher, or None for "all my projects"."""
    slug = request.session.get(SESSION_PROJECT_KEY) if hasattr(request, "session") else None
    if not slug:
        return None
    for entry in project_roles(request):
        if entry.project.slug == slug:
            return entry.project
    return None


def _remember_project_choice(request: HttpRequest) -> None:
    if "project" not in request.GET:
        return
    slug = request.GET["project"]
    # Only a project the user belongs to is remembered: a crafted slug changes nothing.
    if slug and any(entry.project.slug == slug for entry in project_roles(request)):
        request.session[SESSION_PROJECT_KEY] = slug
    else:
        request.session.pop(SESSION_PROJECT_KEY, None)


ViewFunc = Callable[..., HttpResponse]


def page(view: ViewFunc | None = None, *, reviewers: bool = False) -> Any:
    """Decorator for every studio page: login required; users who are only reviewers are
    sent to the review inbox unless `reviewers=True`; `?project=` picks the project."""

    def decorate(func: ViewFunc) -> ViewFunc:
        @login_required
        @wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not reviewers and reviewer_only(request):
                return redirect("review-inbox")
            _remember_project_choice(request)
            return func(request, *args, **kwargs)

        return wrapper

    return decorate(view) if view is not None else decorate


def readable_projects(request: HttpRequest) -> QuerySet[Project]:
    """Projects whose data the page may list, narrowed to the switcher's choice."""
    projects = Project.objects.readable_by(request.user)
    chosen = current_project(request)
    return projects.filter(pk=chosen.pk) if chosen is not None else projects


# --- sign-in ------------------------------------------------------------------------------
class LoginView(auth_views.LoginView):
    template_name = "registration/login.html"
    redirect_authenticated_user = True


class LogoutView(auth_views.LogoutView):
    """POST only (Django 5): a link or an image tag cannot sign anyone out."""


# --- overview -----------------------------------------------------------------------------
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


# --- sections -----------------------------------------------------------------------------
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
        job = node.current_job if node.current_job_id and node.current_job.project_id in readable else None
        warm_project = node.warm_project if node.warm_project_id in readable else None
        warm_from_job = node.warm_from_job if node.warm_from_job_id and node.warm_from_job.project_id in readable else None
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
    })



def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico → the hashed static favicon.svg (cached for good there)."""
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.http import HttpResponsePermanentRedirect

    return HttpResponsePermanentRedirect(staticfiles_storage.url("img/favicon.svg"))
