"""The pieces the job and tuning forms share (static/js/api_form.js) in a real browser
(Debian chromium through Playwright) against the live server: channel rows a script names
itself, added and removed; metric and range rows added and removed; the form's own checks
placed beside their fields; and an API error nested three levels deep
(base_job.stopping.max_runtime_seconds) placed beside the one input it is about."""

from __future__ import annotations

import pytest

from jobs.models import TrainingJob
from tests.e2e.test_job_pages import ready_version, sign_in  # noqa: F401 - fixtures
from tuning.models import TuningJob

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_job_form_channel_and_metric_rows_and_its_own_checks(live_server, scientist, ready_version,  # noqa: F811
                                                            browser_page):
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + "/jobs/new/")
    page.get_by_text("Custom script", exact=True).click()
    rows = page.locator("#channel-fields .channel-row")
    assert rows.count() == 1 and page.input_value(".channel-row .channel-name") == "train"
    assert page.input_value("#channel-0") == str(ready_version.pk)  # the only dataset, preselected

    page.click("#add-channel")
    assert rows.count() == 2
    extra = rows.nth(1)
    extra.locator(".channel-version").select_option(str(ready_version.pk))
    extra.locator(".channel-name").fill("extra")
    assert extra.get_attribute("data-field") == "inputs.extra"
    extra.locator("button", has_text="Remove").click()
    assert rows.count() == 1

    # A chosen version in a row without a name, a line that is not name=value and no script:
    # the form says so beside each field, without asking the API.
    page.click("#add-channel")
    rows.nth(1).locator(".channel-version").select_option(str(ready_version.pk))
    page.fill("#id_script_hyperparameters", "epochs=5\nnot a pair")
    page.click("#add-metric")
    assert page.locator("#metric-rows .pair-row").count() == 2
    page.locator("#metric-rows .pair-row").nth(1).locator("button").click()
    assert page.locator("#metric-rows .pair-row").count() == 1
    page.click("#job-submit")
    unnamed = rows.nth(1).locator(".field-error")
    unnamed.wait_for()
    assert "Give the channel a name" in unnamed.inner_text()
    assert "Line 2 is not name=value." in page.locator("#script-hyperparameters .field-error").inner_text()
    assert "Choose a .py file" in page.locator('.field[data-field="script.uri"] .field-error').inner_text()
    assert page.locator("#form-error").inner_text().startswith("Fix the 3 highlighted fields")
    assert not TrainingJob.objects.exists()
    assert not page.console_errors, page.console_errors


def test_tuning_form_range_rows_and_a_nested_api_error(live_server, scientist, ready_version,  # noqa: F811
                                                       browser_page):
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + "/tuning/new/")
    page.select_option("#id_algorithm", "tabular-classifier")
    page.fill("#id_name", "nested-errors")
    first = page.locator(".range-row").first
    first.locator(".range-name").fill("learning_rate")
    first.locator(".range-name").dispatch_event("change")
    assert first.locator(".range-min").input_value() != ""  # the schema's bounds came with the name
    assert page.locator("#hp-learning_rate").is_disabled()  # searched, so not fixed

    page.click("#add-range")
    units = page.locator(".range-row").nth(1)
    units.locator(".range-name").fill("hidden_units")
    units.locator(".range-name").dispatch_event("change")
    assert units.locator(".range-type").input_value() == "integer"
    assert page.locator("#hp-hidden_units").is_disabled()
    units.locator("button", has_text="Remove").click()
    assert page.locator(".range-row").count() == 1
    assert page.locator("#hp-hidden_units").is_enabled()  # no longer searched: fixed again

    assert page.input_value("#channel-0") == str(ready_version.pk)
    page.fill("#id_trial_max_runtime_seconds", "0")  # below the API's minimum, three levels down
    page.click("#tuning-submit")
    runtime = page.locator('.field[data-field="base_job.stopping.max_runtime_seconds"] .field-error')
    runtime.wait_for()
    assert runtime.inner_text().strip()
    assert page.locator('.field.has-error').count() == 1
    assert page.locator("#form-error").inner_text() == "Fix the highlighted field and submit again."
    assert not TuningJob.objects.exists()
    unexpected = [e for e in page.console_errors if "status of 400" not in e]
    assert not unexpected, unexpected
