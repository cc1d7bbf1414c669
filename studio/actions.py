"""State changes for accounts, projects and tokens. Pages, the API and the `studio`
command all call these; each runs in one transaction."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.contrib.auth import get_user_model
from django.db import transaction

from studio.models import ApiToken, Membership, Project, Role

if TYPE_CHECKING:
    from django.contrib.auth.models import User


@transaction.atomic
def create_project(*, slug: str, name: str = "", description: str = "", owner: User | None = None) -> Project:
    project = Project.objects.create(slug=slug, name=name or slug, description=description)
    if owner is not None:
        Membership.objects.create(project=project, user=owner, role=Role.ADMIN)
    return project


@transaction.atomic
def set_membership(*, project: Project, user: User, role: str) -> Membership:
    membership, _ = Membership.objects.update_or_create(project=project, user=user, defaults={"role": role})
    return membership


@transaction.atomic
def ensure_user(username: str, *, password: str | None = None, email: str = "", superuser: bool = False) -> User:
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username, defaults={"email": email})
    if password is not None:
        user.set_password(password)
    if superuser:
        user.is_superuser = True
        user.is_staff = True
    if password is not None or superuser or created:
        user.save()
    return user


def issue_token(user: User, *, name: str, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """Returns the token row and the plain secret, which is never stored or shown again."""
    return ApiToken.issue(user, name=name, expires_at=expires_at)


def revoke_token(token: ApiToken) -> None:
    token.delete()
