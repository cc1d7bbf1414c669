"""Dataset endpoints: register (upload, s3://, server path), list, read, delete."""

from __future__ import annotations

import posixpath

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from datasets import actions
from datasets.actions import StoredFile, VersionOptions
from datasets.models import CHANNELS, Dataset, DatasetVersion
from datasets.serializers import (
    DatasetCreateSerializer,
    DatasetRegisteredSerializer,
    DatasetSerializer,
    DatasetVersionSerializer,
)
from datasets.uploads import ObjectStoreUploadHandler, StreamedUploadedFile, UploadSession
from studio.access import check_role, get_project_for_user
from studio.api import ApiError, PaginatedAPIView, paginate
from studio.models import Project
from studio.parsers import FormParser, JSONParser, MultiPartParser

# Multipart framing (boundaries, part headers, other fields) on top of the file bytes.
MULTIPART_OVERHEAD = 1024 * 1024


def get_version_for_user(user: User | AnonymousUser, pk: int, *, write: bool = False) -> DatasetVersion:
    version = get_object_or_404(DatasetVersion.objects.select_related("dataset__project"), pk=pk)
    check_role(user, version.dataset.project, write=write)
    return version


def get_dataset_for_user(user: User, pk: int, *, write: bool = False) -> Dataset:
    dataset = get_object_or_404(Dataset.objects.select_related("project"), pk=pk)
    check_role(user, dataset.project, write=write)
    return dataset


def _relative_path(raw: str, field: str) -> str:
    path = raw.replace("\\", "/").strip()
    norm = posixpath.normpath(path) if path else ""
    if not norm or norm in (".", "..") or norm.startswith("../") or norm.startswith("/") or "\x00" in norm:
        raise ApiError(f"{raw!r} is not a usable relative file path.", fields={field: [f"Bad path {raw!r}."]})
    if any(part.startswith(".") for part in norm.split("/")):
        raise ApiError(f"{raw!r}: hidden files and '..' are not allowed.", fields={field: [f"Bad path {raw!r}."]})
    return norm


def _stored_files(request: Request, session: UploadSession) -> list[StoredFile]:
    """Map the streamed parts to their paths in the version: `paths` (one per file, e.g.
    from a folder picker) when given, else the file name; parts sent as `train`,
    `validation` or `test` go under that channel's folder."""
    parts: list[StreamedUploadedFile] = []
    for field in ("file", *CHANNELS):
        parts.extend(f for f in request.FILES.getlist(field) if isinstance(f, StreamedUploadedFile))
    if not parts:
        raise ApiError("Send at least one file part named 'file', or give source_uri.", fields={"file": ["No file was sent."]})
    paths = request.data.getlist("paths") if hasattr(request.data, "getlist") else []
    file_parts = [p for p in parts if p.part.field_name == "file"]
    if paths and len(paths) != len(file_parts):
        raise ApiError(f"Got {len(paths)} paths for {len(file_parts)} files; send one path per file.", fields={"paths": ["Count mismatch."]})
    stored: list[StoredFile] = []
    seen: set[str] = set()
    path_iter = iter(paths)
    for upload in parts:
        part = upload.part
        if part.field_name == "file":
            rel = _relative_path(next(path_iter) if paths else part.file_name, "paths" if paths else "file")
        else:
            rel = f"{part.field_name}/{_relative_path(part.file_name, part.field_name).rsplit('/', 1)[-1]}"
        if part.size == 0:
            raise ApiError(f"{rel} is empty (0 bytes).", fields={part.field_name: [f"{rel} is empty (0 bytes)."]})
        if rel in seen:
            raise ApiError(f"Two files are named {rel}; each file in a version needs its own path.",
                           fields={part.field_name: [f"Duplicate file name {rel}."]})
        seen.add(rel)
        stored.append(StoredFile(path=rel, uri=part.uri, size=part.size, sha256=part.sha256))
    return stored


VERSION_SUMMARY_FIELDS = ("id", "version", "status", "format", "num_records", "size_bytes", "created_at")


def dataset_rows(page: list[dict]) -> list[dict]:
    versions: dict[int, list[dict]] = {row["id"]: [] for row in page}
    for row in DatasetVersion.objects.filter(dataset_id__in=versions).order_by("-version").values("dataset_id", *VERSION_SUMMARY_FIELDS):
        versions[row.pop("dataset_id")].append(row)
    return [
        {"id": row["id"], "project": row["project__slug"], "name": row["name"], "description": row["description"],
         "created_at": row["created_at"], "latest_version": versions[row["id"]][0] if versions[row["id"]] else None,
         "versions": versions[row["id"]]}
        for row in page
    ]


class DatasetListView(PaginatedAPIView):
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def initialize_request(self, request, *args, **kwargs):
        # Install the streaming handler before anything reads the body; the session
        # remembers what was written so a refused request leaves nothing behind.
        self.upload_session: UploadSession | None = None
        if request.method == "POST" and request.content_type == "multipart/form-data":
            self.upload_session = UploadSession(prefix_uri=actions.new_upload_prefix(), max_bytes=settings.STUDIO_MAX_UPLOAD_BYTES)
            request.upload_handlers = [ObjectStoreUploadHandler(request, session=self.upload_session)]
        return super().initialize_request(request, *args, **kwargs)

    def finalize_response(self, request, response, *args, **kwargs):
        if self.upload_session is not None and response.status_code >= 400 and not getattr(self, "_upload_kept", False):
            actions.discard_upload(self.upload_session.prefix_uri)
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(parameters=[OpenApiParameter("project", str, description="Project slug"),
                               OpenApiParameter("search", str, description="Part of the name")],
                   responses=DatasetSerializer(many=True))
    def get(self, request: Request) -> Response:
        datasets = Dataset.objects.readable_by(request.user)
        if slug := request.query_params.get("project"):
            project = get_project_for_user(request.user, slug)
            datasets = datasets.filter(project=project)
        if search := request.query_params.get("search"):
            datasets = datasets.filter(name__icontains=search)
        rows = datasets.order_by("project__slug", "name").values("id", "project__slug", "name", "description", "created_at")
        # A hot list: plain values() and one query for every version on the page, instead
        # of nested serializers per row (measured in bench/serving.py).
        return paginate(self, request, rows, dataset_rows)
    @extend_schema(request=DatasetCreateSerializer, responses={201: DatasetRegisteredSerializer, 200: DatasetRegisteredSerializer})
    def post(self, request: Request) -> Response:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        if declared > settings.STUDIO_MAX_UPLOAD_BYTES + MULTIPART_OVERHEAD:
            raise ApiError(f"The upload ({declared:,} bytes) exceeds the limit of {settings.STUDIO_MAX_UPLOAD_BYTES:,} bytes "
                           "(STUDIO_MAX_UPLOAD_BYTES).", code="too_large", status_code=413, fields={"file": ["Upload too large."]})
        serializer = DatasetCreateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        project = Project.objects.filter(slug=data["project"]).first()
        if project is None or project.role_of(request.user) not in ("admin", "scientist", "viewer"):
            raise ApiError(f"No project '{data['project']}'.", code="not_found", fields={"project": ["No such project."]})
        check_role(request.user, project, write=True)
        options = VersionOptions(format=data["format"], label_column=data["label_column"], text_column=data["text_column"],
                                 delimiter=data["delimiter"], split=data["split"])
        common = {"project": project, "name": data["name"], "description": data["description"], "user": request.user, "options": options}
        if self.upload_session is not None and request.FILES:
            if data["source_uri"]:
                raise ApiError("Send files or a source_uri, not both.", fields={"source_uri": ["Not allowed with files."]})
            stored = _stored_files(request, self.upload_session)
            version, created = actions.register_upload(root_uri=self.upload_session.prefix_uri, stored=stored, **common)
            self._upload_kept = created
        elif data["source_uri"]:
            version, created = actions.register_source(source_uri=data["source_uri"], **common)
        else:
            raise ApiError("Give source_uri (s3://… or file:///…) or upload files as multipart parts named 'file'.",
                           fields={"source_uri": ["Required when no file is uploaded."]})
        body = DatasetVersionSerializer(version).data
        body["created"] = created
        body["unchanged"] = not created
        body["reason"] = None if created else actions.unchanged_reason(version)
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class DatasetDetailView(PaginatedAPIView):
    @extend_schema(responses=DatasetSerializer)
    def get(self, request: Request, pk: int) -> Response:
        dataset = get_dataset_for_user(request.user, pk)
        return Response(DatasetSerializer(dataset).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        dataset = get_dataset_for_user(request.user, pk, write=True)
        actions.delete_dataset(dataset)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DatasetVersionListView(PaginatedAPIView):
    @extend_schema(parameters=[OpenApiParameter("dataset", int), OpenApiParameter("project", str), OpenApiParameter("status", str)],
                   responses=DatasetVersionSerializer(many=True))
    def get(self, request: Request) -> Response:
        versions = DatasetVersion.objects.readable_by(request.user).select_related("dataset__project")
        if dataset_id := request.query_params.get("dataset"):
            if not dataset_id.isdigit():
                raise ApiError("dataset must be a dataset id.", fields={"dataset": ["Not an integer."]})
            versions = versions.filter(dataset_id=int(dataset_id))
        if slug := request.query_params.get("project"):
            versions = versions.filter(dataset__project=get_project_for_user(request.user, slug))
        if wanted := request.query_params.get("status"):
            versions = versions.filter(status=wanted)
        return paginate(self, request, versions.order_by("-created_at"), lambda page: DatasetVersionSerializer(page, many=True).data)


class DatasetVersionDetailView(PaginatedAPIView):
    @extend_schema(responses=DatasetVersionSerializer)
    def get(self, request: Request, pk: int) -> Response:
        return Response(DatasetVersionSerializer(get_version_for_user(request.user, pk)).data)

    @extend_schema(responses={204: None})
    def delete(self, request: Request, pk: int) -> Response:
        version = get_version_for_user(request.user, pk, write=True)
        actions.delete_version(version)
        return Response(status=status.HTTP_204_NO_CONTENT)
