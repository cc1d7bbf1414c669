"""Image-folder validation: classes from folders, real PNG/JPEG decoding, channels."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from datasets.validation import DataFile, ValidationReport, validate_files


def image_bytes(kind: str = "PNG", size: tuple[int, int] = (8, 6), mode: str = "RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color=0).save(buffer, format=kind)
    return buffer.getvalue()


def validate_images(root: Path, files: dict[str, bytes], **options: object) -> ValidationReport:
    entries = []
    for relative, content in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        entries.append(DataFile(path=relative, uri=str(target), size=len(content)))
    options.setdefault("format", None)
    return validate_files(entries, open_read=lambda uri: open(uri, "rb"), **options)  # type: ignore[arg-type]


def test_image_folder_reports_classes_sizes_modes_and_a_round_robin_preview(tmp_path: Path) -> None:
    files = {f"cat/{i:03}.png": image_bytes("PNG", (10 + i, 20)) for i in range(15)}
    files.update({f"dog/{i:03}.jpg": image_bytes("JPEG", (30, 5 + i), "L") for i in range(15)})
    report = validate_images(tmp_path, files)

    assert report.ok, report.errors
    assert report.format == "image_folder"
    assert report.num_records == 30
    assert report.schema["classes"] == {"cat": 15, "dog": 15}
    assert report.schema["image_sizes"] == {"min_width": 10, "max_width": 30, "min_height": 5, "max_height": 20}
    assert report.schema["modes"] == {"RGB": 15, "L": 15}
    assert len(report.preview) == 20
    assert [row["label"] for row in report.preview[:4]] == ["cat", "dog", "cat", "dog"]
    assert report.preview[0] == {"path": "cat/000.png", "label": "cat", "width": 10, "height": 20, "channel": "train"}
    assert report.channel_counts == {"train": 30}


def test_channel_top_folders_set_each_images_channel(tmp_path: Path) -> None:
    report = validate_images(tmp_path, {
        "train/cat/1.png": image_bytes(), "train/dog/2.png": image_bytes(), "train/dog/3.png": image_bytes(),
        "validation/cat/4.png": image_bytes(), "test/dog/5.jpeg": image_bytes("JPEG"),
    })
    assert report.ok, report.errors
    assert report.schema["classes"] == {"cat": 2, "dog": 3}
    assert report.channel_counts == {"train": 3, "validation": 1, "test": 1}
    assert {row["path"]: row["channel"] for row in report.preview}["validation/cat/4.png"] == "validation"


def test_file_that_is_not_a_valid_image_is_an_error(tmp_path: Path) -> None:
    good = image_bytes()
    report = validate_images(tmp_path, {"cat/good.png": good, "cat/noise.png": b"not an image at all",
                                        "dog/truncated.png": good[: len(good) // 2],
                                        "dog/fine.jpg": image_bytes("JPEG")})
    assert not report.ok
    bad = {error["file"]: error["message"] for error in report.errors}
    assert set(bad) == {"cat/noise.png", "dog/truncated.png"}
    assert all(message.startswith("not a valid PNG or JPEG image") for message in bad.values())
    assert report.num_records == 2


def test_image_folder_without_class_subfolders_is_rejected(tmp_path: Path) -> None:
    files = {"1.png": image_bytes(), "2.png": image_bytes()}
    inferred = validate_images(tmp_path / "a", files)
    chosen = validate_images(tmp_path / "b", files, format="image_folder")
    assert not inferred.ok and not chosen.ok
    assert inferred.errors[0]["message"].startswith("no class subfolders")
    assert chosen.errors[0] == {"file": "1.png", "line": None,
                                "message": "not inside a class folder: put each image in a folder named after "
                                           "its class, like cat/001.png (or train/cat/001.png)"}
    assert chosen.errors[-1]["message"].startswith("no class subfolders")


def test_non_image_file_in_an_image_folder_is_an_error(tmp_path: Path) -> None:
    report = validate_images(tmp_path, {"cat/1.png": image_bytes(), "cat/notes.txt": b"hello"},
                             format="image_folder")
    assert report.errors == [{"file": "cat/notes.txt", "line": None,
                              "message": "not an image: an image folder holds only .png, .jpg and .jpeg files"}]


def test_class_only_in_validation_is_a_schema_error(tmp_path: Path) -> None:
    report = validate_images(tmp_path, {"train/cat/1.png": image_bytes(), "validation/cat/2.png": image_bytes(),
                                        "validation/bird/3.png": image_bytes()})
    assert not report.ok
    assert report.errors == [{"file": "", "line": None, "message": "class 'bird' is in validation but not in train"}]


def test_images_split_by_seed_when_there_are_no_channel_folders(tmp_path: Path) -> None:
    files = {f"{label}/{i}.png": image_bytes() for label in ("a", "b") for i in range(20)}
    report = validate_images(tmp_path, files, split={"train": 0.5, "validation": 0.5, "seed": 3})
    assert report.ok, report.errors
    assert sum(report.channel_counts.values()) == 40
    assert set(report.channel_counts) == {"train", "validation"}
    assert {row["channel"] for row in report.preview} == {"train", "validation"}


def test_truncated_jpeg_and_huge_canvas_are_rejected(tmp_path: Path) -> None:
    jpeg = image_bytes("JPEG", (64, 64))
    huge = image_bytes("PNG", (6000, 5000), "1")  # 30 MP, a few KB on disk
    report = validate_images(tmp_path, {"cat/cut.jpg": jpeg[: len(jpeg) - 200], "cat/huge.png": huge,
                                        "dog/ok.jpg": jpeg})
    bad = {error["file"]: error["message"] for error in report.errors}
    assert bad["cat/cut.jpg"].startswith("not a valid PNG or JPEG image")
    assert bad["cat/huge.png"] == "image is 6000×5000 pixels; the limit is 25,000,000 pixels"
    assert report.num_records == 1
