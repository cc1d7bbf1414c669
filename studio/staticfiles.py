"""Static files as the web server sends them: hashed names (cached for ten years by
whitenoise), each with a gzip and a brotli copy made once by `collectstatic`.

- `StudioStaticStorage`: whitenoise's compressed manifest storage, with two changes for
  these machines. Brotli at quality 9, not 11: plotly.min.js (4.8 MB) took 50 s at 11 on a
  busy 2-core machine and 4 s at 9, for an 11 % bigger file (1.23 MB against 1.11 MB; gzip
  1.47 MB). And a file whose .gz/.br is newer than it is not compressed again, so a second
  `collectstatic` takes seconds, not minutes; one whose sources did not change at all is
  skipped (`collect_static`). The unhashed names stay served too (short cache): links
  that people or scripts kept keep working.
- `PlotlyFinder`: plotly's own bundle, as vendor/plotly/plotly.min.js, and nothing else
  from plotly's package_data (its sample datasets are 25 MB).
- `collect_static()`: what `studio up` and the test session call, under a file lock, so two
  that start together do not write one STATIC_ROOT at once."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage
from whitenoise.compress import Compressor
from whitenoise.storage import CompressedManifestStaticFilesStorage

BROTLI_QUALITY = 9
PLOTLY_NAME = "vendor/plotly/plotly.min.js"


class _Compressor(Compressor):
    def compress(self, path: str) -> Any:
        # A copy newer than its file was made from these bytes (collectstatic leaves an
        # unchanged file, and its mtime, alone; a hashed name never changes content).
        made = [path + suffix for suffix, wanted in ((".gz", self.use_gzip), (".br", self.use_brotli)) if wanted]
        source = os.stat(path).st_mtime_ns
        if made and all(os.path.exists(name) and os.stat(name).st_mtime_ns >= source for name in made):
            return made
        return super().compress(path)

    @staticmethod
    def compress_brotli(data: bytes) -> bytes:
        import brotli

        return brotli.compress(data, quality=BROTLI_QUALITY)


class StudioStaticStorage(CompressedManifestStaticFilesStorage):
    def create_compressor(self, **kwargs: Any) -> Compressor:
        return _Compressor(**kwargs)


def _plotly_bundle() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


class PlotlyFinder(BaseFinder):
    """Finds vendor/plotly/plotly.min.js in the installed plotly package (no CDN)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bundle = _plotly_bundle()
        self.storage = FileSystemStorage(location=str(bundle.parent))
        self.storage.prefix = "vendor/plotly"  # type: ignore[attr-defined] # collectstatic reads it
        self.bundle = bundle

    def check(self, **kwargs: Any) -> list:
        return []

    # django-stubs types a single-match miss as None, but Django's own finders answer [] (see below).
    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> str | list[str]:  # type: ignore[override]
        if path == PLOTLY_NAME:
            return [str(self.bundle)] if find_all else str(self.bundle)
        # An empty list, as Django's own finders answer: finders.find() wraps any other
        # falsy answer in a list and returns it as a match (a 500 for every missing file).
        return []

    def list(self, ignore_patterns: Any) -> Iterator[tuple[str, FileSystemStorage]]:
        yield self.bundle.name, self.storage


def source_fingerprint() -> str:
    """Name, size and mtime of every file the finders offer, plus the storage's settings:
    when it has not changed since the last collect, the collected files are current."""
    import hashlib

    from django.contrib.staticfiles.finders import get_finders

    digest = hashlib.sha256(f"{BROTLI_QUALITY}|{settings.STORAGES['staticfiles']}|{settings.STATIC_URL}".encode())
    for finder in get_finders():
        for path, storage in finder.list(["CVS", ".*", "*~"]):
            stat = os.stat(storage.path(path))
            digest.update(f"{getattr(storage, 'prefix', '') or ''}/{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def collect_static(verbosity: int = 0) -> bool:
    """`collectstatic --noinput` into STATIC_ROOT, one process at a time, skipped when
    nothing changed since the last one. True when it ran."""
    from django.core.management import call_command

    root = Path(settings.STATIC_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    stamp = root / ".sources"
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fingerprint = source_fingerprint()
        if (root / "staticfiles.json").exists() and stamp.exists() and stamp.read_text() == fingerprint:
            return False
        call_command("collectstatic", interactive=False, verbosity=verbosity)
        stamp.write_text(fingerprint)
        return True
