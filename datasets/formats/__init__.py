"""One reader per dataset format; validation.py picks one by name."""

from __future__ import annotations

from datasets.formats.common import Scanner, ScanOptions
from datasets.formats.csv import CsvScanner
from datasets.formats.imagefolder import ImageFolderScanner
from datasets.formats.jsonl import JsonlScanner
from datasets.formats.text import TextScanner

SCANNERS: dict[str, type] = {
    "csv": CsvScanner,
    "jsonl": JsonlScanner,
    "image_folder": ImageFolderScanner,
    "text": TextScanner,
}
FORMATS = tuple(SCANNERS)

# Extension → format, for guessing a version's format from its file names.
EXTENSION_FORMATS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".png": "image_folder",
    ".jpg": "image_folder",
    ".jpeg": "image_folder",
    ".txt": "text",
}


def make_scanner(format: str, options: ScanOptions) -> Scanner:
    return SCANNERS[format](options)


__all__ = ["EXTENSION_FORMATS", "FORMATS", "SCANNERS", "ScanOptions", "Scanner", "make_scanner"]
