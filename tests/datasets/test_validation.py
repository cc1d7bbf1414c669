"""validate_files on CSV data, plus what every format shares: channels, splits, hashing,
progress, error capping and storage failures. Real files in tmp_path; no database."""

from __future__ import annotations

import hashlib
import io
from collections import Counter
from pathlib import Path

import pytest

from datasets.formats import common
from datasets.hashing import combine_content_hash
from datasets.validation import (
    DataFile,
    ValidationReport,
    assign_file_channels,
    infer_format,
    validate_files,
)
from trainyard.records import assign_channel, parse_split


def write(root: Path, relative: str, content: str | bytes) -> Path:
    target = root / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        target.write_bytes(content.encode())
    else:
        target.write_bytes(content)
    return target


def data_files(root: Path) -> list[DataFile]:
    return [
        DataFile(path=path.relative_to(root).as_posix(), uri=str(path), size=path.stat().st_size)
        for path in sorted(root.rglob("*"))
        if path.is_file()
    ]


def open_local(uri: str) -> io.BufferedReader:
    return open(uri, "rb")  # noqa: SIM115 - validate_files closes it


def validate_dir(root: Path, **options: object) -> ValidationReport:
    options.setdefault("format", None)
    return validate_files(data_files(root), open_read=open_local, **options)  # type: ignore[arg-type]


def messages(report: ValidationReport) -> list[str]:
    return [error["message"] for error in report.errors]


def column(report: ValidationReport, name: str) -> dict:
    return next(col for col in report.schema["columns"] if col["name"] == name)


# --- CSV happy path and statistics -------------------------------------------------


def test_csv_happy_path_reports_types_stats_and_label_classes(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "id,price,active,city,label\n"
                                "1,2.5,true,Oslo,cat\n"
                                "2,,FALSE,Lima,dog\n"
                                "3,4.5,true,Oslo,cat\n")
    report = validate_dir(tmp_path)

    assert report.ok, report.errors
    assert report.format == "csv"
    assert report.num_records == 3
    assert column(report, "id") == {"name": "id", "type": "integer", "nulls": 0, "min": 1, "max": 3,
                                    "mean": 2.0, "distinct": 3, "distinct_capped": False}
    price = column(report, "price")
    assert (price["type"], price["nulls"], price["min"], price["max"], price["mean"]) == ("float", 1, 2.5, 4.5, 3.5)
    assert column(report, "active")["type"] == "boolean"
    city = column(report, "city")
    assert (city["type"], city["distinct"]) == ("string", 2)
    assert "mean" not in city
    assert report.schema["label_column"] == "label"
    assert report.schema["classes"] == {"cat": 2, "dog": 1}
    assert report.schema["delimiter"] == ","
    assert report.preview[1] == {"id": "2", "price": "", "active": "FALSE", "city": "Lima", "label": "dog"}
    assert report.channel_counts == {"train": 3}
    assert report.files == [{"path": "data.csv", "size": (tmp_path / "data.csv").stat().st_size,
                             "sha256": hashlib.sha256((tmp_path / "data.csv").read_bytes()).hexdigest(),
                             "channel": "train", "records": 3}]


def test_types_merge_across_batches(tmp_path: Path) -> None:
    # More rows than one batch, so the late values arrive in a later batch.
    rows = common.BATCH_ROWS + 10
    lines = ["ints_then_float,ints_then_text,bools_then_int,all_empty"]
    for index in range(rows):
        last = index == rows - 1
        lines.append(f"{index},{'abc' if last else index},{'7' if last else 'true'},")
    write(tmp_path, "data.csv", "\n".join(lines[:-1] + [lines[-1].replace(f"{rows - 1},", "0.5,", 1)]) + "\n")
    report = validate_dir(tmp_path)

    assert report.ok, report.errors
    first = column(report, "ints_then_float")
    assert (first["type"], first["min"], first["max"]) == ("float", 0, rows - 2)
    assert column(report, "ints_then_text")["type"] == "string"
    assert "min" not in column(report, "ints_then_text")
    assert column(report, "bools_then_int")["type"] == "string"
    all_empty = column(report, "all_empty")
    assert (all_empty["type"], all_empty["nulls"]) == ("string", rows)


def test_distinct_count_stops_at_cap(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "name\n" + "".join(f"n{i}\n" for i in range(common.DISTINCT_CAP + 50)))
    name = column(validate_dir(tmp_path), "name")
    assert (name["distinct"], name["distinct_capped"]) == (common.DISTINCT_CAP, True)


def test_high_cardinality_label_has_no_classes(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "x,target\n" + "".join(f"1,{i}\n" for i in range(common.CLASSES_CAP + 1)))
    report = validate_dir(tmp_path)
    assert report.schema["label_column"] == "target"
    assert report.schema["classes"] == {}
    assert report.schema["label_cardinality"] == "high"


def test_label_column_is_inferred_case_insensitively_or_absent(tmp_path: Path) -> None:
    write(tmp_path, "a/data.csv", "x,Category\n1,red\n2,red\n")
    write(tmp_path, "b/data.csv", "x,z\n1,2\n")
    assert validate_dir(tmp_path / "a").schema["classes"] == {"red": 2}
    assert validate_dir(tmp_path / "a").schema["label_column"] == "Category"
    unlabeled = validate_dir(tmp_path / "b")
    assert (unlabeled.schema["label_column"], unlabeled.schema["classes"]) == (None, {})


def test_preview_holds_the_first_20_rows(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "n\n" + "".join(f"{i}\n" for i in range(50)))
    report = validate_dir(tmp_path)
    assert len(report.preview) == 20
    assert [row["n"] for row in report.preview] == [str(i) for i in range(20)]


def test_bom_crlf_and_quoted_newlines_are_handled(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", b'\xef\xbb\xbfid,text\r\n1,"two\r\nlines"\r\n2,plain\r\n')
    report = validate_dir(tmp_path)
    assert report.ok, report.errors
    assert [col["name"] for col in report.schema["columns"]] == ["id", "text"]
    assert report.preview[0] == {"id": "1", "text": "two\r\nlines"}
    assert report.num_records == 2


def test_tsv_uses_tab_and_delimiter_option_overrides(tmp_path: Path) -> None:
    write(tmp_path, "a/data.tsv", "x\ty\n1\t2\n")
    write(tmp_path, "b/data.csv", "x|y\n1|2\n")
    tsv = validate_dir(tmp_path / "a")
    piped = validate_dir(tmp_path / "b", delimiter="|")
    assert tsv.ok and piped.ok
    assert tsv.schema["delimiter"] == "\t" and piped.schema["delimiter"] == "|"
    assert [col["name"] for col in piped.schema["columns"]] == ["x", "y"]


# --- CSV bad inputs -------------------------------------------------------------------


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", b"")
    report = validate_dir(tmp_path)
    assert not report.ok
    assert report.errors == [{"file": "data.csv", "line": None, "message": "empty file (0 bytes)"}]


def test_header_only_file_reports_no_records(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a,b,c\n")
    report = validate_dir(tmp_path)
    assert not report.ok
    assert report.num_records == 0
    assert report.errors[0]["file"] == "data.csv"
    assert report.errors[0]["message"].startswith("no records")


def test_ragged_row_reports_file_and_line(tmp_path: Path) -> None:
    write(tmp_path, "train.csv", "a,b,c\n1,2,3\n4,5\n6,7,8\n9,10,11,12\n")
    report = validate_dir(tmp_path)
    assert not report.ok
    assert report.errors == [
        {"file": "train.csv", "line": 3, "message": "expected 3 fields, found 2"},
        {"file": "train.csv", "line": 5, "message": "expected 3 fields, found 4"},
    ]
    assert report.num_records == 4  # counting goes on past errors
    assert column(report, "a")["max"] == 6  # bad rows stay out of the statistics


def test_line_numbers_stay_physical_across_quoted_newlines_and_blank_lines(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", 'a,b\n1,"x\ny\nz"\n\n2,3\n4\n')
    report = validate_dir(tmp_path)
    # Header 1, the quoted record 2-4, blank 5, "2,3" 6, "4" 7.
    assert report.errors == [{"file": "data.csv", "line": 7, "message": "expected 2 fields, found 1"}]
    assert report.num_records == 3


@pytest.mark.parametrize(("header", "delimiter"), [("a;b;c", ";"), ("a\tb\tc", "\\t"), ("a|b|c", "|")])
def test_wrong_delimiter_is_detected_from_the_header(tmp_path: Path, header: str, delimiter: str) -> None:
    row = header.replace("a", "1").replace("b", "2").replace("c", "3")
    write(tmp_path, "data.csv", f"{header}\n{row}\n")
    report = validate_dir(tmp_path)
    assert not report.ok
    assert report.errors[0] == {
        "file": "data.csv", "line": 1,
        "message": f"found 1 column; the header looks '{delimiter}'-delimited — set delimiter to '{delimiter}'",
    }


def test_non_utf8_byte_reports_exact_line_and_byte(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", b"a,b\n1,ok\n2,caf\xff\n3,fine\n")
    report = validate_dir(tmp_path)
    assert not report.ok
    assert report.errors == [{"file": "data.csv", "line": 3,
                              "message": "not valid UTF-8 at byte 6 of the line (0xff)"}]
    assert report.num_records == 3


def test_non_utf8_far_into_a_large_file_keeps_the_exact_line(tmp_path: Path) -> None:
    # Past the first read chunk, so the line count carries across chunks.
    rows = 200_000
    body = "".join(f"{i},xxxxxxxxxx\n" for i in range(rows)).encode()
    assert len(body) > common.CHUNK_BYTES * 2
    write(tmp_path, "data.csv", b"a,b\n" + body + b"last,\xc3\x28\n")
    report = validate_dir(tmp_path)
    assert report.errors == [{"file": "data.csv", "line": rows + 2,
                              "message": "not valid UTF-8 at byte 6 of the line (0xc3)"}]
    assert report.num_records == rows + 1


def test_missing_label_column_names_the_existing_columns(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "x,y\n1,2\n")
    report = validate_dir(tmp_path, label_column="target")
    assert not report.ok
    assert report.errors == [{"file": "data.csv", "line": 1,
                              "message": "label column 'target' not found; the columns are: x, y"}]


def test_missing_text_column_is_an_error_and_a_present_one_is_recorded(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "review,label\ngood,1\n")
    assert "text column 'body' not found" in messages(validate_dir(tmp_path, text_column="body"))[0]
    assert validate_dir(tmp_path, text_column="review").schema["text_column"] == "review"


def test_different_headers_across_channels_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "train.csv", "a,b,label\n1,2,x\n")
    write(tmp_path, "validation.csv", "a,c,label\n1,2,x\n")
    report = validate_dir(tmp_path)
    assert not report.ok
    assert report.errors == [{"file": "validation.csv", "line": 1,
                              "message": "columns differ from train.csv: missing 'b'; unexpected 'c'"}]
    assert report.channel_counts == {"train": 1, "validation": 1}


def test_duplicate_column_names_are_an_error(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a,a,b\n1,2,3\n")
    assert messages(validate_dir(tmp_path)) == ["duplicate column names: 'a'"]


def test_unparseable_row_is_reported_and_counting_continues(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a,b\n1,2\nx\ry,3\n4,5\n")
    report = validate_dir(tmp_path)
    assert [(error["line"], error["message"].split(":")[0]) for error in report.errors] == [
        (3, "cannot parse the row")]
    assert report.num_records == 3
    assert column(report, "a")["max"] == 4


def test_overlong_line_stops_reading_with_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(common, "CHUNK_BYTES", 256)
    write(tmp_path, "data.csv", "a\n1\n" + "x" * 5000 + "\n2\n")
    report = validate_dir(tmp_path)
    assert report.errors[0]["line"] == 3
    assert "longer than" in report.errors[0]["message"]
    # The hash still covers the whole file.
    assert report.files[0]["sha256"] == hashlib.sha256((tmp_path / "data.csv").read_bytes()).hexdigest()


def test_errors_are_capped_at_100_with_a_count_of_the_rest(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a,b\n" + "1\n" * 250)
    report = validate_dir(tmp_path)
    assert len(report.errors) == 101
    assert report.errors[99]["line"] == 101
    assert report.errors[100] == {"file": "", "line": None, "message": "150 more errors not shown"}
    assert report.num_records == 250


# --- formats, channels and splits ------------------------------------------------


@pytest.mark.parametrize(("paths", "expected"), [
    (["a.csv", "b.TSV"], "csv"),
    (["a.jsonl", "b.ndjson"], "jsonl"),
    (["cat/1.png", "dog/2.JPG", "dog/3.jpeg"], "image_folder"),
    (["book.txt"], "text"),
    (["a.csv", "b.jsonl"], None),
    (["a.parquet"], None),
    (["1.png", "2.png"], None),
    ([], None),
])
def test_infer_format_by_extension(paths: list[str], expected: str | None) -> None:
    assert infer_format(paths) == expected


def test_mixed_formats_report_a_clear_error(tmp_path: Path) -> None:
    write(tmp_path, "a.csv", "x\n1\n")
    write(tmp_path, "b.jsonl", '{"x": 1}\n')
    report = validate_dir(tmp_path)
    assert not report.ok
    assert report.format == ""
    assert "cannot tell the format" in messages(report)[0] and ".jsonl" in messages(report)[0]


def test_file_channels_come_from_names_and_top_folders() -> None:
    files = [DataFile(path, path, 1) for path in (
        "train.csv", "valid.csv", "val.part1.csv", "test.jsonl", "validation/cat/1.png",
        "test/dog/2.png", "cat/test.png", "other.csv", "data/train.csv")]
    files.append(DataFile("kept.csv", "kept.csv", 1, channel="test"))
    assert [f.channel for f in assign_file_channels(files)] == [
        "train", "validation", "validation", "test", "validation", "test", "", "", "train", "test"]


def test_channel_counts_come_from_channel_files(tmp_path: Path) -> None:
    write(tmp_path, "train.csv", "a\n1\n2\n3\n")
    write(tmp_path, "val.csv", "a\n1\n")
    write(tmp_path, "test.csv", "a\n1\n2\n")
    report = validate_dir(tmp_path)
    assert report.ok, report.errors
    assert report.channel_counts == {"train": 3, "validation": 1, "test": 2}
    assert [(row["path"], row["channel"]) for row in report.files] == [
        ("train.csv", "train"), ("val.csv", "validation"), ("test.csv", "test")]


def test_seeded_split_is_deterministic_and_close_to_ratios() -> None:
    split = parse_split({"train": 0.7, "validation": 0.2, "test": 0.1, "seed": 42})
    first = [assign_channel(index, split) for index in range(20_000)]
    assert first == [assign_channel(index, split) for index in range(20_000)]
    counts = Counter(first)
    assert abs(counts["train"] / 20_000 - 0.7) < 0.02
    assert abs(counts["validation"] / 20_000 - 0.2) < 0.02
    assert abs(counts["test"] / 20_000 - 0.1) < 0.02
    other_seed = [assign_channel(index, {**split, "seed": 43}) for index in range(20_000)]
    assert other_seed != first


def test_split_channel_counts_match_a_replay_of_assign_channel(tmp_path: Path) -> None:
    write(tmp_path, "a.csv", "n\n" + "".join(f"{i}\n" for i in range(600)))
    write(tmp_path, "b.csv", "n\n" + "".join(f"{i}\n" for i in range(400)))
    split = {"train": 0.8, "validation": 0.1, "test": 0.1, "seed": 7}
    report = validate_dir(tmp_path, split=split)
    assert report.ok, report.errors
    replay = Counter(assign_channel(index, parse_split(split)) for index in range(1000))
    assert report.channel_counts == dict(replay)
    assert {row["channel"] for row in report.files} == {""}


def test_rounding_gap_in_ratios_never_reaches_a_zero_ratio_channel(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard import records

    split = parse_split({"train": 0.9999999, "validation": 0.0, "test": 0.0})
    monkeypatch.setattr(records, "unit_interval", lambda seed, index: 0.99999995)
    assert assign_channel(0, split) == "train"
    assert records.count_channels(0, 3, split) == {"train": 3}


@pytest.mark.parametrize(("raw", "message"), [
    ({"train": 0.5, "validation": 0.4}, "add up to 1"),
    ({"train": 1.2, "test": -0.2}, "between 0 and 1"),
    ({"train": 0.5, "dev": 0.5}, "unknown keys dev"),
    ({"train": "0.8", "test": 0.2}, "must be a number"),
    ({"train": 1.0, "seed": 1.5}, "seed must be an integer"),
    ({"train": True}, "must be a number"),
])
def test_parse_split_rejects_bad_splits(raw: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_split(raw)


def test_bad_split_becomes_an_error_entry_not_an_exception(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a\n1\n")
    report = validate_dir(tmp_path, split={"train": 0.5})
    assert not report.ok
    assert "add up to 1" in messages(report)[0]
    assert report.channel_counts == {"train": 1}


# --- hashing, progress, streaming and storage failures ----------------------------------


def test_content_hash_is_equal_for_identical_content_and_changes_with_one_byte(tmp_path: Path) -> None:
    write(tmp_path, "one/data.csv", "a,b\n1,2\n")
    write(tmp_path, "two/data.csv", "a,b\n1,2\n")
    write(tmp_path, "three/data.csv", "a,b\n1,3\n")
    first, second, changed = (validate_dir(tmp_path / name) for name in ("one", "two", "three"))
    assert first.content_hash == second.content_hash
    assert first.content_hash != changed.content_hash
    data = (tmp_path / "one/data.csv").read_bytes()
    assert first.content_hash == combine_content_hash([("data.csv", len(data), hashlib.sha256(data).hexdigest())])


def test_progress_callback_reports_growing_fractions_ending_at_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.validation as validation

    monkeypatch.setattr(validation, "PROGRESS_EVERY_SECONDS", 0.0)
    write(tmp_path, "data.csv", "a\n" + "12345\n" * 500_000)  # ~3 MiB: several chunks
    seen: list[float] = []
    validate_dir(tmp_path, progress=seen.append)
    assert seen[0] == 0.0 and seen[-1] == 1.0
    assert len(seen) >= 4
    assert seen == sorted(seen)
    assert any(0.0 < fraction < 1.0 for fraction in seen)


class SequentialOnlyStream:
    """A stream like botocore's StreamingBody: read(n) and close(), no seek."""

    largest_read = 0

    def __init__(self, path: str) -> None:
        self._inner = open(path, "rb")  # noqa: SIM115

    def read(self, size: int) -> bytes:
        assert size is not None and size > 0, "read() without a size loads the whole file"
        SequentialOnlyStream.largest_read = max(SequentialOnlyStream.largest_read, size)
        return self._inner.read(size)

    def close(self) -> None:
        self._inner.close()


def test_files_are_read_sequentially_in_bounded_chunks(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a,b\n" + "1,2\n" * 400_000)
    report = validate_files(data_files(tmp_path), format=None, open_read=SequentialOnlyStream)
    assert report.ok, report.errors
    assert 0 < SequentialOnlyStream.largest_read <= common.CHUNK_BYTES


class StorageError(Exception):
    """Stands in for datasets.storage.StorageError, which is matched by class name."""


def test_storage_error_from_open_read_becomes_an_error_entry(tmp_path: Path) -> None:
    write(tmp_path, "train.csv", "a\n1\n")
    files = [*data_files(tmp_path), DataFile("test.csv", "s3://bucket/missing.csv", 10)]

    def open_read(uri: str) -> io.BufferedReader:
        if uri.startswith("s3://"):
            raise StorageError(f"{uri} does not exist")
        return open_local(uri)

    report = validate_files(files, format="csv", open_read=open_read)
    assert not report.ok
    assert report.errors == [{"file": "test.csv", "line": None,
                              "message": "could not read the file: s3://bucket/missing.csv does not exist"}]
    assert report.channel_counts == {"train": 1}


def test_io_error_mid_stream_becomes_an_error_entry(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a\n" + "1\n" * 1_000_000)

    class FailingStream(SequentialOnlyStream):
        calls = 0

        def read(self, size: int) -> bytes:
            FailingStream.calls += 1
            if FailingStream.calls == 2:
                raise ConnectionResetError("connection reset by peer")
            return super().read(size)

    report = validate_files(data_files(tmp_path), format="csv", open_read=FailingStream)
    assert not report.ok
    assert report.errors == [{"file": "data.csv", "line": None,
                              "message": "could not read the file: connection reset by peer"}]
    assert report.files[0]["sha256"] == ""


def test_programming_errors_are_not_swallowed(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a\n1\n")

    def broken_open_read(uri: str) -> io.BufferedReader:
        raise TypeError("bug")

    with pytest.raises(TypeError):
        validate_files(data_files(tmp_path), format="csv", open_read=broken_open_read)


def test_size_different_from_the_listing_is_reported(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "a\n1\n")
    files = data_files(tmp_path)
    files[0].size += 5
    report = validate_files(files, format="csv", open_read=open_local)
    assert not report.ok
    assert "did it change during validation" in messages(report)[0]


def test_no_files_and_unknown_format_are_errors() -> None:
    assert messages(validate_files([], format=None, open_read=open_local))[0].startswith("no files")
    report = validate_files([DataFile("a.csv", "a.csv", 1)], format="parquet", open_read=open_local)
    assert not report.ok and "unknown format 'parquet'" in messages(report)[0]


def test_huge_integers_do_not_break_the_statistics(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", "n\n" + "9" * 400 + "\n1.5\n")
    report = validate_dir(tmp_path)
    assert report.ok, report.errors
    assert column(report, "n")["type"] == "float"
    assert column(report, "n")["mean"] is None


def test_bom_split_across_tiny_reads_is_still_removed(tmp_path: Path) -> None:
    write(tmp_path, "data.csv", b"\xef\xbb\xbfa,b\n1,2\n")

    class TinyReads(SequentialOnlyStream):
        def read(self, size: int) -> bytes:
            return super().read(min(size, 2))

    report = validate_files(data_files(tmp_path), format="csv", open_read=TinyReads)
    assert report.ok, report.errors
    assert [col["name"] for col in report.schema["columns"]] == ["a", "b"]
