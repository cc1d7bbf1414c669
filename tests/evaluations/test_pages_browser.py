"""An evaluation's report in a real browser (Debian chromium through Playwright) against the
live server: the confusion matrix, the reliability diagrams and the risk–coverage curve are
drawn, the per-class table sorts, and applying the threshold to a flow shows on the flow's
page as its threshold record."""

from __future__ import annotations

import pytest

from tests.e2e import conftest as browser_fixtures
from tests.hosting.conftest import make_flow
from tests.hosting.test_try_it_browser import sign_in

browser_page = browser_fixtures.browser_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_report_draws_its_charts_sorts_classes_and_applies_the_threshold_to_a_flow(transactional_db, live_server, owner,
                                                                                  project, completed_evaluation,
                                                                                  browser_page):
    from playwright.sync_api import expect

    flow = make_flow(project, owner, confidence_below=0.5, sample_percent=5)
    page = browser_page
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/evaluations/{completed_evaluation.pk}/")

    # plotly has drawn each chart: an svg, and the marks that carry the data.
    for chart in ("confusion-chart", "reliability-before-width", "reliability-after-mass", "roc-chart", "risk-coverage-chart"):
        page.locator(f"#{chart} svg.main-svg").first.wait_for()
    assert page.locator("#confusion-chart .heatmaplayer image, #confusion-chart .hm image").count() >= 1
    assert page.locator("#reliability-after-width .barlayer .point").count() >= 2
    assert page.locator("#risk-coverage-chart .scatterlayer .trace").count() >= 4  # risk, bound, target, markers
    expect(page.locator("#risk-coverage-chart")).to_contain_text("t_risk")

    # The per-class table sorts by a number column, one way and then the other.
    header = page.locator("#per-class-table th", has_text="Support")
    header.click()
    expect(header).to_have_attribute("aria-sort", "ascending")
    values = [float(v) for v in page.locator("#per-class-table tbody td:nth-child(5)").evaluate_all(
        "cells => cells.map(cell => cell.dataset.value)")]
    assert values == sorted(values)
    header.click()
    expect(header).to_have_attribute("aria-sort", "descending")
    values = [float(v) for v in page.locator("#per-class-table tbody td:nth-child(5)").evaluate_all(
        "cells => cells.map(cell => cell.dataset.value)")]
    assert values == sorted(values, reverse=True)

    # Apply t_risk to the flow; the flow's page shows the record of where it came from.
    page.select_option("#activate-flow", str(flow.pk))
    page.click("#activate-submit")
    expect(page.locator(".messages")).to_contain_text(f"Flow {flow.name} now sends items with confidence below")
    threshold = completed_evaluation.proposal["risk"]["threshold"]
    page.goto(f"{live_server.url}/review/flows/{flow.pk}/")
    record = page.locator("#flow-threshold-record")
    expect(record).to_contain_text(f"{threshold:.4f}")
    expect(record.locator(f'a[href="/evaluations/{completed_evaluation.pk}/"]')).to_be_visible()
    flow.refresh_from_db()
    assert flow.activation["confidence_below"] == threshold
    assert page.console_errors == []
