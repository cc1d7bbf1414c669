"""Image folders: `<class>/<name>.png|jpg|jpeg`, optionally under train/, validation/
and test/ top folders. Every image is one record; its class is its folder."""

from __future__ import annotations

import io
import warnings
from collections import Counter
from collections.abc import Callable

from PIL import Image

from datasets.formats.common import (
    PREVIEW_ROWS,
    ByteSource,
    ScanOptions,
)
from trainyard.records import CHANNEL_ALIASES, IMAGE_EXTENSIONS

# Images are read whole into memory to decode them; anything bigger than this is not a
# training image a folder-of-classes trainer could use anyway.
MAX_IMAGE_BYTES = 64 * 1024 * 1024
# A few kilobytes of PNG can claim a gigapixel canvas; decoding that would blow the memory
# bound, so huge canvases are refused from their header alone.
MAX_IMAGE_PIXELS = 25_000_000


def class_of(path: str) -> str | None:
    """The class folder of an image path, or None when the layout has no class folder."""
    parts = path.split("/")
    if parts[0].lower() in CHANNEL_ALIASES:
        return parts[1] if len(parts) >= 3 else None
    return parts[0] if len(parts) >= 2 else None


class ImageFolderScanner:
    def __init__(self, options: ScanOptions) -> None:
        self.errors = options.errors
        self.classes: Counter = Counter()
        self.classes_by_channel: dict[str, set[str]] = {}
        self.modes: Counter = Counter()
        self.min_width = self.max_width = self.min_height = self.max_height = 0
        self.measured = 0
        self.preview_by_class: dict[str, list[dict]] = {}

    def scan(self, path: str, source: ByteSource, record_channel: Callable[[int], str]) -> int:
        if not path.lower().endswith(IMAGE_EXTENSIONS):
            self.errors.add(path, None, "not an image: an image folder holds only .png, .jpg and .jpeg files")
            source.drain()
            return 0
        label = class_of(path)
        if label is None:
            self.errors.add(path, None, "not inside a class folder: put each image in a folder named "
                            "after its class, like cat/001.png (or train/cat/001.png)")
            source.drain()
            return 0
        data = source.read_up_to(MAX_IMAGE_BYTES)
        if data is None:
            self.errors.add(path, None, f"image is larger than {MAX_IMAGE_BYTES // 2**20} MiB")
            return 0
        measured = self._measure(path, data)
        if measured is None:
            return 0
        width, height, mode = measured
        channel = record_channel(0)
        self.classes[label] += 1
        self.classes_by_channel.setdefault(channel, set()).add(label)
        self.modes[mode] += 1
        self._track_size(width, height)
        samples = self.preview_by_class.setdefault(label, [])
        if len(samples) < PREVIEW_ROWS:
            samples.append({"path": path, "label": label, "width": width, "height": height, "channel": channel})
        return 1

    def _measure(self, path: str, data: bytes) -> tuple[int, int, str] | None:
        # Pillow reports corrupt data through many exception types (OSError,
        # SyntaxError, struct.error, DecompressionBombError ...); any of them means
        # "this file is not a usable image", which is a data problem to report.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(io.BytesIO(data)) as image:
                    kind, size, mode = image.format, image.size, image.mode
                    image.verify()  # PNG: checks every chunk's CRC
                if kind not in ("PNG", "JPEG"):
                    self.errors.add(path, None, f"not a PNG or JPEG image (it is {kind})")
                    return None
                if size[0] * size[1] > MAX_IMAGE_PIXELS:
                    self.errors.add(path, None, f"image is {size[0]}×{size[1]} pixels; the limit is "
                                    f"{MAX_IMAGE_PIXELS:,} pixels")
                    return None
                with Image.open(io.BytesIO(data)) as image:
                    # JPEG verify() checks little; decoding finds truncation. Draft mode
                    # decodes JPEG at 1/8 scale: the same bytes are read, far less memory.
                    image.draft(image.mode, (max(1, size[0] // 8), max(1, size[1] // 8)))
                    image.load()
        except Exception as exc:  # noqa: BLE001 - see above
            self.errors.add(path, None, f"not a valid PNG or JPEG image: {exc}")
            return None
        return size[0], size[1], mode

    def _track_size(self, width: int, height: int) -> None:
        if self.measured == 0:
            self.min_width = self.max_width = width
            self.min_height = self.max_height = height
        else:
            self.min_width, self.max_width = min(self.min_width, width), max(self.max_width, width)
            self.min_height, self.max_height = min(self.min_height, height), max(self.max_height, height)
        self.measured += 1

    def finish(self) -> tuple[dict, list[dict]]:
        if not self.classes:
            self.errors.add("", None, "no class subfolders: an image folder needs one folder per "
                            "class, like cat/001.png and dog/002.png")
        trained = self.classes_by_channel.get("train")
        if trained:
            for channel in ("validation", "test"):
                for label in sorted(self.classes_by_channel.get(channel, set()) - trained):
                    self.errors.add("", None, f"class {label!r} is in {channel} but not in train")
        schema: dict = {
            "columns": [],
            "label_column": "label" if self.classes else None,
            "classes": dict(sorted(self.classes.items())),
            "image_sizes": {"min_width": self.min_width, "max_width": self.max_width,
                            "min_height": self.min_height, "max_height": self.max_height},
            "modes": dict(self.modes),
        }
        return schema, self._round_robin_preview()

    def _round_robin_preview(self) -> list[dict]:
        # A preview of the first 20 images would often show one class only.
        queues = [self.preview_by_class[label] for label in sorted(self.preview_by_class)]
        preview: list[dict] = []
        position = 0
        while len(preview) < PREVIEW_ROWS and any(position < len(queue) for queue in queues):
            for queue in queues:
                if position < len(queue) and len(preview) < PREVIEW_ROWS:
                    preview.append(queue[position])
            position += 1
        return preview
