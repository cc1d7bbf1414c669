"""The job page's cost panel keeps up while the job trains: the live regions are re-read only
on a status change, so the panel counts its running attempt's cost and times on by itself,
without asking the server."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from jobs.models import JobAttempt, JobStatus
from tests.e2e.test_job_pages import sign_in
from tests.e2e.test_live_charts import FAKE_STREAM_JS
from tests.factories import make_job


def test_a_training_jobs_cost_counts_on_every_second_without_a_request(live_server, scientist, project, browser_page):
    page = browser_page
    page.add_init_script(FAKE_STREAM_JS)  # no status events: nothing re-reads the regions
    now = timezone.now()
    job = make_job(project, name="priced", algorithm="tabular-classifier", hyperparameters={"epochs": 1},
                   created_by=scientist, status=JobStatus.TRAINING, attempt=1, submitted=True,
                   started_at=now - timedelta(seconds=30), training_started_at=now - timedelta(seconds=20))
    # 3600 an hour: one a second.
    JobAttempt.objects.create(job=job, attempt=1, node_rank=0, started_at=now - timedelta(seconds=30),
                              training_started_at=now - timedelta(seconds=20), price_per_hour=Decimal("3600"),
                              currency="USD", outcome="running")
    sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.wait_for_function("() => window.__source !== undefined")
    pages_read: list[str] = []
    page.on("request", lambda request: pages_read.append(request.url) if f"/jobs/{job.pk}/" == request.url.removeprefix(live_server.url) else None)

    def figures() -> tuple[float, str, str, float]:
        cost = float(page.inner_text("#job-cost").split()[0])
        row = float(page.inner_text('#cost-attempts tr[data-attempt="1"] td:last-child'))
        return cost, page.inner_text("#job-billable"), page.inner_text("#job-training-time"), row

    first = figures()
    page.wait_for_timeout(3200)
    later = figures()
    assert 2.5 <= later[0] - first[0] <= 4.5, (first, later)
    assert 2.5 <= later[3] - first[3] <= 4.5, (first, later)
    assert later[1] != first[1] and later[2] != first[2], (first, later)
    assert later[1].endswith(" s") and later[2].endswith(" s")
    assert not pages_read, "counted on in the page, not read again"
    assert not page.console_errors  # type: ignore[attr-defined]
