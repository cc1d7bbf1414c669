"""A dataset version's files, to read back: the listing, one file, or
all of them as one zip, each streamed from the object store (an S3 file is a redirect to
a short-lived presigned link). Readers of the project (a viewer included) may download;
anyone else gets 404 from get_version_for_user.

A file is named by its path inside the version exactly as the listing gives it; a path
with '..', '.', a leading '/', a backslash or a NUL is refused (400) before any lookup, and
the lookup is an exact match against the version's own file list, so no request can name
an object outside the version's root."""

from __future__ import annotations

import mimetypes
from typing import Any

from django.http import Http404, HttpResponse
from django.urls import reverse
from django.utils.text import slugify
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from datasets.api import get_version_for_user
from datasets.models import DatasetVersion
from datasets.storage import download_response, zip_response
from studio.api import ApiError, PaginatedAPIView, paginate

FILE_ROW = {"type": "object", "properties": {
    "path": {"type": "string"}, "channel": {"type": "string"}, "size": {"type": "integer"},
    "records": {"type": ["integer", "null"]}, "download_url": {"type": "string"}}}


def check_file_path(path: str) -> str:
    """The path as given, or a 400 naming `path`: relative, '/'-separated, no '.' or '..' parts."""
    parts = path.split("/")
    if (not path or path.startswith("/") or "\\" in path or "\x00" in path
            or any(part in ("", ".", "..") for part in parts)):
        message = "Give a file's path inside the version as the file listing shows it (no '..', '.' or leading '/')."
        raise ApiError(f"path: {message}", fields={"path": [message]})
    return path


def _inside_root(uri: str, root: str) -> bool:
    root = root.rstrip("/")
    return uri == root or uri.startswith(root + "/")


def version_file(version: DatasetVersion, path: str) -> dict[str, Any]:
    """The version's entry for `path` (exact match), or Http404."""
    check_file_path(path)
    entry = next((item for item in version.files if item.get("path") == path), None)
    if entry is None or not _inside_root(str(entry.get("uri", "")), version.root_uri):
        raise Http404(f"{version.dataset.name} v{version.version} has no file {path!r}.")
    return entry


def file_url(version: DatasetVersion, path: str) -> str:
    return reverse("api-dataset-version-file", args=[version.pk, path])


def file_rows(version: DatasetVersion, files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"path": item["path"], "channel": item.get("channel", ""), "size": item.get("size"),
             "records": item.get("records"), "download_url": file_url(version, item["path"])} for item in files]


def archive_name(version: DatasetVersion) -> str:
    return f"{slugify(version.dataset.name) or 'dataset'}-v{version.version}.zip"


class DatasetVersionFileListView(PaginatedAPIView):
    @extend_schema(operation_id="dataset_versions_files_list",
                   responses={200: OpenApiResponse(description="The version's files, sorted by path", response=FILE_ROW)})
    def get(self, request: Request, pk: int) -> Response:
        version = get_version_for_user(request.user, pk)
        files = sorted(version.files, key=lambda item: item.get("path", ""))
        return paginate(self, request, files, lambda page: file_rows(version, list(page)))


class DatasetVersionFileView(APIView):
    @extend_schema(operation_id="dataset_versions_file_download",
                   responses={(200, "application/octet-stream"): OpenApiTypes.BINARY,
                              302: OpenApiResponse(description="S3: a presigned link to the file")})
    def get(self, request: Request, pk: int, path: str) -> HttpResponse:
        version = get_version_for_user(request.user, pk)
        entry = version_file(version, path)
        content_type = mimetypes.guess_type(path)[0] or "application/octet-stream"
        # Always an attachment: a file in a dataset (an SVG, an HTML page) never renders on our origin.
        response = download_response(entry["uri"], path.rsplit("/", 1)[-1], content_type, size=entry.get("size"))
        response["Content-Security-Policy"] = "default-src 'none'; sandbox"
        response["X-Content-Type-Options"] = "nosniff"
        return response


class DatasetVersionDownloadView(APIView):
    @extend_schema(operation_id="dataset_versions_download",
                   responses={(200, "application/zip"): OpenApiTypes.BINARY})
    def get(self, request: Request, pk: int) -> HttpResponse:
        version = get_version_for_user(request.user, pk)
        if not version.files:
            raise ApiError(f"{version.dataset.name} v{version.version} has no files.", code="not_found", status_code=404)
        entries = [(item["path"], item["uri"]) for item in sorted(version.files, key=lambda item: item["path"])
                   if _inside_root(str(item.get("uri", "")), version.root_uri)]
        return zip_response(entries, archive_name(version))
