"""Plain-text validation for character language models."""

from __future__ import annotations

from pathlib import Path

from datasets.validation import DataFile, ValidationReport, validate_files


def validate_text(root: Path, files: dict[str, str | bytes], **options: object) -> ValidationReport:
    entries = []
    for relative, content in files.items():
        target = root / relative
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        entries.append(DataFile(path=relative, uri=str(target), size=target.stat().st_size))
    options.setdefault("format", None)
    return validate_files(entries, open_read=lambda uri: open(uri, "rb"), **options)  # type: ignore[arg-type]


def test_text_records_are_non_empty_lines_with_character_statistics(tmp_path: Path) -> None:
    report = validate_text(tmp_path, {"book.txt": "ab\n\nba c\r\n"})
    assert report.ok, report.errors
    assert report.format == "text"
    assert report.num_records == 2
    # CRLF counts as one newline: "ab\n\nba c\n" is 9 characters.
    assert report.schema == {"columns": [], "label_column": None, "classes": {}, "characters": 9,
                             "vocabulary_size": 5, "lines": 3, "vocabulary": "\n abc"}
    assert report.preview == [{"path": "book.txt", "line": 1, "text": "ab"},
                              {"path": "book.txt", "line": 3, "text": "ba c"}]


def test_text_preview_is_20_lines_truncated_to_500_characters(tmp_path: Path) -> None:
    report = validate_text(tmp_path, {"book.txt": "".join("x" * 600 + "\n" for _ in range(30))})
    assert report.num_records == 30
    assert len(report.preview) == 20
    assert len(report.preview[0]["text"]) == 501  # 500 characters and an ellipsis


def test_blank_text_file_has_no_records(tmp_path: Path) -> None:
    report = validate_text(tmp_path, {"book.txt": "\n\n\n"})
    assert not report.ok
    assert report.errors == [{"file": "book.txt", "line": None,
                              "message": "no records: the file has only blank lines"}]


def test_non_utf8_text_reports_line_and_byte(tmp_path: Path) -> None:
    report = validate_text(tmp_path, {"book.txt": b"fine\nalso fine\n\x80bad\n"})
    assert report.errors == [{"file": "book.txt", "line": 3,
                              "message": "not valid UTF-8 at byte 1 of the line (0x80)"}]


def test_text_channels_come_from_file_names_or_the_split(tmp_path: Path) -> None:
    by_files = validate_text(tmp_path, {"train.txt": "a\nb\nc\n", "validation.txt": "d\n"})
    assert by_files.channel_counts == {"train": 3, "validation": 1}
    (tmp_path / "train.txt").unlink()
    (tmp_path / "validation.txt").unlink()
    by_split = validate_text(tmp_path, {"corpus.txt": "".join(f"{i}\n" for i in range(1000))},
                             split={"train": 0.5, "test": 0.5, "seed": 1})
    assert set(by_split.channel_counts) == {"train", "test"}
    assert sum(by_split.channel_counts.values()) == 1000
    assert 400 < by_split.channel_counts["train"] < 600
