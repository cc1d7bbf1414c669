"""A real browser (Debian chromium through Playwright) against the live server and a real
Celery worker: sign in, upload through the upload page, watch validation finish without
reloading, and read the line error of a broken file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.conftest import PASSWORD, SCREENSHOTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def flowers_csv() -> bytes:
    rows = ["petal_length,petal_width,sepal_length,species"]
    species = ("setosa", "versicolor", "virginica")
    for index in range(45):
        kind = index % 3
        rows.append(f"{1.4 + kind * 2 + (index % 5) * 0.1:.1f},{0.2 + kind * 0.8:.1f},{5.0 + kind * 0.6:.1f},{species[kind]}")
    return ("\n".join(rows) + "\n").encode()


RAGGED_CSV = b"a,b,label\n1,2,x\n3,4,y\n5,z\n6,7,x\n"


def sign_in(page, base_url: str) -> None:
    page.goto(base_url + "/")
    assert "/login/" in page.url  # every page asks for a login first
    page.fill("#id_username", "sam")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")
    page.get_by_role("heading", name="Overview").wait_for()


def upload_csv(page, base_url: str, name: str, content: bytes, file_name: str, label_column: str = "") -> None:
    page.goto(base_url + "/datasets/new/")
    page.fill("#id_name", name)
    if label_column:
        page.fill("#id_label_column", label_column)
    page.set_input_files("#id_files", files=[{"name": file_name, "mimeType": "text/csv", "buffer": content}])
    page.click("#upload-submit")
    page.wait_for_url(re.compile(r"/datasets/\d+/\?version=1$"))


def wait_for_status(page, status: str, timeout_ms: int = 60_000) -> None:
    # No page.reload() anywhere: the status area polls and refreshes the page by itself.
    page.locator(f'#version-status [data-status="{status}"]').wait_for(timeout=timeout_ms)


def test_upload_watch_validation_and_read_errors(live_server, celery_worker, scientist, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)

    upload_csv(page, base, "flowers", flowers_csv(), "flowers.csv", label_column="species")
    wait_for_status(page, "ready")
    page.locator("#schema-table").wait_for()
    schema = page.locator("#schema-table").inner_text()
    assert "petal_length" in schema and "float" in schema
    preview = page.locator("#preview-table")
    assert preview.locator("tbody tr").count() == 20  # the first 20 records
    assert "setosa" in preview.inner_text()
    page.locator("#class-chart .main-svg").first.wait_for()  # plotly drew the class chart
    assert "45" in page.locator(".facts").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-dataset-ready.png"), full_page=True)

    upload_csv(page, base, "ragged", RAGGED_CSV, "ragged.csv")
    wait_for_status(page, "invalid")
    errors = page.locator("#errors-table")
    errors.wait_for()
    assert "line 4: expected 3 fields, found 2" in errors.text_content()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-dataset-invalid.png"), full_page=True)

    page.goto(base + "/datasets/")
    table = page.locator("#datasets-table")
    assert table.locator("tbody tr").count() == 2
    page.fill("input[data-filter-for=datasets-table]", "ragg")
    assert table.locator("tbody tr:visible").count() == 1
    page.fill("input[data-filter-for=datasets-table]", "")
    page.screenshot(path=str(SCREENSHOTS / "trainyard-datasets.png"), full_page=True)

    page.goto(base + "/")
    assert "flowers" in page.locator("main").inner_text()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-overview.png"), full_page=True)

    page.goto(base + "/datasets/new/")
    page.screenshot(path=str(SCREENSHOTS / "trainyard-upload.png"), full_page=True)
    assert not page.console_errors, page.console_errors


def test_upload_page_shows_api_field_errors_inline(live_server, scientist, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(base + "/datasets/new/")
    page.get_by_text("S3 or server path").click()
    page.fill("#id_name", "from-s3")
    page.fill("#id_source_uri", "/not/a/uri")
    page.click("#upload-submit")
    field_error = page.locator('.field[data-field="source_uri"] .field-error')
    field_error.wait_for()
    assert "file:///not/a/uri" in field_error.inner_text()  # the API's advice, next to the field
    assert page.locator("#form-error").is_visible()
    assert "/datasets/new/" in page.url


def write_image_folder(root: Path) -> Path:
    from PIL import Image

    folder = root / "pets"
    for label, colour in (("cat", (210, 120, 40)), ("dog", (60, 90, 200))):
        (folder / label).mkdir(parents=True)
        for index in range(3):
            Image.new("RGB", (24, 24), tuple(min(255, c + index * 15) for c in colour)).save(folder / label / f"{index}.png")
    (folder / ".DS_Store").write_bytes(b"finder litter")  # a folder picker returns these too
    return folder


def test_folder_upload_shows_image_thumbnails(live_server, celery_worker, scientist, browser_page, tmp_path):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(base + "/datasets/new/")
    page.get_by_text("A folder", exact=True).click()
    page.set_input_files("#id_folder", write_image_folder(tmp_path))
    assert "6 files" in page.locator("#folder-summary").inner_text()
    assert "1 hidden file left out" in page.locator("#folder-summary").inner_text()
    assert page.input_value("#id_name") == "pets"
    page.click("#upload-submit")
    page.wait_for_url(re.compile(r"/datasets/\d+/\?version=1$"))
    wait_for_status(page, "ready")
    thumbs = page.locator("#preview-table img.thumb")
    assert thumbs.count() == 6
    thumbs.first.wait_for()
    page.wait_for_function("() => [...document.querySelectorAll('img.thumb')].every(img => img.complete && img.naturalWidth > 0)")
    files = page.locator("#files-table").inner_text()
    assert "cat/0.png" in files and "pets/" not in files  # the picked folder is the version's root
    page.screenshot(path=str(SCREENSHOTS / "trainyard-dataset-images.png"), full_page=True)


def test_upload_over_the_size_limit_says_so(live_server, scientist, browser_page, settings):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(base + "/datasets/new/")
    # Lowered after the page loaded, so the browser's own pre-check passes and the server answers 413.
    settings.STUDIO_MAX_UPLOAD_BYTES = 100
    page.fill("#id_name", "too-big")
    page.set_input_files("#id_files", files=[{"name": "big.csv", "mimeType": "text/csv", "buffer": flowers_csv()}])
    page.click("#upload-submit")
    top = page.locator("#form-error")
    top.wait_for()
    assert "exceeds the limit of 100 bytes" in top.inner_text()
    assert "Upload too large." in page.locator('.field[data-field="file"] .field-error').inner_text()
    assert page.locator("#upload-submit").is_enabled()  # the form is usable again
