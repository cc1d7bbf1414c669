"""Dataset pages: list, detail (with a self-refreshing status while validating), upload,
delete, and the file view that serves preview thumbnails.

Reads and permissions go through the same helpers as the API (get_dataset_for_user,
get_version_for_user); writes through datasets.actions."""

from __future__ import annotations

import json
import mimetypes
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh
from django_htmx.middleware import HtmxDetails

from datasets import actions
from datasets.api import get_version_for_user
from datasets.formats.common import LABEL_NAMES
from datasets.forms import DatasetUploadForm
from datasets.models import Dataset, DatasetFormat, DatasetVersion, VersionStatus
from datasets.storage import StorageError, store_for
from studio.access import check_role
from studio.models import WRITE_ROLES
from studio.views import current_project, page, project_roles, readable_projects

# Columns the list and the versions panel need; schema, preview and files can be large.
SUMMARY_FIELDS = ("id", "dataset_id", "version", "status", "format", "num_records", "size_bytes", "progress",
                  "created_at", "validated_at")
# Browsers render these inline safely. Anything else (SVG can carry script) is sent as a
# download, so a file in a dataset can never run code on the studio's origin.
INLINE_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "image/bmp"})
CHART_CLASSES = 40
FILES_SHOWN = 200


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware leaves it (django-htmx documents this class for type checkers)."""

    htmx: HtmxDetails


# --- list ---------------------------------------------------------------------------------
@dataclass
class DatasetRow:
    """A row of the list: the dataset, its newest version and when either last changed."""

    dataset: Dataset
    latest: DatasetVersion | None
    updated_at: datetime

    @classmethod
    def of(cls, dataset: Dataset) -> DatasetRow:
        """From a dataset whose versions are prefetched newest first."""
        latest = next(iter(dataset.versions.all()), None)
        updated_at = (latest.validated_at or latest.created_at) if latest else dataset.created_at
        return cls(dataset, latest, updated_at)


@page
def dataset_list(request: HttpRequest) -> HttpResponse:
    datasets = (
        Dataset.objects.filter(project__in=readable_projects(request)).select_related("project")
        .prefetch_related(Prefetch("versions", queryset=DatasetVersion.objects.only(*SUMMARY_FIELDS).order_by("-version")))
        .order_by("project__slug", "name")
    )
    return render(request, "datasets/list.html", {
        "datasets": [DatasetRow.of(dataset) for dataset in datasets],
        "can_upload": any(entry.can_write for entry in project_roles(request)),
        "show_project": len(project_roles(request)) > 1 and current_project(request) is None,
    })


# --- detail -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreviewCell:
    text: str
    kind: str  # "text" | "number" | "json" | "null" | "image"
    url: str = ""


def _preview_table(version: DatasetVersion) -> tuple[list[str], list[list[PreviewCell]]]:
    """Columns in first-seen order, and cells typed for display. A cell whose value is one
    of the version's own image files becomes a thumbnail served by version_file."""
    columns: list[str] = []
    for row in version.preview:
        for key in row:
            if key not in columns:
                columns.append(key)
    paths = {f["path"] for f in version.files}
    rows = []
    for row in version.preview:
        cells = []
        for column in columns:
            value = row.get(column)
            if value is None:
                cells.append(PreviewCell("", "null"))
            elif isinstance(value, str) and value in paths and _inline_type(value):
                cells.append(PreviewCell(value, "image", reverse("dataset-file", args=[version.pk, value])))
            elif isinstance(value, bool):
                cells.append(PreviewCell(str(value).lower(), "text"))
            elif isinstance(value, int | float):
                cells.append(PreviewCell(str(value), "number"))
            elif isinstance(value, dict | list):
                cells.append(PreviewCell(json.dumps(value, ensure_ascii=False), "json"))
            else:
                cells.append(PreviewCell(str(value), "text"))
        rows.append(cells)
    return columns, rows


def _class_chart(schema: dict) -> dict | None:
    """Data for the class-distribution bar chart (top classes by count), or None."""
    classes = schema.get("classes") or {}
    if not classes:
        return None
    ranked = sorted(classes.items(), key=lambda item: (-item[1], item[0]))
    shown = ranked[:CHART_CLASSES]
    return {
        "label_column": schema.get("label_column") or "label",
        "labels": [label for label, _ in shown],
        "counts": [count for _, count in shown],
        "total_classes": len(ranked),
    }


def _pick_version(dataset: Dataset, versions: list[DatasetVersion], wanted: str | None) -> DatasetVersion | None:
    if wanted:
        if not wanted.isdigit():
            raise Http404("The version must be a number, e.g. ?version=2.")
        number = int(wanted)
        if not any(v.version == number for v in versions):
            raise Http404(f"{dataset.name} has no version {number}.")
        return DatasetVersion.objects.select_related("created_by").get(dataset=dataset, version=number)
    return DatasetVersion.objects.filter(dataset=dataset).select_related("created_by").order_by("-version").first()


@page
def dataset_detail(request: HttpRequest, pk: int) -> HttpResponse:
    dataset = get_object_or_404(Dataset.objects.select_related("project"), pk=pk)
    role = check_role(request.user, dataset.project)
    versions = list(dataset.versions.only(*SUMMARY_FIELDS).order_by("-version"))
    version = _pick_version(dataset, versions, request.GET.get("version"))
    context: dict[str, Any] = {
        "dataset": dataset,
        "versions": versions,
        "version": version,
        "can_write": role in WRITE_ROLES,
    }
    if version is not None:
        version.dataset = dataset  # already loaded with its project; saves two queries
        columns, rows = _preview_table(version)
        schema = version.schema or {}
        context.update({
            "schema_columns": schema.get("columns") or [],
            "label_column": schema.get("label_column") or version.label_column,
            "high_cardinality": schema.get("label_cardinality") == "high",
            # A table in which validation found no label column: a classifier cannot use it.
            "no_label": (version.status == VersionStatus.READY and version.format in (DatasetFormat.CSV, DatasetFormat.JSONL)
                         and not schema.get("label_column")),
            "label_names": LABEL_NAMES,
            "chart": _class_chart(schema) if version.status == VersionStatus.READY else None,
            "preview_columns": columns,
            "preview_rows": rows,
            "files": sorted(version.files, key=lambda f: f.get("path", ""))[:FILES_SHOWN],
            "files_more": max(0, len(version.files) - FILES_SHOWN),
            "format_label": DatasetFormat(version.format).label if version.format in DatasetFormat.values else "detecting…",
        })
    return render(request, "datasets/detail.html", context)


@page
def version_status(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The status fragment polled by htmx while a version validates. Once validation has
    finished, the whole page is stale (schema, preview, errors), so ask for a refresh."""
    version = get_version_for_user(request.user, pk)
    if version.status != VersionStatus.VALIDATING and request.htmx:
        return HttpResponseClientRefresh()
    return render(request, "datasets/_version_status.html", {"version": version})


@page
def version_redirect(request: HttpRequest, pk: int) -> HttpResponse:
    """/datasets/versions/<id>/ → the dataset page showing that version (the upload page
    knows only the new version's id)."""
    version = get_version_for_user(request.user, pk)
    return redirect(f"{reverse('dataset-detail', args=[version.dataset_id])}?version={version.version}")


def _inline_type(path: str) -> str | None:
    content_type, _ = mimetypes.guess_type(path)
    return content_type if content_type in INLINE_IMAGE_TYPES else None


@page
def version_file(request: HttpRequest, pk: int, path: str) -> FileResponse:
    """Stream one of the version's own files. Only paths listed in version.files are
    served, looked up by exact match, so no request can name another object."""
    version = get_version_for_user(request.user, pk)
    entry = next((f for f in version.files if f.get("path") == path), None)
    if entry is None:
        raise Http404("That file is not part of this dataset version.")
    try:
        stream = store_for(entry["uri"]).open_read(entry["uri"])
    except StorageError as exc:
        raise Http404(f"The file could not be read from storage: {exc}") from exc
    inline = _inline_type(path)
    response = FileResponse(stream, as_attachment=inline is None, filename=path.rsplit("/", 1)[-1],
                            content_type=inline or "application/octet-stream")
    if entry.get("size"):
        response["Content-Length"] = str(entry["size"])
    # Immutable version content: let the browser keep thumbnails; never let it run anything.
    response["Cache-Control"] = "private, max-age=86400"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


@require_POST
@page
def version_delete(request: HttpRequest, pk: int) -> HttpResponse:
    version = get_version_for_user(request.user, pk, write=True)
    dataset = version.dataset
    label = f"{dataset.name} v{version.version}"
    try:
        actions.delete_version(version)
    except actions.VersionInUse as exc:
        kinds = list(dict.fromkeys(u.kind for u in exc.uses))
        named = format_html_join(" and ", "a {} ({})", ((kind, format_html_join(", ", '<a href="{}">{}</a>', (
            (u.url, u.name) for u in exc.uses if u.kind == kind))) for kind in kinds))
        what = "job" if kinds[0] == "training job" else kinds[0]
        messages.error(request, format_html("{} is used by {}, so it cannot be deleted. Delete that {} first, "
                                            "or keep this version.{}", label, named, what, actions.kept_note(exc.uses)))
        return redirect(f"{reverse('dataset-detail', args=[dataset.pk])}?version={version.version}")
    messages.success(request, f"Deleted {label}.")
    if Dataset.objects.filter(pk=dataset.pk).exists():
        return redirect("dataset-detail", pk=dataset.pk)
    return redirect("dataset-list")


# --- upload -------------------------------------------------------------------------------
@page
def dataset_upload(request: HttpRequest) -> HttpResponse:
    """The form; the browser sends it to POST /api/v1/datasets/ (see static/js/dataset_upload.js)."""
    writable = [entry.project for entry in project_roles(request) if entry.can_write]
    if not writable:
        raise PermissionDenied("Uploading a dataset needs the scientist or admin role in a project; "
                               "ask a project admin to change your role.")
    chosen = current_project(request)
    initial = {
        "project": request.GET.get("project_slug") or (chosen.slug if chosen else writable[0].slug),
        "name": request.GET.get("name", ""),
    }
    form = DatasetUploadForm(initial=initial, projects=writable)
    return render(request, "datasets/upload.html", {
        "form": form,
        "max_upload_bytes": settings.STUDIO_MAX_UPLOAD_BYTES,
        "version_url_base": reverse("dataset-version", args=[0]).removesuffix("0/"),
    })
