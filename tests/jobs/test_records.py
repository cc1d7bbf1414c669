"""The record contract (trainyard.records) as each of its users sees it: for every channel
of a seeded split, the records validation counted are the records file staging writes and
the records a job reads through trainyard.data, in stream and in file mode alike, and a
seed splits the same way it always did."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from datasets.validation import ValidationReport
from jobs.runner.staging import DataCache, VersionFacts, stage_channel
from tests.factories import validated_version_facts
from trainyard import data, records

SPLIT = {"train": 0.6, "validation": 0.3, "test": 0.1, "seed": 7}
FILES = {
    "csv": {"a.csv": b'text,label\n"multi\nline",1\n\nplain,0\n' + b"".join(b"r%d,%d\n" % (i, i % 2) for i in range(60)),
            "b.csv": b"\xef\xbb\xbftext,label\r\n" + b"".join(b"s%d,1\r\n" % i for i in range(40)) + b"last,0"},
    "jsonl": {"a.jsonl": b"".join(b'{"i": %d}\n' % i for i in range(50)) + b"\n   \n",
              "b.jsonl": b"".join(b'{"i": %d}\r\n' % i for i in range(50, 90)) + b'{"i": 90}'},
    "text": {"a.txt": b"".join(b"line %d\r\n" % i for i in range(70)) + b"\n\r\n \n", "b.txt": b"tail\nno newline"},
}


def _validated(tmp_path: Path, files: dict[str, bytes], fmt: str) -> tuple[VersionFacts, ValidationReport]:
    return validated_version_facts(tmp_path, files, split=SPLIT, fmt=fmt)


def _every_record(files: dict[str, bytes], fmt: str) -> tuple[str | None, list[str]]:
    """(the first CSV header, every record of the files in path order), read by the contract."""
    header, every = None, []
    for path in sorted(files):
        text = records.open_text(io.BytesIO(files[path]))
        for number, record in records.iter_records(text, fmt, records.csv_delimiter(path)):
            if number is None:
                header = header or record
            else:
                every.append(record)
    return header, every


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "text"])
def test_every_channel_gets_the_records_validation_counted_staged_and_streamed_alike(tmp_path, fmt):
    version, report = _validated(tmp_path, FILES[fmt], fmt)
    header, every = _every_record(FILES[fmt], fmt)
    split = records.parse_split(SPLIT)
    by_channel = {channel: [r for index, r in enumerate(every) if records.assign_channel(index, split) == channel]
                  for channel in records.CHANNELS}
    assert report.num_records == len(every)
    assert report.channel_counts == {channel: len(rows) for channel, rows in by_channel.items() if rows}
    assert all(by_channel.values()), "the example sends records to every channel"
    cache = DataCache(tmp_path / "cache")

    for channel in records.CHANNELS:
        stage_channel(channel, "file", version, tmp_path / "file" / channel, cache)
        stage_channel(channel, "stream", version, tmp_path / "stream" / channel, cache)
        expected = ([header] if header else []) + by_channel[channel]

        assert list(data.iter_lines(tmp_path / "stream" / channel)) == expected
        assert list(data.iter_lines(tmp_path / "file" / channel)) == expected
        assert data.read_manifest(tmp_path / "stream" / channel)["channel"] == channel


def test_an_image_folder_split_stages_one_record_per_image_by_its_number(tmp_path):
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (0, 0, 255)).save(buffer, format="PNG")
    files = {f"{label}/{i:02d}.png": buffer.getvalue() for i in range(12) for label in ("cat", "dog")}
    version, report = _validated(tmp_path, files, "image_folder")
    split = records.parse_split(SPLIT)
    cache = DataCache(tmp_path / "cache")

    for channel in records.CHANNELS:
        stage_channel(channel, "file", version, tmp_path / channel, cache)
        staged = sorted(p.relative_to(tmp_path / channel).as_posix() for p in (tmp_path / channel).rglob("*.png"))
        assert staged == [path for index, path in enumerate(sorted(files))
                          if records.assign_channel(index, split) == channel]
        assert len(staged) == report.channel_counts.get(channel, 0)


def test_a_seed_splits_records_exactly_as_it_always_did():
    short = {"train": "r", "validation": "v", "test": "e"}
    split = records.parse_split({"train": 0.7, "validation": 0.2, "test": 0.1, "seed": 42})
    assert "".join(short[records.assign_channel(i, split)] for i in range(60)) == (
        "rrrerrrvrrvrvvrvrrrrvrrvrrrrrervrrrrreervrrerrrrrrrvrrrrrvrr")
    halves = records.parse_split({"train": 0.5, "test": 0.5, "seed": -3})
    assert "".join(short[records.assign_channel(i, halves)] for i in range(1000, 1040)) == (
        "rrerrereerreeereerrreeeeeerrerrreerreere")
    assert records.count_channels(1000, 40, halves) == {"train": 19, "test": 21}


@pytest.mark.parametrize("chunk", ["a\r\nb\n\n\r\nc", "x\n", "\r\n\r\n", " \n\t\nlast\r", "one"])
def test_text_records_are_the_same_lines_read_whole_or_one_by_one(chunk):
    _, lines = records.text_lines(chunk)
    one_by_one = [record for _, record in records.iter_records(io.StringIO(chunk, newline="\n"), "text")]
    assert len([line for line in lines if line]) == len(one_by_one)
    assert all(record.endswith("\n") and record.strip("\r\n") for record in one_by_one)


def test_csv_records_are_rows_verbatim_after_the_header_and_blank_rows_are_none():
    text = io.StringIO('\n a;b\n1;"x\ny"\n\n2;z', newline="\n")
    assert list(records.iter_records(text, "csv", ";")) == [(None, " a;b\n"), (0, '1;"x\ny"\n'), (1, "2;z\n")]
    assert records.csv_delimiter("data/part.TSV") == "\t" and records.csv_delimiter("x.tsv", ";") == ";"


def test_a_files_channel_comes_from_its_top_folder_or_name_never_an_images_name():
    assert [records.channel_of_path(path) for path in ("train.csv", "VAL.jsonl", "test/cat/1.png", "cat/test.png",
                                                       "valid/x.txt", "data.csv")] == [
        "train", "validation", "test", "", "validation", ""]
    assert records.strip_channel_folder("train/cat/1.png") == "cat/1.png"
    assert records.strip_channel_folder("cat/1.png") == "cat/1.png"
