"""One place that decides who may see or change what, for pages and the API alike.

Objects of a project the user cannot read are reported as missing (404), so that an
outsider cannot even learn that they exist."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.exceptions import PermissionDenied
from django.http import Http404

from studio.models import ADMIN_ROLES, READ_ROLES, WRITE_ROLES, Project, Role

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class Forbidden(PermissionDenied):
    """The user may read the object but not do this to it (a viewer writing)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def signed_in(user: User | AnonymousUser) -> User:
    """The user of a request that had to sign in first (a page behind studio.views.page, an
    API view behind IsAuthenticated), as the User it is; anyone else is refused."""
    if not user.is_authenticated:
        raise PermissionDenied("Sign in first.")
    return user


def role_allows(role: str | None, *, write: bool = False, admin: bool = False) -> bool:
    if role is None:
        return False
    if admin:
        return role in ADMIN_ROLES
    if write:
        return role in WRITE_ROLES
    return role in READ_ROLES


def check_role(user: User | AnonymousUser, project: Project, *, write: bool = False, admin: bool = False) -> str:
    """Return the user's role in the project, or raise Http404 (cannot read) or
    Forbidden (can read, but not write/administer)."""
    role = project.role_of(user)
    if not role_allows(role):
        raise Http404("Not found.")
    if admin and not role_allows(role, admin=True):
        raise Forbidden(f"Your role in project '{project.slug}' is {role}; this needs admin.")
    if write and not role_allows(role, write=True):
        raise Forbidden(f"Your role in project '{project.slug}' is {role}; this needs scientist or admin.")
    assert role is not None  # role_allows(None) is False
    return role


def get_project_for_user(user: User | AnonymousUser, slug: str, *, write: bool = False, admin: bool = False) -> Project:
    project = Project.objects.filter(slug=slug).first()
    if project is None:
        raise Http404(f"No project '{slug}'.")
    check_role(user, project, write=write, admin=admin)
    return project


def is_reviewer_only(user: User | AnonymousUser) -> bool:
    """True when the user belongs to projects only as a reviewer (they get the inbox)."""
    if not user.is_authenticated or user.is_superuser:
        return False
    roles = set(user.memberships.values_list("role", flat=True))
    return bool(roles) and roles <= {Role.REVIEWER}
