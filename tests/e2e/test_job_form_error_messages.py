"""The job form's error messages: a hyperparameter's says its field once (not "epochs:
epochs: …"), a tag's names the tag, and the count at the top is of the fields highlighted."""

from __future__ import annotations

from jobs.models import TrainingJob
from tests.e2e.test_job_pages import ready_version, sign_in  # noqa: F401 (a fixture)


def test_a_bad_tag_is_named_and_the_count_is_of_fields(live_server, scientist, ready_version, browser_page):  # noqa: F811
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + "/jobs/new/")
    page.fill("#id_name", "bad-tags")
    long_one, long_two = "a" * 101, "b" * 102
    page.fill("#id_tags", f"ok, {long_one}, {long_two}")  # two bad items of one field
    page.click("#job-submit")
    tags_error = page.locator('.field[data-field="tags"] .field-error')
    tags_error.wait_for()
    text = tags_error.inner_text()
    assert f"tags[1] '{long_one}':" in text and f"tags[2] '{long_two}':" in text, text
    assert page.locator(".field.has-error").count() == 1
    assert page.inner_text("#form-error").startswith("Fix the highlighted field and submit again."), page.inner_text("#form-error")

    page.fill("#id_tags", "ok")
    page.fill("#hp-epochs", "0")
    page.click("#job-submit")
    epochs_error = page.locator('.field[data-field="hyperparameters.epochs"] .field-error')
    epochs_error.wait_for()
    assert "must be ≥ 1, got 0" in epochs_error.inner_text()
    assert "epochs:" not in epochs_error.inner_text() and "epochs: epochs" not in page.inner_text("#form-error")
    assert not TrainingJob.objects.exists()
    errors = [e for e in page.console_errors if "status of 400" not in e]  # type: ignore[attr-defined]
    assert not errors, errors  # the refusals themselves are logged by the browser
