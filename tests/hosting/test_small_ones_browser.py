"""Small things of the hosting pages, in chromium: the endpoint-name pattern compiles under the `v` flag
(Chromium's rule for `pattern`), so the browser checks the name again; the model page names
its training data; the favicon loads; two compared jobs get colours far apart in hue and
different dashes."""

from __future__ import annotations

import colorsys

import pytest
from django.utils import timezone

from hosting import actions
from jobs.models import JobStatus, MetricPoint, TrainingJob
from tests.e2e import conftest as browser_fixtures
from tests.hosting.test_try_it_browser import sign_in

browser_page = browser_fixtures.browser_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _hue(colour: str) -> float:
    red, green, blue = (int(colour.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4))
    return colorsys.rgb_to_hsv(red, green, blue)[0] * 360


def test_pattern_names_favicon_and_compare_colours(transactional_db, live_server, owner, demo_job, demo_version,
                                                   browser_page):
    page = browser_page
    version = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/models/{version.model.pk}/")

    name = page.locator("#deploy-name")
    validity = {}
    for value in ("-starts-with-a-dash", "good-name-1", "under_score"):
        name.fill(value)
        validity[value] = name.evaluate("input => input.validity.patternMismatch")
    assert validity == {"-starts-with-a-dash": True, "good-name-1": False, "under_score": True}, validity
    assert not [e for e in page.console_errors if "pattern" in e.lower()], page.console_errors

    assert f"train: {demo_version.dataset.name} v{demo_version.version}" in page.locator("body").inner_text()
    icon = page.evaluate("""async () => { const href = document.querySelector('link[rel="icon"]').href;
                                           const response = await fetch(href); return [href, response.status]; }""")
    assert icon[1] == 200 and icon[0].endswith(".svg"), icon

    now = timezone.now()
    jobs = []
    for index in range(2):
        job = TrainingJob.objects.create(project=demo_job.project, name=f"run-{index}", algorithm="tabular-classifier",
                                         status=JobStatus.COMPLETED, created_by=owner, hyperparameters={"epochs": index + 1},
                                         finished_at=now, final_metrics={"train_loss": 0.1 * (index + 1)})
        MetricPoint.objects.bulk_create([MetricPoint(job=job, name="train_loss", step=step, value=1 / (1 + step + index),
                                                     time=now) for step in range(0, 50, 5)])
        jobs.append(job)
    page.goto(f"{live_server.url}/jobs/compare/?ids={jobs[0].pk}&ids={jobs[1].pk}")
    page.wait_for_function("() => document.getElementById('compare-charts').hasAttribute('data-drawn')")
    lines = page.evaluate("() => document.querySelector('#compare-charts .js-plotly-plot').data.map(t => t.line)")
    assert len(lines) == 2
    apart = abs(_hue(lines[0]["color"]) - _hue(lines[1]["color"]))
    assert min(apart, 360 - apart) >= 90, lines  # blue and teal were 42 degrees apart
    assert lines[0].get("dash", "solid") != lines[1].get("dash", "solid"), lines
    swatches = page.evaluate("""() => [...document.querySelectorAll('.swatch')].slice(0, 2)
                                .map(s => getComputedStyle(s).backgroundColor)""")
    assert swatches[0] != swatches[1]
