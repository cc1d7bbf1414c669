"""JSON Lines: one JSON object per non-empty line; columns are the union of the keys."""

from __future__ import annotations

import json
from collections.abc import Callable

from datasets.formats import common
from trainyard.records import is_jsonl_record

_JSON_TYPE_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number",
                    bool: "true/false", type(None): "null"}


class JsonlScanner:
    def __init__(self, options: common.ScanOptions) -> None:
        self.options = options
        self.errors = options.errors
        self.columns: dict[str, common.ColumnStats] = {}  # insertion order = first appearance
        self.label_column: str | None = options.label_column or None
        self.labels = common.LabelCounts()
        self.preview: list[dict] = []
        self.reference_keys: list[str] | None = None
        self.reference_file = ""
        self.rows_summarised = 0

    def scan(self, path: str, source: common.ByteSource, record_channel: Callable[[int], str]) -> int:
        records = 0
        file_keys: dict[str, None] = {}  # ordered set
        batch: list[dict] = []
        for first_line, text in common.iter_text_chunks(source, path, self.errors):
            for offset, line in enumerate(text.split("\n")):
                if not is_jsonl_record(line):
                    continue
                records += 1
                try:
                    value = json.loads(line)
                except RecursionError:
                    self.errors.add(path, first_line + offset, "invalid JSON: nested too deeply")
                    continue
                except ValueError as exc:  # JSONDecodeError, or an over-long integer
                    self.errors.add(path, first_line + offset, f"invalid JSON: {exc}")
                    continue
                if not isinstance(value, dict):
                    found = _JSON_TYPE_NAMES.get(type(value), "something else")
                    self.errors.add(path, first_line + offset, f"expected a JSON object, found {found}")
                    continue
                batch.append(value)
                if len(batch) >= common.BATCH_ROWS:
                    self._summarise(batch, file_keys)
                    batch = []
        if batch:
            self._summarise(batch, file_keys)
        if records == 0:
            self.errors.add(path, None, "no records: the file has only blank lines")
            return 0
        self._check_keys(path, list(file_keys))
        return records

    def _summarise(self, batch: list[dict], file_keys: dict[str, None]) -> None:
        for record in batch:
            # dict.fromkeys-style update keeps first-appearance order; cheap per record.
            file_keys.update(dict.fromkeys(record))
        for key in file_keys:
            if key not in self.columns:
                # Rows summarised before this key first appeared lacked it: nulls.
                self.columns[key] = common.ColumnStats(key, nulls=self.rows_summarised)
        self.rows_summarised += len(batch)
        if self.label_column is None and not self.options.label_column:
            self.label_column = common.infer_label_column(list(self.columns))
        for key, stats in self.columns.items():
            stats.add_values([record.get(key) for record in batch])
        if self.label_column is not None:
            self.labels.add(_hashable(record[self.label_column]) for record in batch
                            if record.get(self.label_column) is not None)
        if len(self.preview) < common.PREVIEW_ROWS:
            for record in batch[: common.PREVIEW_ROWS - len(self.preview)]:
                self.preview.append({key: common.truncate(value) for key, value in record.items()})

    def _check_keys(self, path: str, keys: list[str]) -> None:
        for role, name in (("label", self.options.label_column), ("text", self.options.text_column)):
            if name and name not in keys:
                self.errors.add(path, None, common.missing_column_message(role, name, keys))
        if self.reference_keys is None:
            self.reference_keys, self.reference_file = keys, path
        elif set(keys) != set(self.reference_keys):
            self.errors.add(path, None, common.describe_column_difference(self.reference_keys, keys, self.reference_file)
                            .replace("columns", "keys", 1))

    def finish(self) -> tuple[dict, list[dict]]:
        label = self.label_column if self.label_column in self.columns else None
        schema: dict = {"columns": [stats.as_dict() for stats in self.columns.values()], "label_column": label}
        if self.options.text_column:
            schema["text_column"] = self.options.text_column
        schema.update(self.labels.schema_part() if label else {"classes": {}})
        return schema, self.preview


def _hashable(value: object) -> object:
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True)
    return value
