"""Page helpers every app's pages build on, and the studio's own pages (sign-in, favicon).

Every page goes through `@page`, which asks for a login, sends reviewer-only users to
their inbox and remembers the project chosen in the switcher."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect

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


ViewFunc = Callable[..., HttpResponseBase]  # a page may stream (files, logs)


def page(view: ViewFunc | None = None, *, reviewers: bool = False) -> Any:
    """Decorator for every studio page: login required; users who are only reviewers are
    sent to the review inbox unless `reviewers=True`; `?project=` picks the project."""

    def decorate(func: ViewFunc) -> ViewFunc:
        @login_required
        @wraps(func)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
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


def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico → the hashed static favicon.svg (cached for good there)."""
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.http import HttpResponsePermanentRedirect

    return HttpResponsePermanentRedirect(staticfiles_storage.url("img/favicon.svg"))
