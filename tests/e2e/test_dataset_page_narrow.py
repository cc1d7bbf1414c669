"""Found by using the studio: at a phone's width (390 px) the dataset page was
632 px wide, because the schema table (7 columns) did not scroll inside its panel as the
other tables do (the review inbox's table was fixed the same way)."""

from __future__ import annotations

import pytest

from studio.models import Project
from tests.datasets.test_pages import make_version
from tests.e2e.test_dataset_upload import flowers_csv, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_dataset_page_fits_a_phone_width(live_server, scientist, browser_page, tmp_path):
    project = Project.objects.get(slug="acme")
    version = make_version(project, scientist, tmp_path, name="flowers", files={"train.csv": flowers_csv()})
    assert version.status == "ready"
    page = browser_page
    sign_in(page, live_server.url)
    page.set_viewport_size({"width": 390, "height": 800})
    page.goto(f"{live_server.url}/datasets/{version.dataset_id}/")
    page.locator("#schema-table").wait_for()

    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.console_errors == []
