"""One interface over the object stores Trainyard uses: `file://` paths and `s3://`
buckets (AWS, MinIO or any S3-compatible endpoint through AWS_ENDPOINT_URL).

    store = store_for("s3://bucket/prefix")
    with store.open_write("s3://bucket/prefix/a.csv") as out: out.write(b"...")
    for obj in store.list("s3://bucket/prefix/"): ...

Local stores are rooted: a key that would leave the root (`..`, an absolute path, a
symlink pointing out) is refused with StorageError before anything is touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO
from urllib.parse import unquote, urlparse

from django.conf import settings

MULTIPART_THRESHOLD = 8 * 1024 * 1024
CHUNK = 1024 * 1024


class StorageError(Exception):
    """A problem with an object store that a person can act on; the message says what."""


@dataclass(frozen=True)
class ObjectInfo:
    uri: str
    relative_path: str  # path below the listed prefix, '/'-separated
    size: int
    fingerprint: str  # ETag for S3, size+mtime for files: changes when the content does


def split_uri(uri: str) -> tuple[str, str, str]:
    """('file'|'s3', bucket or '', path or key)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StorageError(f"{uri}: file URIs must be absolute paths like file:///data/train.csv")
        return "file", "", unquote(parsed.path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise StorageError(f"{uri}: an s3 URI needs a bucket, like s3://bucket/prefix")
        return "s3", parsed.netloc, unquote(parsed.path).lstrip("/")
    raise StorageError(f"{uri}: unsupported scheme; use file:// or s3://")


def join_uri(base: str, *parts: str) -> str:
    base = base.rstrip("/")
    tail = "/".join(p.strip("/") for p in parts if p)
    return f"{base}/{tail}" if tail else base


class LocalStore:
    """Objects as files below one root directory."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()

    def path_for(self, uri: str) -> Path:
        scheme, _, path = split_uri(uri)
        if scheme != "file":
            raise StorageError(f"{uri}: not a file:// URI")
        return self._inside(Path(path))

    def _inside(self, path: Path) -> Path:
        # Resolve symlinks and '..' first, then require the result to stay under root.
        resolved = (self.root / path).resolve() if not path.is_absolute() else path.resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise StorageError(f"{path} is outside the allowed root {self.root}")
        return resolved

    def key_path(self, key: str) -> Path:
        if key.startswith("/") or "\x00" in key:
            raise StorageError(f"{key!r}: keys are relative paths")
        return self._inside(Path(key))

    def uri_for_key(self, key: str) -> str:
        return self.key_path(key).as_uri()

    @contextlib.contextmanager
    def open_write(self, uri: str) -> Iterator[BinaryIO]:
        target = self.path_for(uri)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Write beside the target and rename: a reader never sees half an object.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as out:
                yield out  # type: ignore[misc]
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    def open_read(self, uri: str) -> BinaryIO:
        path = self.path_for(uri)
        try:
            return open(path, "rb")  # noqa: SIM115 (the caller closes it)
        except FileNotFoundError as exc:
            raise StorageError(f"{uri} does not exist") from exc
        except IsADirectoryError as exc:
            raise StorageError(f"{uri} is a folder, not a file") from exc

    def put_file(self, local: Path, uri: str) -> None:
        with open(local, "rb") as src, self.open_write(uri) as out:
            shutil.copyfileobj(src, out, CHUNK)

    def get_file(self, uri: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        with self.open_read(uri) as src, open(local, "wb") as out:
            shutil.copyfileobj(src, out, CHUNK)

    def list(self, uri: str) -> Iterator[ObjectInfo]:
        base = self.path_for(uri)
        if base.is_file():
            stat = base.stat()
            yield ObjectInfo(base.as_uri(), base.name, stat.st_size, f"{stat.st_size}-{stat.st_mtime_ns}")
            return
        if not base.exists():
            return
        for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    continue
                full = Path(dirpath) / name
                # A symlink inside the tree may point anywhere: resolve and re-check.
                real = self._inside(full)
                if not real.is_file():
                    continue
                stat = real.stat()
                rel = full.relative_to(base).as_posix()
                yield ObjectInfo(full.as_uri(), rel, stat.st_size, f"{stat.st_size}-{stat.st_mtime_ns}")

    def exists(self, uri: str) -> bool:
        return self.path_for(uri).exists()

    def delete_prefix(self, uri: str) -> None:
        path = self.path_for(uri)
        if path == self.root:
            raise StorageError("refusing to delete the store's root")
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()

    def check_writable(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        probe = self.root / f".probe-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()


class S3Store:
    """Objects in an S3 bucket, through boto3 (path-style addressing, so MinIO and moto work)."""

    def __init__(self, endpoint_url: str | None = None):
        self.endpoint_url = endpoint_url if endpoint_url is not None else settings.AWS_ENDPOINT_URL
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import boto3
            from botocore.config import Config

            # A session per store: credentials are resolved from the environment each time,
            # so a rotated key or a fixed configuration is picked up without a restart.
            self._client = boto3.session.Session().client(
                "s3",
                endpoint_url=self.endpoint_url,
                config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3, "mode": "standard"}),
            )
        return self._client

    def _transfer_config(self):
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD)

    @contextlib.contextmanager
    def _errors(self, uri: str) -> Iterator[None]:
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            yield
        except NoCredentialsError as exc:
            raise StorageError(
                f"{uri}: no S3 credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE) for the server and workers"
            ) from exc
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            _, bucket, key = split_uri(uri)
            if code == "NoSuchBucket" or (code == "404" and not key):
                raise StorageError(f"bucket '{bucket}' does not exist") from exc
            if code in ("NoSuchKey", "404"):
                raise StorageError(f"{uri} does not exist") from exc
            if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StorageError(f"{uri}: access denied by S3 ({code}); check the credentials and bucket policy") from exc
            raise StorageError(f"{uri}: S3 error {code}: {exc}") from exc
        except BotoCoreError as exc:
            raise StorageError(f"{uri}: cannot reach S3 ({exc})") from exc

    @contextlib.contextmanager
    def open_write(self, uri: str) -> Iterator[BinaryIO]:
        _, bucket, key = split_uri(uri)
        # Spool to disk so memory stays bounded, then hand the file to boto3's transfer
        # manager, which switches to a multipart upload above 8 MiB.
        with tempfile.TemporaryFile() as spool:
            yield spool  # type: ignore[misc]
            spool.seek(0)
            with self._errors(uri):
                self.client.upload_fileobj(spool, bucket, key, Config=self._transfer_config())

    def open_read(self, uri: str) -> BinaryIO:
        _, bucket, key = split_uri(uri)
        with self._errors(uri):
            body = self.client.get_object(Bucket=bucket, Key=key)["Body"]
        return body  # a botocore StreamingBody: read(n), iter_chunks(), close()

    def put_file(self, local: Path, uri: str) -> None:
        _, bucket, key = split_uri(uri)
        with self._errors(uri):
            self.client.upload_file(str(local), bucket, key, Config=self._transfer_config())

    def get_file(self, uri: str, local: Path) -> None:
        _, bucket, key = split_uri(uri)
        local.parent.mkdir(parents=True, exist_ok=True)
        with self._errors(uri):
            self.client.download_file(bucket, key, str(local), Config=self._transfer_config())

    def list(self, uri: str) -> Iterator[ObjectInfo]:
        _, bucket, prefix = split_uri(uri)
        with self._errors(uri):
            paginator = self.client.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"]
                    if key.endswith("/"):
                        continue
                    rel = key[len(prefix):].lstrip("/") if prefix else key
                    if not rel:  # the prefix names one object exactly
                        rel = key.rsplit("/", 1)[-1]
                    name = rel.rsplit("/", 1)[-1]
                    if name.startswith("."):
                        continue
                    # A prefix "data/train" must not match "data/training.csv" as a folder.
                    if prefix and not prefix.endswith("/") and key != prefix and not key[len(prefix):].startswith("/"):
                        continue
                    yield ObjectInfo(f"s3://{bucket}/{key}", rel, int(item["Size"]), str(item.get("ETag", "")).strip('"'))

    def exists(self, uri: str) -> bool:
        return any(True for _ in self.list(uri))

    def delete_prefix(self, uri: str) -> None:
        _, bucket, prefix = split_uri(uri)
        keys = [{"Key": split_uri(o.uri)[2]} for o in self.list(uri)]
        with self._errors(uri):
            for start in range(0, len(keys), 1000):
                self.client.delete_objects(Bucket=bucket, Delete={"Objects": keys[start:start + 1000]})

    def check_bucket(self, uri: str) -> None:
        _, bucket, _ = split_uri(uri)
        with self._errors(f"s3://{bucket}"):
            self.client.head_bucket(Bucket=bucket)

    def presigned_url(self, uri: str, expires_seconds: int = 3600, filename: str | None = None) -> str:
        _, bucket, key = split_uri(uri)
        params = {"Bucket": bucket, "Key": key}
        if filename:
            from django.utils.http import content_disposition_header

            # Quotes, non-ASCII and control characters in a name are encoded, not pasted in.
            if disposition := content_disposition_header(True, filename):  # always one for an attachment
                params["ResponseContentDisposition"] = disposition
        with self._errors(uri):
            return self.client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_seconds)


Store = LocalStore | S3Store


def default_store_uri() -> str:
    return settings.STUDIO_OBJECT_STORE.rstrip("/")


def store_for(uri: str) -> Store:
    """The store that serves `uri`. file:// URIs are served only inside the object store
    root or one of STUDIO_DATA_ROOTS; anything else is refused."""
    scheme, _, path = split_uri(uri)
    if scheme == "s3":
        return S3Store()
    for root in local_roots():
        candidate = Path(path).resolve()
        if candidate == root or root in candidate.parents:
            return LocalStore(root)
    raise StorageError(f"{path} is not under an allowed data root ({', '.join(str(r) for r in local_roots())})")


def local_roots() -> list[Path]:
    roots = list(settings.STUDIO_DATA_ROOTS)
    scheme, _, path = split_uri(default_store_uri())
    if scheme == "file":
        roots.insert(0, Path(path).resolve())
    return roots


def default_store() -> Store:
    uri = default_store_uri()
    scheme, _, path = split_uri(uri)
    if scheme == "s3":
        return S3Store()
    return LocalStore(Path(path))


def object_uri(key: str) -> str:
    """URI of `key` inside the default object store."""
    if "\x00" in key or key.startswith("/") or ".." in Path(key).parts:
        raise StorageError(f"{key!r}: object keys are relative paths without '..'")
    return join_uri(default_store_uri(), key)


def sha256_stream(stream: IO[bytes]) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


def download_response(uri: str, filename: str, content_type: str = "application/gzip", *, size: int | None = None):
    """An object as a download: streamed from a file:// store in CHUNK-sized reads (never
    read whole), or a redirect to a short-lived presigned link for S3 (the bytes then never
    pass through the web server). Http404 with the store's reason when it cannot be read."""
    from django.http import FileResponse, Http404
    from django.shortcuts import redirect

    try:
        if split_uri(uri)[0] == "s3":
            return redirect(S3Store().presigned_url(uri, expires_seconds=600, filename=filename))
        stream = store_for(uri).open_read(uri)
    except StorageError as exc:
        raise Http404(f"The file could not be read from storage: {exc}") from exc
    response = FileResponse(stream, as_attachment=True, filename=filename, content_type=content_type)
    response.block_size = CHUNK
    if size is not None and "Content-Length" not in response:
        response["Content-Length"] = str(size)
    response["Cache-Control"] = "private, no-store"
    return response


class _ZipSink:
    """What zipfile writes into: chunks are collected and handed to the response as they
    come. It has no tell()/seek(), so zipfile writes data descriptors and never seeks back."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> int:
        if data:
            self.chunks.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take(self) -> bytes:
        data = b"".join(self.chunks)
        self.chunks.clear()
        return data


# Already compressed: stored as they are (deflating them again costs CPU and saves nothing).
_STORED_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".gz", ".zip", ".bz2", ".xz", ".zst", ".parquet")


def zip_chunks(entries: list[tuple[str, str]]) -> Iterator[bytes]:
    """A zip archive of (path inside the archive, object URI) pairs, produced while it is
    sent: each object is read from its store in CHUNK-sized pieces, so memory stays at a
    chunk or two whatever the sizes. An object that cannot be read ends the stream with an
    error (the client sees a truncated archive rather than a silently incomplete one)."""
    import zipfile

    sink = _ZipSink()
    with zipfile.ZipFile(sink, mode="w", compression=zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        for arcname, uri in entries:
            method = zipfile.ZIP_STORED if arcname.lower().endswith(_STORED_SUFFIXES) else zipfile.ZIP_DEFLATED
            info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = method
            info.external_attr = 0o644 << 16
            with store_for(uri).open_read(uri) as source, archive.open(info, mode="w", force_zip64=True) as target:
                while chunk := source.read(CHUNK):
                    target.write(chunk)
                    if data := sink.take():
                        yield data
            if data := sink.take():
                yield data
    if data := sink.take():
        yield data


def zip_response(entries: list[tuple[str, str]], filename: str):
    """zip_chunks as a streamed attachment."""
    from django.http import StreamingHttpResponse
    from django.utils.http import content_disposition_header

    response = StreamingHttpResponse(zip_chunks(entries), content_type="application/zip")
    if disposition := content_disposition_header(True, filename):  # always one for an attachment
        response["Content-Disposition"] = disposition
    response["Cache-Control"] = "private, no-store"
    return response
