"""The endpoint page in a real browser (Debian chromium through Playwright) against the
live server: try-it clears the previous answer when a request fails and re-reads the
invocation counter after each request; the version and review flow are
changed on the page through the same action as PATCH /api/v1/endpoints/<name>/."""

from __future__ import annotations

import json
import re

import pytest

from hosting import actions
from hosting.models import Endpoint, Model
from tests.e2e import conftest as browser_fixtures
from tests.hosting.conftest import make_flow
from tests.hosting.test_try_it_browser import sign_in

browser_page = browser_fixtures.browser_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_try_it_clears_the_old_answer_on_error_and_counts_each_invocation(transactional_db, live_server, owner,
                                                                          demo_job, browser_page):
    from playwright.sync_api import expect

    version = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    actions.create_endpoint(project=demo_job.project, name="biomes-count", model_version=version, user=owner)
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/models/endpoints/biomes-count/")
    counter = page.locator("#endpoint-invocations")
    expect(counter).to_have_text("0")

    page.click("#try-submit")
    page.locator("#predictions-table tbody tr").first.wait_for()
    expect(counter).to_have_text("1")

    # A request the API refuses: its message, and no predictions left over from the last one.
    page.fill("#try-instances", '[{"feature_01": 1}]')
    page.click("#try-submit")
    page.locator("#try-error").wait_for(state="visible")
    expect(page.locator("#try-result")).to_be_hidden()
    assert page.locator("#predictions-table tbody tr").count() == 0
    expect(counter).to_have_text("1")  # a refused request is not an invocation

    # Bad JSON never reaches the server; the result area stays empty too.
    page.fill("#try-instances", "[1, 2,")
    page.click("#try-submit")
    expect(page.locator("#try-error")).to_contain_text("not valid JSON")
    expect(page.locator("#try-result")).to_be_hidden()

    # Two quick successes in a row (the second's count is still pending in the process
    # when the page asks): the counter shows both.
    page.fill("#try-instances", json.dumps([version.input_schema["example"]]))
    page.click("#try-submit")
    expect(page.locator("#try-result")).to_be_visible()
    expect(page.locator("#try-error")).to_be_hidden()
    expect(counter).to_have_text("2")
    page.click("#try-submit")
    expect(counter).to_have_text("3")
    assert Endpoint.objects.get(name="biomes-count").invocations == 3
    assert page.console_errors == [] or all("400" in error for error in page.console_errors)


def test_switch_the_version_attach_and_detach_a_flow_and_register_from_the_job_page(transactional_db, live_server,
                                                                                    owner, demo_job, browser_page):
    from playwright.sync_api import expect

    first = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    second = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    actions.create_endpoint(project=demo_job.project, name="biomes-switch", model_version=second, user=owner)
    flow = make_flow(demo_job.project, owner, confidence_below=1.01, sample_percent=0)  # every prediction
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/models/endpoints/biomes-switch/")
    expect(page.locator(".lede")).to_contain_text("v2 (tabular)")

    page.select_option("#settings-version", "1")
    page.select_option("#settings-flow", str(flow.pk))
    page.click("#settings-save")
    expect(page.locator(".lede")).to_contain_text("v1 (tabular)")
    expect(page.locator(".lede")).to_contain_text("check-uncertain")
    endpoint = Endpoint.objects.get(name="biomes-switch")
    assert (endpoint.model_version_id, endpoint.flow_definition_id) == (first.pk, flow.pk)
    # The page's try-it now runs on what it serves: version 1, and a human loop starts.
    page.click("#try-submit")
    expect(page.locator("#try-status")).to_have_text("Answered by version 1.")
    expect(page.locator("#try-loops")).to_contain_text("1 human loop started")

    page.select_option("#settings-flow", "")
    page.click("#settings-save")
    expect(page.locator(".lede")).not_to_contain_text("check-uncertain")
    assert Endpoint.objects.get(name="biomes-switch").flow_definition_id is None
    page.screenshot(path=str(browser_fixtures.SCREENSHOTS / "trainyard-endpoint-settings.png"), full_page=True)

    page.goto(f"{live_server.url}/jobs/{demo_job.pk}/")
    page.click("#register-model")
    page.wait_for_url(re.compile(r".*/models/\d+/$"))
    model = Model.objects.get(name="demo-tabular")  # named after the job
    assert page.url == f"{live_server.url}/models/{model.pk}/"
    expect(page.locator("#versions-table tbody tr")).to_have_count(1)
    expect(page.locator("body")).to_contain_text("Registered demo-tabular version 1.")
    assert page.console_errors == []
