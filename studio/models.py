from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime
from functools import cache
from typing import TYPE_CHECKING, Any, ClassVar

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import connection, models
from django.utils import timezone

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class Role(models.TextChoices):
    ADMIN = "admin", "Admin"
    SCIENTIST = "scientist", "Scientist"
    REVIEWER = "reviewer", "Reviewer"
    VIEWER = "viewer", "Viewer"


# What each role may do. Reviewers are deliberately outside the read path of
# datasets and jobs: they reach only the review inbox.
READ_ROLES = frozenset({Role.ADMIN, Role.SCIENTIST, Role.VIEWER})
WRITE_ROLES = frozenset({Role.ADMIN, Role.SCIENTIST})
ADMIN_ROLES = frozenset({Role.ADMIN})

slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use 1–63 lowercase letters, digits and hyphens, starting with a letter or digit.",
)


class ProjectQuerySet(models.QuerySet["Project"]):
    def visible_to(self, user: User | AnonymousUser) -> ProjectQuerySet:
        if user.is_superuser:
            return self.all()
        if not user.is_authenticated:
            return self.none()
        return self.filter(memberships__user=user).distinct()

    def readable_by(self, user: User | AnonymousUser) -> ProjectQuerySet:
        if user.is_superuser:
            return self.all()
        if not user.is_authenticated:
            return self.none()
        return self.filter(memberships__user=user, memberships__role__in=READ_ROLES).distinct()


class Project(models.Model):
    slug = models.SlugField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[ProjectQuerySet] = ProjectQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def role_of(self, user: User | AnonymousUser) -> str | None:
        if not user.is_authenticated:
            return None
        if user.is_superuser:
            return str(Role.ADMIN)
        membership = self.memberships.filter(user=user).only("role").first()
        return membership.role if membership else None


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="one_membership_per_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project}: {self.role}"


TOKEN_PREFIX = "ty"


def hash_token(raw: str) -> str:
    # Tokens carry 256 bits of randomness, so a fast hash is safe here (no dictionary to
    # attack) and keeps authentication to one indexed lookup plus one SHA-256.
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def usable(self) -> ApiTokenQuerySet:
        now = timezone.now()
        return self.filter(models.Q(expires_at__isnull=True) | models.Q(expires_at__gt=now))


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    # The public part, shown in listings so a person can tell tokens apart; the lookup key.
    key_id = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[ApiTokenQuerySet] = ApiTokenQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({TOKEN_PREFIX}_{self.key_id}_…)"

    @classmethod
    def issue(cls, user: User, name: str, expires_at: datetime | None = None) -> tuple[ApiToken, str]:
        """Create a token and return it with its only plain-text copy."""
        key_id = secrets.token_hex(6)
        raw = f"{TOKEN_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
        token = cls.objects.create(user=user, name=name, key_id=key_id, secret_hash=hash_token(raw), expires_at=expires_at)
        return token, raw

    @staticmethod
    def key_id_of(raw: str) -> str | None:
        """The lookup key of a presented token, or None when it is not shaped like ours."""
        parts = raw.split("_", 2)
        if len(parts) != 3 or parts[0] != TOKEN_PREFIX:
            return None
        return parts[1]

    @staticmethod
    def secret_matches(raw: str, secret_hash: str) -> bool:
        return hmac.compare_digest(secret_hash, hash_token(raw))

    @classmethod
    def authenticate(cls, raw: str) -> ApiToken | None:
        """The usable token (with its user loaded) a presented secret names, or None. Every
        API request asks this: one plain statement (the token joined with its user), no
        ORM query building, which cost more than the query itself."""
        key_id = cls.key_id_of(raw)
        if key_id is None:
            return None
        sql, token_fields, user_model, user_fields = _token_lookup()
        with connection.cursor() as cursor:
            cursor.execute(sql, [key_id])
            row = cursor.fetchone()
        if row is None:
            return None
        split = len(token_fields)
        token = cls.from_db(connection.alias, [f.attname for f in token_fields],
                            [_python_value(f, v) for f, v in zip(token_fields, row[:split], strict=True)])
        token.user = user_model.from_db(connection.alias, [f.attname for f in user_fields],
                                        [_python_value(f, v) for f, v in zip(user_fields, row[split:], strict=True)])
        if not cls.secret_matches(raw, token.secret_hash) or not token.user.is_active or token.is_expired():
            return None
        return token

    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


@cache
def _token_lookup() -> tuple[str, list, Any, list]:
    """ApiToken.authenticate's statement and the fields its row holds, token's then user's."""
    token_fields = list(ApiToken._meta.concrete_fields)
    user_field = ApiToken._meta.get_field("user")
    user_model = user_field.related_model
    user_fields = list(user_model._meta.concrete_fields)  # type: ignore[union-attr]
    qn = connection.ops.quote_name
    columns = [f"t.{qn(f.column)}" for f in token_fields] + [f"u.{qn(f.column)}" for f in user_fields]
    sql = (f"SELECT {', '.join(columns)} FROM {qn(ApiToken._meta.db_table)} t "
           f"JOIN {qn(user_model._meta.db_table)} u ON u.{qn(user_model._meta.pk.column)} = t.{qn(user_field.column)} "  # type: ignore[union-attr]
           "WHERE t.key_id = %s")
    return sql, token_fields, user_model, user_fields


def aware_datetime(value: Any) -> Any:
    """A timestamp read with plain SQL as the ORM gives it: SQLite hands back text, naive
    in UTC; PostgreSQL an aware datetime (returned as it is)."""
    if isinstance(value, str):
        from django.utils.dateparse import parse_datetime

        value = parse_datetime(value)
    if value is not None and settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


def json_column(value: Any) -> Any:
    """A JSON column read with plain SQL as the ORM gives it: Django has psycopg hand jsonb
    back as text (and SQLite stores text), so parse it; a value already parsed is returned."""
    import json

    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _python_value(field: models.Field, value: Any) -> Any:
    """What the ORM would give for a raw column value (SQLite hands back text timestamps,
    naive in UTC, and integers for booleans)."""
    if value is None:
        return None
    if isinstance(field, models.DateTimeField):
        return aware_datetime(value)
    if isinstance(field, models.BooleanField):
        return bool(value)
    return value


class PendingDeletion(models.Model):
    """Objects in the store that deleted rows left behind (studio.deletion). Written in the
    same transaction that deletes the rows, so a crash at any point leaves either the rows
    or this intent, never neither; `uris` shrinks as the objects go, and the row goes when
    the last one has. A row whose worker died is finished by the periodic sweep."""

    what = models.CharField(max_length=300)  # "job 12 'resnet'", for logs and the admin
    uris = models.JSONField(default=list)  # what is still to delete (prefixes or single objects)
    total = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Touched after each object: the sweep finishes rows whose worker stopped touching them.
    updated_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.what}: {len(self.uris)} of {self.total} left"


class NotificationChannel(models.Model):
    """Where a project's alarms are sent (managed by its admins): a webhook (a signed JSON
    POST, studio.notify) or an e-mail address list (Django's mail backend). The webhook's
    signing secret is shown once, at creation; deliveries are signed with HMAC-SHA256."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="notification_channels")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.URLField(max_length=2000, blank=True)
    emails = models.JSONField(default=list, blank=True)
    secret = models.CharField(max_length=128, blank=True)  # HMAC key (needed to sign, so not hashed)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="one_channel_name_per_project")]

    def __str__(self) -> str:
        return f"{self.project}: {self.name} ({self.kind})"


class Delivery(models.Model):
    """One notification to one channel: its body, every try, and how it ended. Retried with
    back-off (studio.notify); the sender's outcome never affects what caused it."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=64)  # e.g. "alarm.transition"
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    response_status = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["channel", "created_at"], name="delivery_channel_created")]

    def __str__(self) -> str:
        return f"delivery {self.pk} to {self.channel_id}: {self.status}"
