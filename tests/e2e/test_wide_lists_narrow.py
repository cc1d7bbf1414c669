"""Found by a new user in chromium: the Jobs and Datasets lists made the whole page scroll
sideways (1055 px at a 390 px window, 1307 px at 1280 px with one job), where the other
tables scroll inside their panel; a job named with 200 characters and no space pushed the
job page's buttons 4,000 px to the right."""

from __future__ import annotations

import pytest

from jobs.models import JobStatus
from studio.models import Project
from tests.e2e.test_job_pages import sign_in
from tests.e2e.test_job_rules_page import no_sideways_scroll
from tests.factories import make_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("width", [390, 1280])
def test_the_lists_and_a_long_named_job_fit_the_window(live_server, scientist, browser_page, width):
    project = Project.objects.get(slug="acme")
    job = make_job(project, name="n" * 200, algorithm="tabular-classifier", hyperparameters={"epochs": 1},
                   created_by=scientist, status=JobStatus.COMPLETED)
    page = browser_page
    sign_in(page, live_server.url)
    page.set_viewport_size({"width": width, "height": 900})
    for path in ("/jobs/", "/datasets/", f"/jobs/{job.pk}/"):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("load")
        no_sideways_scroll(page)
    assert page.console_errors == []
