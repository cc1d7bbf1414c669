"""Rules in the new-job form, in a real browser: a rule the API refuses is shown beside the
Rules field with its path (rules[0].parameters.window); a good list starts the job with it."""

from __future__ import annotations

import re

import pytest

from jobs.models import JobRule, TrainingJob
from tests.e2e.test_job_pages import ready_version, sign_in  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_job_form_sends_rules_and_places_their_errors(live_server, scientist, ready_version,  # noqa: F811
                                                          browser_page):
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(live_server.url + "/jobs/new/")
    page.fill("#id_name", "ruled-from-the-form")
    page.locator("details.advanced summary").click()
    page.fill("#id_rules", '[{"type": "custom", "parameters": {"metric": "validation_loss", "threshold": 2, "window": 0}}]')
    page.click("#job-submit")
    error = page.locator('.field[data-field="rules"] .field-error')
    error.wait_for()
    assert "rules[0].parameters.window" in error.inner_text(), error.inner_text()
    assert not TrainingJob.objects.exists()

    page.fill("#id_rules", "[not json")
    page.click("#job-submit")
    page.wait_for_function("document.querySelector('.field[data-field=\"rules\"] .field-error').textContent.includes('Not JSON')")

    page.fill("#id_rules", '[{"type": "stalled", "parameters": {"threshold_seconds": 900}, "actions": ["stop"]}]')
    page.click("#job-submit")
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = TrainingJob.objects.get(name="ruled-from-the-form")
    assert set(JobRule.objects.filter(job=job).values_list("name", flat=True)) == {"stalled", "non_finite"}
    assert page.locator("#rules-panel [data-rule='stalled']").count() == 1
    # The one refusal above is the browser's only complaint (it logs every 4xx it loads).
    assert all("status of 400" in e for e in page.console_errors), page.console_errors
