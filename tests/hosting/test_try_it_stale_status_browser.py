"""Found by using the studio: after a prediction, instances that are not valid JSON
showed the parse error but kept "Answered by version 1." beside Predict, as if the new input had
been answered. A client-side error clears that note too: a failed request clears the previous result."""

from __future__ import annotations

import pytest

from hosting import actions
from tests.hosting.test_try_it_browser import browser_page, sign_in  # noqa: F401 - fixture

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_invalid_json_after_an_answer_clears_the_answered_note(transactional_db, live_server, owner, demo_job,
                                                               browser_page):  # noqa: F811
    version = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    actions.create_endpoint(project=demo_job.project, name="biomes-live", model_version=version, user=owner)
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/models/endpoints/biomes-live/")
    page.click("#try-submit")
    page.locator("#predictions-table tbody tr").first.wait_for()
    assert page.inner_text("#try-status") == "Answered by version 1."

    page.fill("#try-instances", '[{"feature_01": NaN}]')
    page.click("#try-submit")
    page.locator("#try-error").wait_for(state="visible")
    assert "not valid JSON" in page.inner_text("#try-error")
    assert page.inner_text("#try-status") == ""
    assert page.locator("#try-result").is_hidden()
