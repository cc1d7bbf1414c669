"""Deleting from the pages in a real browser: a job's Delete opens a
dialog that lists what goes with it (artifacts, checkpoints, metric points, with counts)
and deletes on confirm; a model version an endpoint serves cannot be deleted, and its
dialog names the endpoint with a link to it. Screenshots: /tmp/trainyard-delete-*.png."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from datasets.storage import default_store, object_uri
from hosting.models import Endpoint, Model, ModelVersion
from jobs.models import JobStatus, MetricPoint, TrainingJob
from studio.models import PendingDeletion
from tests.e2e import test_dataset_upload as dataset_pages
from tests.e2e.conftest import SCREENSHOTS
from tests.factories import make_job

sign_in = dataset_pages.sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _finished_job(project, user, name: str, points: int) -> TrainingJob:
    job = make_job(project, name=name, status=JobStatus.COMPLETED, created_by=user, algorithm="tabular-classifier",
                   finished_at=timezone.now())
    job.output_uri = object_uri(f"jobs/{job.pk}-{uuid.uuid4().hex[:8]}")  # ids repeat across rolled-back tests
    job.model_uri = f"{job.output_uri}/model.tar.gz"
    job.save(update_fields=["output_uri", "model_uri"])
    for key in ("model.tar.gz", "output.tar.gz", "checkpoints/step-10.pt", "checkpoints/step-20.pt",
                "checkpoints/step-30.pt", "logs/node-0.log"):
        with default_store().open_write(f"{job.output_uri}/{key}") as out:
            out.write(b"bytes")
    now = timezone.now()
    MetricPoint.objects.bulk_create([MetricPoint(job=job, name="loss", step=s, value=1 / (s + 1), time=now)
                                     for s in range(points)])
    return job


def test_delete_a_job_from_its_page_lists_what_goes(live_server, scientist, project, browser_page):
    page = browser_page
    job = _finished_job(project, scientist, "churn-baseline", points=1234)
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")

    page.click("#job-delete-open")
    dialog = page.locator("dialog#job-delete")
    dialog.locator("[data-goes]").wait_for()
    text = dialog.inner_text()
    assert "Delete job churn-baseline?" in text
    for line in ("2 artifacts", "3 checkpoint files", "1 log file", "1,234 metric points"):
        assert line in text, (line, text)
    page.screenshot(path=str(SCREENSHOTS / "trainyard-delete-job-dialog.png"))

    dialog.get_by_role("button", name="Cancel").click()
    assert not dialog.is_visible()
    assert TrainingJob.objects.filter(pk=job.pk).exists()

    page.click("#job-delete-open")
    dialog.locator("[data-confirm-delete]").click()
    page.wait_for_url(f"{live_server.url}/jobs/")
    assert "Deleted job churn-baseline" in page.locator(".messages").inner_text()
    assert not TrainingJob.objects.filter(pk=job.pk).exists()
    assert MetricPoint.objects.filter(job_id=job.pk).count() == 0
    # The store part is the control worker's (none runs here): its intent is recorded.
    assert PendingDeletion.objects.get().uris == [job.output_uri]
    assert page.console_errors == []


def test_a_served_model_version_names_its_endpoint(live_server, scientist, project, browser_page):
    page = browser_page
    job = _finished_job(project, scientist, "churn-v2", points=3)
    model = Model.objects.create(project=project, name="churn")
    version = ModelVersion.objects.create(model=model, version=1, job=job, artifact_uri=job.model_uri,
                                          algorithm=job.algorithm, kind="tabular")
    Endpoint.objects.create(project=project, name="churn-prod", model_version=version)
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/models/{model.pk}/")

    page.click("#version-delete-1-open")
    dialog = page.locator("dialog#version-delete-1")
    dialog.locator("[data-blockers]").wait_for()
    text = dialog.inner_text()
    assert "cannot be deleted yet" in text
    assert "churn v1 is served by endpoint 'churn-prod'" in text
    assert dialog.locator("[data-confirm-delete]").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "trainyard-delete-blocked-version.png"))

    dialog.get_by_role("link", name="Open churn-prod").click()
    page.wait_for_url(f"{live_server.url}/models/endpoints/churn-prod/")
    assert ModelVersion.objects.filter(pk=version.pk).exists()
    assert page.console_errors == []
