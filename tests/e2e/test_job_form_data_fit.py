"""Data that fits the algorithm, in a real browser (Debian chromium through Playwright): the job
form offers, for the chosen algorithm, only the dataset versions it can train on; the
others are listed disabled with the reason, the same sentence the API answers with. A
version in which no label column was found is unusable for a classifier until a label
column is named."""

from __future__ import annotations

import io
import re

import pytest
from PIL import Image

from algorithms import ALGORITHMS
from algorithms.base import DataFacts, data_problem
from tests.e2e.conftest import PASSWORD, SCREENSHOTS
from tests.factories import make_version

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def png(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def versions(project, scientist, tmp_path) -> dict:
    contents = {
        "points": {"train.csv": "x1,x2,label\n" + "".join(f"{i % 13},{i % 11},{'ab'[i % 2]}\n" for i in range(60))},
        "people": {"train.csv": "height,weight,age\n" + "".join(f"{150 + i},{50 + i % 20},{20 + i % 3}\n" for i in range(60))},
        "prose": {"train.txt": "".join(f"The quick brown fox {i} jumps over the lazy dog.\n" for i in range(100))},
        "shapes": {f"{kind}/{i}.png": png(colour) for kind, colour in (("red", (250, 0, 0)), ("blue", (0, 0, 250)))
                   for i in range(3)},
    }
    return {name: make_version(project, tmp_path, files, name=name, user=scientist) for name, files in contents.items()}


def sign_in(page, base: str) -> None:
    page.goto(base + "/login/")
    page.fill("#id_username", "sam")
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(base + "/")


def options_of(page, select: str) -> dict[str, dict]:
    return {row["label"].split(" v")[0]: row for row in page.eval_on_selector_all(
        f"{select} option[value]:not([value=''])",
        "options => options.map(o => ({label: o.textContent, disabled: o.disabled, reason: o.getAttribute('data-unusable')}))")}


def api_reason(algorithm: str, version, **hyperparameters) -> str | None:
    """What submit answers for inputs.train (the API tests check the API says exactly this)."""
    spec = ALGORITHMS[algorithm]
    clean = {**spec.defaults(), "label_column": (version.schema or {}).get("label_column") or "", **hyperparameters}
    return data_problem(spec, "train", DataFacts.of(version), clean)


def test_the_form_marks_the_versions_an_algorithm_cannot_use(live_server, scientist, versions, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)

    page.goto(base + "/jobs/new/")
    page.select_option("#id_algorithm", "tabular-classifier")
    train = options_of(page, "#channel-0")
    assert not train["points"]["disabled"]
    for name in ("people", "prose", "shapes"):
        assert train[name]["disabled"], train[name]  # before the fix: every version offered alike
        assert "unusable" in train[name]["label"]
        assert train[name]["reason"] == api_reason("tabular-classifier", versions[name]), train[name]
    assert "no label column" in train["people"]["label"]
    # The one dataset it can use is chosen for train; the unusable ones are not.
    assert page.input_value("#channel-0") == str(versions["points"].pk)
    page.screenshot(path=str(SCREENSHOTS / "trainyard-job-form-unusable.png"), full_page=True)

    # Naming a label column makes the unlabelled table usable, as the API would accept it.
    page.fill("#hp-label_column", "age")
    train = options_of(page, "#channel-0")
    assert not train["people"]["disabled"] and train["people"]["reason"] is None
    assert api_reason("tabular-classifier", versions["people"], label_column="age") is None
    assert train["points"]["disabled"] and "no column 'age'" in train["points"]["label"]
    page.fill("#hp-label_column", "")

    page.select_option("#id_algorithm", "char-lm")
    train = options_of(page, "#channel-0")
    assert [name for name, row in train.items() if not row["disabled"]] == ["prose"]
    assert train["points"]["reason"] == "points v1 is CSV; char-lm reads plain text."

    page.select_option("#id_algorithm", "image-classifier")
    train = options_of(page, "#channel-0")
    assert [name for name, row in train.items() if not row["disabled"]] == ["shapes"]

    # A script decides for itself what it reads: nothing is marked.
    page.get_by_text("Custom script", exact=True).click()
    train = options_of(page, ".channel-row .channel-version")
    assert not any(row["disabled"] for row in train.values())
    assert not re.search("unusable", " ".join(row["label"] for row in train.values()))
    assert page.console_errors == []


def test_the_version_page_says_no_label_column_was_found(live_server, scientist, versions, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    page.goto(base + f"/datasets/versions/{versions['people'].pk}/")
    notice = page.locator("#no-label-notice")
    notice.wait_for()
    assert "No label column was found" in notice.inner_text()
    page.goto(base + f"/datasets/versions/{versions['points'].pk}/")
    page.get_by_role("heading", name="points").wait_for()
    assert page.locator("#no-label-notice").count() == 0


def test_the_upload_page_says_nothing_changed_or_makes_a_new_version(live_server, scientist, browser_page):
    page = browser_page
    base = live_server.url
    sign_in(page, base)
    content = "petal,colour,species\n" + "".join(f"{i},{'rb'[i % 2]},{'xyz'[i % 3]}\n" for i in range(30))

    def send(label_column: str) -> None:
        page.goto(base + "/datasets/new/")
        page.fill("#id_name", "flowers")
        page.fill("#id_label_column", label_column)
        page.set_input_files("#id_files", files=[{"name": "flowers.csv", "mimeType": "text/csv", "buffer": content.encode()}])
        page.click("#upload-submit")

    send("species")
    page.wait_for_url(re.compile(r"/datasets/\d+/\?version=1$"))
    send("species")
    note = page.locator("#form-unchanged")
    note.wait_for()  # before the fix: it opened v1 again after a flash of "Same content"
    assert "nothing changed" in note.inner_text() and "label column 'species'" in note.inner_text()
    assert "/datasets/new/" in page.url
    assert page.get_by_role("link", name="Open flowers v1").is_visible()
    page.screenshot(path=str(SCREENSHOTS / "trainyard-upload-unchanged.png"), full_page=False)
    send("colour")  # the same file read with another label column: a new version
    page.wait_for_url(re.compile(r"/datasets/\d+/\?version=2$"))
    assert page.console_errors == []
