"""Streams multipart file parts straight into the object store while hashing them, so an
upload of any size is never held whole in memory (nor written twice to local disk for a
file:// store). The API view installs this handler for dataset uploads only, after the
user is authenticated."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, NoReturn

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler

from datasets.storage import default_store
from studio.api import ApiError


@dataclass
class StreamedPart:
    field_name: str
    file_name: str
    uri: str
    size: int = 0
    sha256: str = ""


class StreamedUploadedFile(UploadedFile):
    """What request.FILES holds for a streamed part: its metadata, no content."""

    def __init__(self, part: StreamedPart, content_type: str | None):
        super().__init__(file=None, name=part.file_name, content_type=content_type, size=part.size)
        self.part = part

    def open(self, mode: str | None = None, *args: Any, **kwargs: Any) -> NoReturn:  # pragma: no cover - the content lives in the object store
        raise ValueError("streamed uploads are read from the object store, not from the request")


@dataclass
class UploadSession:
    prefix_uri: str
    max_bytes: int
    parts: list[StreamedPart] = field(default_factory=list)
    total_bytes: int = 0


class ObjectStoreUploadHandler(FileUploadHandler):
    chunk_size = 1024 * 1024

    def __init__(self, request=None, *, session: UploadSession):
        super().__init__(request)
        self.session = session
        self._writer: Any = None
        self._out: Any = None
        self._digest: Any = None
        self._part: StreamedPart | None = None

    def new_file(self, field_name, file_name, content_type, content_length, charset=None, content_type_extra=None):
        super().new_file(field_name, file_name, content_type, content_length, charset, content_type_extra)
        index = len(self.session.parts)
        # Parts are stored by position; the version's file list maps them to their
        # relative paths, so two "001.png" from different class folders never collide.
        uri = f"{self.session.prefix_uri}/parts/{index:06d}"
        self._part = StreamedPart(field_name=field_name, file_name=file_name or "", uri=uri)
        self._digest = hashlib.sha256()
        self._writer = default_store().open_write(uri)
        self._out = self._writer.__enter__()

    def receive_data_chunk(self, raw_data: bytes, start: int):
        self.session.total_bytes += len(raw_data)
        if self.session.total_bytes > self.session.max_bytes:
            self.abort()
            raise ApiError(
                f"The upload exceeds the limit of {self.session.max_bytes:,} bytes (STUDIO_MAX_UPLOAD_BYTES).",
                code="too_large", status_code=413, fields={"file": ["Upload too large."]},
            )
        self._digest.update(raw_data)
        self._out.write(raw_data)
        return None

    def file_complete(self, file_size: int):
        assert self._part is not None
        self._writer.__exit__(None, None, None)
        self._writer = None
        self._part.size = file_size
        self._part.sha256 = self._digest.hexdigest()
        self.session.parts.append(self._part)
        part, self._part = self._part, None
        return StreamedUploadedFile(part, self.content_type)

    def abort(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            try:
                raise RuntimeError("upload aborted")
            except RuntimeError as exc:
                writer.__exit__(RuntimeError, exc, exc.__traceback__)

    def upload_interrupted(self):
        self.abort()
