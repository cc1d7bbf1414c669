"""Export and retrain in a real browser (Debian chromium through Playwright): the flow page's
export asks the server what the new version holds and says it in the confirm dialog
("60 rows of animals v1 + 6 reviewed, 2 relabelled"), Retrain's dialog names the job, the
data and the validation set it keeps, and a job measured on fewer than 30 validation
records says so beside its metrics. Screenshots: /tmp/trainyard-retrain-*.png."""

from __future__ import annotations

import re

import pytest

from datasets.models import DatasetVersion
from datasets.validation_run import run_validation
from jobs.models import TrainingJob
from tests.e2e.conftest import SCREENSHOTS
from tests.e2e.test_review_inbox import sign_in_as
from tests.review.conftest import make_flow, reviewers, team  # noqa: F401 - fixtures
from tests.review.test_export_merge import animals, reviewed_animals  # noqa: F401 - fixtures

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def accept_next_dialog(page) -> list[str]:
    """Accept the next confirm dialog, keeping its text."""
    seen: list[str] = []

    def handle(dialog) -> None:
        seen.append(dialog.message)
        dialog.accept()

    page.once("dialog", handle)
    return seen


def test_export_and_retrain_dialogs_say_what_the_new_version_holds_and_the_job_page_flags_a_small_validation_set(
        live_server, owner, reviewed_animals, browser_page):  # noqa: F811
    flow, job, train, _rows, _labels = reviewed_animals
    page = browser_page
    base = live_server.url
    sign_in_as(page, base, "owner", "/")
    page.goto(f"{base}/review/flows/{flow.pk}/")
    assert page.locator('#export-modes input[value="merged"]').is_checked()
    assert "Next version of animals" in page.locator("#export-modes").inner_text()

    # Dismissing the dialog exports nothing.
    dismissed: list[str] = []
    page.once("dialog", lambda dialog: (dismissed.append(dialog.message), dialog.dismiss()))
    page.click("#export-button")
    page.wait_for_function("() => !document.getElementById('export-button').disabled")
    assert dismissed == ["Create animals v2: 60 rows of animals v1 + 6 reviewed, 2 relabelled — 64 training records "
                         "in all (4 added); validation (40) kept as is?"]
    assert not DatasetVersion.objects.filter(dataset=train.dataset, version=2).exists()

    seen = accept_next_dialog(page)
    page.click("#export-button")
    page.wait_for_url(re.compile(rf"/review/flows/{flow.pk}/\?exported=\d+#exports$"))
    assert seen == dismissed
    version = DatasetVersion.objects.get(dataset=train.dataset, version=2)
    assert run_validation(version.pk) == "ready"
    page.reload()
    row = page.locator(f'#exports-table tr[data-version="{version.pk}"]')
    assert row.locator("[data-holds]").inner_text() == "60 rows of animals v1 + 6 reviewed, 2 relabelled"
    page.screenshot(path=str(SCREENSHOTS / "trainyard-retrain-flow.png"), full_page=True)

    seen = accept_next_dialog(page)
    row.locator("button", has_text="Retrain").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    clone = TrainingJob.objects.exclude(pk=job.pk).get()
    assert seen == [f"Start a training job: a clone of {job.name}, trained on animals v2 (60 rows of animals v1 + 6 "
                    "reviewed, 2 relabelled), validated on animals v1 as before (40 records)?"]
    assert {i.channel: i.dataset_version_id for i in clone.inputs.all()} == {"train": version.pk,
                                                                           "validation": train.pk}

    # The reviewed-only choice: its own dataset, its own sentence.
    page.goto(f"{base}/review/flows/{flow.pk}/")
    page.check('#export-modes input[value="reviewed_only"]')
    seen = accept_next_dialog(page)
    page.click("#export-button")
    page.wait_for_url(re.compile(rf"/review/flows/{flow.pk}/\?exported=\d+#exports$"))
    assert seen == [f"Create {flow.name}-reviewed v1: 6 reviewed rows only, not merged with the training data?"]
    only = DatasetVersion.objects.get(dataset__name=f"{flow.name}-reviewed")
    assert run_validation(only.pk) == "ready"

    # A job validated on a holdout of the 6 reviewed rows (1 row) is flagged beside its metrics;
    # the merged retrain (40 validation records) is not.
    small = TrainingJob.objects.create(project=job.project, name="tiny", algorithm="tabular-classifier",
                                       status="Completed", hyperparameters={"label_column": "biome"},
                                       final_metrics={"validation_accuracy": 1.0},
                                       resources={"instance_type": "cpu", "instance_count": 1, "processes_per_node": 1})
    small.inputs.create(channel="train", dataset_version=only)
    page.goto(f"{base}/jobs/{small.pk}/")
    warning = page.locator("#validation-size-warning")
    assert warning.is_visible()
    assert warning.inner_text().startswith("Validation is measured on only 1 record (held out of the training data")
    page.screenshot(path=str(SCREENSHOTS / "trainyard-retrain-warning.png"), full_page=True)
    TrainingJob.objects.filter(pk=clone.pk).update(status="Completed", final_metrics={"validation_accuracy": 0.9})
    page.goto(f"{base}/jobs/{clone.pk}/")
    assert page.locator("[data-latest=validation_accuracy]").is_visible()
    assert page.locator("#validation-size-warning").count() == 0
    assert not page.console_errors, page.console_errors


def test_a_merge_that_cannot_be_done_says_why_beside_the_button(live_server, owner, animals, make_flow, reviewer,  # noqa: F811
                                                                  browser_page):
    from tests.review.test_export_merge import start_reviews

    _job, model_version, _train, _rows = animals
    flow = make_flow()
    start_reviews(flow, model_version, [{"row": {"f1": 1.0, "weight": 3}}], ["cat"], reviewer)
    page = browser_page
    sign_in_as(page, live_server.url, "owner", "/")
    page.goto(f"{live_server.url}/review/flows/{flow.pk}/")
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.click("#export-button")
    error = page.locator("#export-error")
    error.wait_for(state="visible")
    assert error.inner_text().startswith("The reviewed rows' columns differ from animals v1's (missing f2, region")
    assert dialogs == []
