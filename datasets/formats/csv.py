"""CSV and TSV: a header row, then one record per row (quoted fields may span lines).

Speed matters here (a 1 GB file is normal), so rows are checked for width one by one but
collected in batches and summarised column-wise, letting C do the per-cell work.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING

from datasets.formats.common import (
    BATCH_ROWS,
    PREVIEW_ROWS,
    ByteSource,
    ColumnStats,
    LabelCounts,
    ScanOptions,
    describe_column_difference,
    infer_label_column,
    iter_lines,
    iter_text_chunks,
    missing_column_message,
    truncate,
)
from trainyard.records import csv_delimiter

if TYPE_CHECKING:
    from _csv import Reader as CsvReader

OTHER_DELIMITERS = (";", "\t", "|", ",")


def show_delimiter(delimiter: str) -> str:
    return "\\t" if delimiter == "\t" else delimiter


class CsvScanner:
    def __init__(self, options: ScanOptions) -> None:
        self.options = options
        self.errors = options.errors
        self.header: list[str] | None = None
        self.header_file = ""
        self.delimiter_used = ""
        self.columns: list[ColumnStats] = []
        self.label_column: str | None = None
        self.label_index: int | None = None
        self.labels = LabelCounts()
        self.preview: list[dict] = []

    def delimiter_for(self, path: str) -> str:
        return csv_delimiter(path, self.options.delimiter)

    def scan(self, path: str, source: ByteSource, record_channel: Callable[[int], str]) -> int:
        """1. Read the header and check it (delimiter, duplicates, label, same as the
        first file). 2. Stream the rows in batches: wrong widths are errors, good rows go
        to the column statistics unless the header was unusable."""
        delimiter = self.delimiter_for(path)
        reader = csv.reader(iter_lines(iter_text_chunks(source, path, self.errors)), delimiter=delimiter)
        header = self._read_header(reader, path)
        if header is None:
            return 0
        keep_stats = self._check_header(header, path, delimiter)
        records = 0
        batch: list[list[str]] = []
        first_line = reader.line_num + 1
        while True:
            # list.extend(islice(...)) pulls rows without a Python-level step per row;
            # if csv raises mid-batch, the rows before the bad one are already in batch.
            try:
                batch.extend(islice(reader, BATCH_ROWS))
            except csv.Error as exc:
                records += self._take(batch, first_line, path, header, keep_stats) + 1
                self.errors.add(path, reader.line_num, f"cannot parse the row: {exc}")
                batch, first_line = [], reader.line_num + 1
                continue
            if not batch:
                break
            records += self._take(batch, first_line, path, header, keep_stats)
            batch, first_line = [], reader.line_num + 1
        if records == 0:
            self.errors.add(path, None, "no records: the file has a header but no rows")
        return records

    def _take(self, batch: list[list[str]], first_line: int, path: str, header: list[str],
              keep_stats: bool) -> int:
        """Check and summarise rows that start at physical line first_line; returns how
        many records (non-blank rows) they hold."""
        width = len(header)
        records = len(batch)
        if set(map(len, batch)) != {width}:
            records -= batch.count([])  # [] is a blank line, not a record
            batch = self._good_rows(batch, first_line, path, width)
        if keep_stats and batch:
            self._summarise(batch, header)
        return records

    def _good_rows(self, batch: list[list[str]], first_line: int, path: str, width: int) -> list[list[str]]:
        good = []
        line = first_line
        for row in batch:
            if len(row) == width:
                good.append(row)
            elif row:
                self.errors.add(path, line, f"expected {width} fields, found {len(row)}")
            # A quoted field with newlines spans several physical lines.
            line += 1 + sum(value.count("\n") for value in row)
        return good

    def _read_header(self, reader: CsvReader, path: str) -> list[str] | None:
        try:
            for row in reader:
                if row:
                    return row
        except csv.Error as exc:
            self.errors.add(path, reader.line_num, f"cannot parse the header: {exc}")
            return None
        self.errors.add(path, None, "no header row: the file has only blank lines")
        return None

    def _check_header(self, header: list[str], path: str, delimiter: str) -> bool:
        """Report header problems; True if this file's rows can feed the shared stats."""
        ok = True
        if len(header) == 1:
            counts = {other: header[0].count(other) for other in OTHER_DELIMITERS if other != delimiter}
            likely = max(counts, key=lambda other: counts[other])
            if counts[likely] > 0:
                shown = show_delimiter(likely)
                self.errors.add(path, 1, f"found 1 column; the header looks '{shown}'-delimited "
                                f"— set delimiter to '{shown}'")
                ok = False
        duplicates = sorted({name for name in header if header.count(name) > 1})
        if duplicates:
            self.errors.add(path, 1, "duplicate column names: " + ", ".join(repr(n) for n in duplicates))
            ok = False
        for role, name in (("label", self.options.label_column), ("text", self.options.text_column)):
            if name and name not in header:
                self.errors.add(path, 1, missing_column_message(role, name, header))
        if self.header is None:
            if not ok:
                return False
            self.header, self.header_file, self.delimiter_used = header, path, delimiter
            self.columns = [ColumnStats(name) for name in header]
            self.label_column = self.options.label_column or infer_label_column(header)
            if self.label_column in header:
                self.label_index = header.index(self.label_column)
            return True
        if header != self.header:
            if ok:
                self.errors.add(path, 1, describe_column_difference(self.header, header, self.header_file))
            return False
        return ok

    def _summarise(self, batch: list[list[str]], header: list[str]) -> None:
        by_column = list(zip(*batch, strict=True))
        for stats, values in zip(self.columns, by_column, strict=True):
            stats.add_strings(values)
        if self.label_index is not None:
            self.labels.add(filter(None, by_column[self.label_index]))
        if len(self.preview) < PREVIEW_ROWS:
            for row in batch[: PREVIEW_ROWS - len(self.preview)]:
                self.preview.append({name: truncate(value) for name, value in zip(header, row, strict=True)})

    def finish(self) -> tuple[dict, list[dict]]:
        schema: dict = {
            "columns": [stats.as_dict() for stats in self.columns],
            "label_column": self.label_column if self.label_index is not None else None,
            "delimiter": self.delimiter_used,
        }
        if self.options.text_column:
            schema["text_column"] = self.options.text_column
        if self.label_index is not None:
            schema.update(self.labels.schema_part())
        else:
            schema["classes"] = {}
        return schema, self.preview
