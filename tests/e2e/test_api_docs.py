"""The API docs page (/api/docs/, Swagger UI) in a real browser (Debian chromium): one
group per resource, not one flat "v1" list."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import SCREENSHOTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_the_docs_page_groups_operations_per_resource(browser_page, live_server, transactional_db):
    page = browser_page
    page.goto(live_server.url + "/api/docs/")
    page.locator(".opblock-tag-section").first.wait_for()
    tags = sorted(page.locator(".opblock-tag-section h3.opblock-tag").evaluate_all(
        "nodes => nodes.map(n => n.getAttribute('data-tag'))"))
    for resource in ("jobs", "datasets", "dataset-versions", "models", "endpoints", "tuning-jobs", "flow-definitions",
                     "human-loops", "work-teams", "projects", "tokens", "nodes", "review"):
        assert resource in tags, tags
    assert "v1" not in tags
    # Opening a group shows its operations, each with its documented error responses.
    operation = page.locator("#operations-jobs-v1_jobs_list")
    operation.wait_for()
    operation.locator(".opblock-summary").click()
    responses = page.locator("#operations-jobs-v1_jobs_list .responses-table .response-col_status")
    responses.first.wait_for()
    codes = {text.strip() for text in responses.all_inner_texts()}
    assert {"200", "400", "401", "403", "404"} <= codes, codes
    page.screenshot(path=str(SCREENSHOTS / "trainyard-api-docs.png"), full_page=False)
    assert not page.console_errors, page.console_errors
