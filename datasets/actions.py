"""State changes for datasets. Pages, the API, the demo loader and review export call
these; each runs in one transaction, with validation enqueued on commit."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from datasets.hashing import combine_content_hash, combine_fingerprint
from datasets.models import Dataset, DatasetVersion, SourceKind, VersionStatus
from datasets.storage import StorageError, default_store, object_uri, split_uri, store_for
from studio.errors import ActionError, FieldError
from studio.models import Project

log = logging.getLogger(__name__)


class DatasetError(FieldError):
    """Bad input for a dataset, with the request field it concerns."""

    def envelope_message(self) -> str:
        return self.message  # the message already names the source it could not read


@dataclass(frozen=True)
class StoredFile:
    """A file already in the object store (an upload streamed there)."""

    path: str
    uri: str
    size: int
    sha256: str


@dataclass(frozen=True)
class VersionOptions:
    format: str = ""
    label_column: str = ""
    text_column: str = ""
    delimiter: str = ""
    split: dict | None = None

    def as_requested(self) -> dict:
        """The options as given, for DatasetVersion.requested_options ("" = detect)."""
        return {"format": self.format, "label_column": self.label_column, "text_column": self.text_column,
                "delimiter": self.delimiter, "split": dict(self.split or {})}


OPTION_NAMES = {"format": "format", "label_column": "label column", "text_column": "text column",
                "delimiter": "delimiter", "split": "split"}


def unchanged_reason(version: DatasetVersion) -> str:
    """Why a registration returned `version` instead of a new one, in words."""
    requested = version.requested_options or _stored_options(version)
    shown = []
    for key, label in OPTION_NAMES.items():
        value = requested.get(key)
        if not value:
            shown.append(f"{label} {'none' if key in ('text_column', 'split') else 'detected'}")
        elif key == "split":
            shown.append(f"{label} {json.dumps(value, sort_keys=True)}")
        else:
            shown.append(f"{label} " + ("'\\t'" if value == "\t" else repr(value)))
    return (f"The files and the options are the same as {version.dataset.name} v{version.version} "
            f"({'; '.join(shown)}), so nothing changed and no new version was made. "
            "Change the files or an option (label column, delimiter, split, format) to make a new version.")


def new_upload_prefix() -> str:
    """A fresh object-store prefix for an upload: uploads/<yyyy>/<mm>/<uuid>."""
    now = timezone.now()
    return object_uri(f"uploads/{now:%Y/%m}/{uuid.uuid4().hex}")


def _next_version_number(dataset: Dataset) -> int:
    current = DatasetVersion.objects.filter(dataset=dataset).aggregate(top=Max("version"))["top"]
    return (current or 0) + 1


def _lock_dataset(project: Project, name: str, description: str, user: User | None) -> Dataset:
    """Get or create the dataset, locked for the rest of the transaction so two
    concurrent registrations get consecutive version numbers."""
    try:
        with transaction.atomic():
            dataset, created = Dataset.objects.get_or_create(
                project=project, name=name, defaults={"description": description, "created_by": user}
            )
    except IntegrityError:
        created = False
    dataset = Dataset.objects.select_for_update().get(project=project, name=name)
    if not created and description and description != dataset.description:
        dataset.description = description
        dataset.save(update_fields=["description"])
    return dataset


def _enqueue_validation(version_id: int) -> None:
    from datasets.tasks import validate_version_task

    transaction.on_commit(lambda: validate_version_task.delay(version_id))


def _create_version(*, dataset: Dataset, user: User | None, kind: str, source_uri: str, root_uri: str, files: list[dict],
                    options: VersionOptions, fingerprint: str = "", content_hash: str = "") -> DatasetVersion:
    version = DatasetVersion.objects.create(
        dataset=dataset,
        version=_next_version_number(dataset),
        status=VersionStatus.VALIDATING,
        source_kind=kind,
        source_uri=source_uri,
        root_uri=root_uri,
        format=options.format,
        label_column=options.label_column,
        text_column=options.text_column,
        delimiter=options.delimiter,
        split=options.split or {},
        requested_options=options.as_requested(),
        files=files,
        source_fingerprint=fingerprint,
        content_hash=content_hash,
        size_bytes=sum(f["size"] for f in files),
        created_by=user,
    )
    _enqueue_validation(version.pk)
    return version


def _same_as_latest(dataset: Dataset, options: VersionOptions, *, content_hash: str = "",
                    fingerprint: str = "") -> DatasetVersion | None:
    """The latest usable version when it has this content and was registered with these
    very options; identical files read another way (another label column, delimiter,
    split or format) are another version."""
    latest = dataset.versions.exclude(status=VersionStatus.INVALID).order_by("-version").first()
    if latest is None or not _read_alike(latest, options):
        return None
    if content_hash and latest.content_hash == content_hash:
        return latest
    if fingerprint and latest.source_fingerprint == fingerprint:
        return latest
    return None


def _stored_options(version: DatasetVersion) -> dict:
    """How a version was read, from its own fields (validation filled in what it found)."""
    return {"format": version.format, "label_column": version.label_column, "text_column": version.text_column,
            "delimiter": version.delimiter, "split": dict(version.split or {})}


def _read_alike(version: DatasetVersion, options: VersionOptions) -> bool:
    given = options.as_requested()
    if version.requested_options:
        return version.requested_options == given
    # A version from before requested_options was recorded (so `studio up` reloading the
    # demo does not make new versions of an existing install): what it was read with
    # stands in; an option the new registration leaves to detection matches what was found.
    stored = _stored_options(version)
    return given["split"] == stored["split"] and all(not given[key] or given[key] == stored[key]
                                                     for key in ("format", "label_column", "text_column", "delimiter"))


def register_upload(*, project: Project, name: str, description: str, user: User | None, root_uri: str, stored: list[StoredFile],
                    options: VersionOptions, kind: str = str(SourceKind.UPLOAD),
                    source_uri: str = "upload") -> tuple[DatasetVersion, bool]:
    """Register files already streamed to `root_uri`. Returns (version, created); when the
    content and the options equal the latest version's, that version is returned and the
    upload removed (unchanged_reason says why).
    `kind`/`source_uri`: where the files came from (an upload unless said otherwise)."""
    content_hash = combine_content_hash((f.path, f.size, f.sha256) for f in stored)
    with transaction.atomic():
        dataset = _lock_dataset(project, name, description, user)
        existing = _same_as_latest(dataset, options, content_hash=content_hash)
        if existing is None:
            files = [{"path": f.path, "uri": f.uri, "size": f.size, "fingerprint": f.sha256, "sha256": f.sha256} for f in stored]
            version = _create_version(dataset=dataset, user=user, kind=kind, source_uri=source_uri, root_uri=root_uri, files=files, options=options, content_hash=content_hash)
            return version, True
    discard_upload(root_uri)
    return existing, False


def discard_upload(root_uri: str) -> None:
    try:
        default_store().delete_prefix(root_uri)
    except StorageError:
        log.warning("could not remove abandoned upload %s", root_uri, exc_info=True)


def list_source(source_uri: str) -> list[dict]:
    """List the files of an s3:// prefix or a server path, checking that the source is
    allowed and reachable. Raises DatasetError naming `source_uri`."""
    try:
        scheme, bucket, _ = split_uri(source_uri)
        store = store_for(source_uri)
        if scheme == "s3":
            store.check_bucket(source_uri)  # type: ignore[union-attr]
        objects = list(store.list(source_uri))
    except StorageError as exc:
        raise DatasetError("source_uri", str(exc)) from exc
    if not objects:
        raise DatasetError("source_uri", f"no files found at {source_uri}")
    return [{"path": o.relative_path, "uri": o.uri, "size": o.size, "fingerprint": o.fingerprint} for o in objects]


def register_source(*, project: Project, name: str, description: str, user: User, source_uri: str,
                    options: VersionOptions) -> tuple[DatasetVersion, bool]:
    """Register an s3:// prefix or a server path (file://) in place. Its listing is
    fingerprinted: an unchanged source registered with the same options returns the
    latest version instead of a copy."""
    scheme, _, path = split_uri(source_uri)
    files = list_source(source_uri)
    kind = str(SourceKind.S3 if scheme == "s3" else SourceKind.SERVER_PATH)
    if kind == SourceKind.SERVER_PATH:
        # Record the resolved path: a symlink swapped later cannot redirect the version.
        source_uri = Path(path).resolve().as_uri()
    fingerprint = combine_fingerprint(source_uri, ((f["path"], f["size"], f["fingerprint"]) for f in files))
    with transaction.atomic():
        dataset = _lock_dataset(project, name, description, user)
        existing = _same_as_latest(dataset, options, fingerprint=fingerprint)
        if existing is not None:
            return existing, False
        version = _create_version(dataset=dataset, user=user, kind=kind, source_uri=source_uri, root_uri=source_uri,
                                  files=files, options=options, fingerprint=fingerprint)
        return version, True


def register_local_files(*, project: Project, name: str, description: str, user: User | None, files: dict[str, Path],
                         options: VersionOptions, kind: str = str(SourceKind.UPLOAD),
                         source_uri: str = "upload") -> tuple[DatasetVersion, bool]:
    """Copy local files (relative path → file) into the object store and register them
    as a version with the given source. Used by the demo loader and review export."""
    import hashlib

    root_uri = new_upload_prefix()
    store = default_store()
    stored: list[StoredFile] = []
    try:
        for rel, local in sorted(files.items()):
            uri = f"{root_uri}/{rel}"
            digest = hashlib.sha256()
            size = 0
            with open(local, "rb") as src, store.open_write(uri) as out:
                while chunk := src.read(1024 * 1024):
                    digest.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
            stored.append(StoredFile(path=rel, uri=uri, size=size, sha256=digest.hexdigest()))
    except BaseException:
        discard_upload(root_uri)
        raise
    return register_upload(project=project, name=name, description=description, user=user,
                           root_uri=root_uri, stored=stored, options=options, kind=kind, source_uri=source_uri)


@dataclass(frozen=True)
class VersionUse:
    """One thing that reads a version and so keeps it: a job or a batch prediction."""

    kind: str  # "training job" | "batch prediction"
    name: str
    url: str
    # why deleting it would not free the version: "kept because model 'tab' v1 came from it"
    # (deleting a job that a registered model came from only archives it)
    kept_by: str = ""


# The apps whose rows read a version (jobs' inputs, hosting's batch predictions) each
# register a finder in their AppConfig.ready(), in INSTALLED_APPS order; datasets imports neither.
VersionUseFinder = Callable[[DatasetVersion], list[VersionUse]]
_use_finders: list[VersionUseFinder] = []


def register_version_uses(finder: VersionUseFinder) -> None:
    if finder not in _use_finders:
        _use_finders.append(finder)


def version_uses(version: DatasetVersion) -> list[VersionUse]:
    """What reads this version (a job's input, a batch prediction's data), first few of each."""
    return [use for finder in _use_finders for use in finder(version)]


class VersionInUse(ActionError):
    """The version is an input of something that must keep it; the API answers 409 with
    code in_use, the pages link each use."""

    def __init__(self, version: DatasetVersion, uses: list[VersionUse]):
        self.version = version
        self.uses = uses
        named = "; ".join(f"a {u.kind} '{u.name}' ({u.url}){', ' + u.kept_by if u.kept_by else ''}" for u in uses)
        what = "job" if uses[0].kind == "training job" else uses[0].kind
        super().__init__(f"{version} is used by {named}: delete that {what} first, or keep this version."
                         + kept_note(uses), status=409, code="in_use")


def kept_note(uses: list[VersionUse]) -> str:
    """The extra step when a job that reads the version is kept for a registered model."""
    if not any(u.kept_by for u in uses):
        return ""
    return (" Deleting a job that a registered model came from only archives it: delete those model versions "
            "first, then the job.")


def _delete_version_locked(version: DatasetVersion, dataset: Dataset) -> str | None:
    """Inside the caller's transaction, with the dataset row locked: check use, delete the
    row, return the owned files' root (None for a version registered in place)."""
    uses = version_uses(version)
    if uses:
        raise VersionInUse(version, uses)
    owned_root = version.root_uri if version.source_kind in (SourceKind.UPLOAD, SourceKind.REVIEW) else None
    version.delete()
    return owned_root


def delete_version(version: DatasetVersion) -> None:
    """Delete a version (and, in the background, its uploaded files). Refused while a job
    or a batch prediction reads it: the check runs under the dataset's row lock, inside
    the transaction that deletes, so a job submitted meanwhile cannot slip past it."""
    from studio.deletion import record_objects

    with transaction.atomic():
        dataset = Dataset.objects.select_for_update().get(pk=version.dataset_id)
        version = DatasetVersion.objects.select_for_update().get(pk=version.pk)
        label = f"dataset version {dataset}:v{version.version}"
        owned_root = _delete_version_locked(version, dataset)
        if not dataset.versions.exists():
            dataset.delete()
        record_objects(label, [owned_root] if owned_root else [])


def delete_dataset(dataset: Dataset) -> None:
    """Delete every version of a dataset, all or none: refused (nothing deleted) while a
    job or a batch prediction reads any of them. The use check runs inside the deleting
    transaction under the dataset's row lock."""
    from studio.deletion import record_objects

    with transaction.atomic():
        dataset = Dataset.objects.select_for_update().get(pk=dataset.pk)
        roots = []
        for version in list(dataset.versions.select_for_update().order_by("version")):
            if root := _delete_version_locked(version, dataset):
                roots.append(root)
        Dataset.objects.filter(pk=dataset.pk).delete()
        record_objects(f"dataset {dataset}", roots)
