"""Plain text for character language models: every non-empty line is a record; the
schema describes the characters a model would have to learn."""

from __future__ import annotations

from collections.abc import Callable

from datasets.formats.common import (
    PREVIEW_ROWS,
    ByteSource,
    ScanOptions,
    iter_text_chunks,
    truncate,
)
from trainyard.records import text_lines

# Small vocabularies are listed in the schema so a char-level trainer can build its
# embedding table without a second pass over the data.
MAX_LISTED_VOCABULARY = 2000


class TextScanner:
    def __init__(self, options: ScanOptions) -> None:
        self.errors = options.errors
        self.characters = 0
        self.lines = 0
        self.vocabulary: set[str] = set()
        self.preview: list[dict] = []

    def scan(self, path: str, source: ByteSource, record_channel: Callable[[int], str]) -> int:
        records = 0
        for first_line, text in iter_text_chunks(source, path, self.errors):
            text, lines = text_lines(text)  # a CRLF file trains the same model as an LF one
            self.characters += len(text)
            self.vocabulary.update(text)
            self.lines += len(lines)
            non_empty = len(lines) - lines.count("")
            if len(self.preview) < PREVIEW_ROWS:
                for offset, line in enumerate(lines):
                    if line and len(self.preview) < PREVIEW_ROWS:
                        self.preview.append({"path": path, "line": first_line + offset, "text": truncate(line)})
            records += non_empty
        if records == 0:
            self.errors.add(path, None, "no records: the file has only blank lines")
        return records

    def finish(self) -> tuple[dict, list[dict]]:
        schema: dict = {
            "columns": [],
            "label_column": None,
            "classes": {},
            "characters": self.characters,
            "vocabulary_size": len(self.vocabulary),
            "lines": self.lines,
        }
        if len(self.vocabulary) <= MAX_LISTED_VOCABULARY:
            schema["vocabulary"] = "".join(sorted(self.vocabulary))
        return schema, self.preview
