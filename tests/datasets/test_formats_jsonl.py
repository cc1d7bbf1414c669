"""JSON Lines validation: objects per line, union of keys, and the errors people hit."""

from __future__ import annotations

import json
from pathlib import Path

from datasets.validation import DataFile, ValidationReport, validate_files


def validate_jsonl(root: Path, files: dict[str, str | bytes], **options: object) -> ValidationReport:
    entries = []
    for relative, content in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        entries.append(DataFile(path=relative, uri=str(target), size=target.stat().st_size))
    options.setdefault("format", None)
    return validate_files(entries, open_read=lambda uri: open(uri, "rb"), **options)  # type: ignore[arg-type]


def lines(*records: object) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def test_jsonl_happy_path_has_union_of_keys_types_and_classes(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"data.jsonl": lines(
        {"text": "good", "stars": 5, "score": 0.5, "label": "pos"},
        {"text": "bad", "stars": 1, "score": 1, "label": "neg", "meta": {"source": "web"}},
        {"text": "fine", "stars": None, "label": "pos", "flag": True},
    )}, text_column="text")

    assert report.ok, report.errors
    assert report.format == "jsonl"
    assert report.num_records == 3
    columns = {col["name"]: col for col in report.schema["columns"]}
    assert list(columns) == ["text", "stars", "score", "label", "meta", "flag"]
    assert columns["stars"]["type"] == "integer"
    assert (columns["stars"]["nulls"], columns["stars"]["min"], columns["stars"]["max"], columns["stars"]["mean"]) == (1, 1, 5, 3.0)
    assert columns["score"]["type"] == "float"  # 0.5 and 1 together
    assert (columns["meta"]["type"], columns["meta"]["nulls"]) == ("object", 2)
    assert (columns["flag"]["type"], columns["flag"]["nulls"]) == ("boolean", 2)
    assert report.schema["label_column"] == "label"
    assert report.schema["classes"] == {"pos": 2, "neg": 1}
    assert report.schema["text_column"] == "text"
    assert report.preview[1]["meta"] == {"source": "web"}


def test_values_of_different_types_make_a_mixed_column(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"data.jsonl": lines({"x": 1}, {"x": "one"})})
    assert report.schema["columns"][0]["type"] == "mixed"


def test_invalid_json_line_reports_file_and_physical_line(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"data.jsonl": '{"a": 1}\n\n{"a": 2,}\n{"a": 3}\n'})
    assert not report.ok
    assert len(report.errors) == 1
    error = report.errors[0]
    assert (error["file"], error["line"]) == ("data.jsonl", 3)
    assert error["message"].startswith("invalid JSON: ")
    assert report.num_records == 3


def test_line_that_is_not_an_object_is_an_error(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"data.ndjson": '{"a": 1}\n[1, 2]\n"text"\n'})
    assert report.errors == [
        {"file": "data.ndjson", "line": 2, "message": "expected a JSON object, found an array"},
        {"file": "data.ndjson", "line": 3, "message": "expected a JSON object, found a string"},
    ]


def test_missing_label_and_text_columns_name_the_keys_that_exist(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"data.jsonl": lines({"a": 1, "b": 2})}, label_column="y", text_column="body")
    assert report.errors == [
        {"file": "data.jsonl", "line": None, "message": "label column 'y' not found; the columns are: a, b"},
        {"file": "data.jsonl", "line": None, "message": "text column 'body' not found; the columns are: a, b"},
    ]


def test_files_with_different_keys_across_channels_are_an_error(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"train.jsonl": lines({"a": 1, "label": "x"}),
                                       "test.jsonl": lines({"a": 1, "target": "x"})})
    assert not report.ok
    assert report.errors == [{"file": "test.jsonl", "line": None,
                              "message": "keys differ from train.jsonl: missing 'label'; unexpected 'target'"}]
    assert report.channel_counts == {"train": 1, "test": 1}


def test_empty_and_blank_jsonl_files_have_no_records(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"a.jsonl": b"", "b.jsonl": "\n  \n"})
    assert [(error["file"], error["message"]) for error in report.errors] == [
        ("a.jsonl", "empty file (0 bytes)"), ("b.jsonl", "no records: the file has only blank lines")]


def test_non_utf8_jsonl_line_is_reported(tmp_path: Path) -> None:
    report = validate_jsonl(tmp_path, {"data.jsonl": b'{"a": 1}\n{"a": "\xe9"}\n'})
    assert report.errors[0] == {"file": "data.jsonl", "line": 2,
                                "message": "not valid UTF-8 at byte 8 of the line (0xe9)"}
