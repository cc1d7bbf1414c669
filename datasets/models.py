from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar

from django.conf import settings
from django.db import models
from django.utils import timezone

from studio.models import Project

if TYPE_CHECKING:
    from django.contrib.auth.models import AnonymousUser, User


class DatasetFormat(models.TextChoices):
    CSV = "csv", "CSV"
    JSONL = "jsonl", "JSON Lines"
    IMAGE_FOLDER = "image_folder", "Image folder"
    TEXT = "text", "Plain text"


class SourceKind(models.TextChoices):
    UPLOAD = "upload", "Browser or API upload"
    S3 = "s3", "S3 prefix"
    SERVER_PATH = "server_path", "Server path"
    REVIEW = "review", "Review output"


class VersionStatus(models.TextChoices):
    VALIDATING = "validating", "Validating"
    READY = "ready", "Ready"
    INVALID = "invalid", "Invalid"


CHANNELS = ("train", "validation", "test")


class DatasetQuerySet(models.QuerySet["Dataset"]):
    def readable_by(self, user: User | AnonymousUser) -> DatasetQuerySet:
        return self.filter(project__in=Project.objects.readable_by(user))


class Dataset(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    objects: ClassVar[DatasetQuerySet] = DatasetQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["project", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="dataset_name_unique_in_project")]

    def __str__(self) -> str:
        return f"{self.project.slug}/{self.name}"

    def latest_version(self) -> DatasetVersion | None:
        return self.versions.order_by("-version").first()


class DatasetVersionQuerySet(models.QuerySet["DatasetVersion"]):
    def readable_by(self, user: User | AnonymousUser) -> DatasetVersionQuerySet:
        return self.filter(dataset__project__in=Project.objects.readable_by(user))

    def ready(self) -> DatasetVersionQuerySet:
        return self.filter(status=VersionStatus.READY)

    def stalled(self, older_than_seconds: int) -> DatasetVersionQuerySet:
        """Validating versions whose worker has not reported for a while (or never started)."""
        cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
        return self.filter(status=VersionStatus.VALIDATING).filter(
            models.Q(validation_heartbeat__lt=cutoff) | models.Q(validation_heartbeat__isnull=True, created_at__lt=cutoff)
        )


class DatasetVersion(models.Model):
    """An immutable, numbered snapshot of a dataset's content.

    `files` lists every data file: {"path", "uri", "size", "fingerprint", "channel"}; path
    is relative to the version's root and channel is train/validation/test or "" when the
    version is split by `split` ({"train": 0.8, "validation": 0.2, "seed": 42}).
    """

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.VALIDATING)
    source_kind = models.CharField(max_length=16, choices=SourceKind.choices)
    source_uri = models.CharField(max_length=1024)
    root_uri = models.CharField(max_length=1024, help_text="Where the version's files live.")
    format = models.CharField(max_length=16, choices=DatasetFormat.choices)
    label_column = models.CharField(max_length=200, blank=True)
    text_column = models.CharField(max_length=200, blank=True)
    delimiter = models.CharField(max_length=4, blank=True)
    split = models.JSONField(default=dict, blank=True)
    # The reading options exactly as registered ("" = detect): {"format", "label_column",
    # "text_column", "delimiter", "split"}. Validation overwrites format and label_column
    # with what it found, so a re-registration is compared with these instead: same
    # content and same options is the same version; any other option is a new one.
    requested_options = models.JSONField(default=dict, blank=True)
    files = models.JSONField(default=list)
    # Where a derived version came from (a review export): {"mode", "flow",
    # "source_job", "base_version", "counts", "summary"}; {} for plain uploads.
    provenance = models.JSONField(default=dict, blank=True)
    # Identifies the source's content without reading it (names, sizes, ETags/mtimes): a
    # re-registration of an unchanged source returns the existing version.
    source_fingerprint = models.CharField(max_length=64, blank=True, db_index=True)
    content_hash = models.CharField(max_length=64, blank=True, db_index=True)
    num_records = models.BigIntegerField(null=True, blank=True)
    size_bytes = models.BigIntegerField(default=0)
    schema = models.JSONField(default=dict, blank=True)
    preview = models.JSONField(default=list, blank=True)
    channel_counts = models.JSONField(default=dict, blank=True)
    errors = models.JSONField(default=list, blank=True)
    progress = models.FloatField(default=0.0)
    # Touched while a worker validates; a version validating with an old heartbeat lost its
    # worker and is handed to another (datasets.validation_run.requeue_stalled_validations).
    validation_heartbeat = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    validated_at = models.DateTimeField(null=True, blank=True)

    objects: ClassVar[DatasetVersionQuerySet] = DatasetVersionQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        ordering = ["dataset", "-version"]
        constraints = [models.UniqueConstraint(fields=["dataset", "version"], name="one_number_per_version")]

    def __str__(self) -> str:
        return f"{self.dataset}:v{self.version}"

    @property
    def name(self) -> str:
        return self.dataset.name

    def is_ready(self) -> bool:
        return self.status == VersionStatus.READY
