"""The small things a page shows (Django's test client): the login page
names `studio adduser`; breadcrumbs name the project; the timeline shows a status once
with its notes under it; a failed job without metrics does not promise a chart; the
browser's /favicon.ico finds the favicon."""

from __future__ import annotations

import re
from datetime import timedelta

from django.test import Client
from django.utils import timezone

from jobs.models import JobEvent, JobStatus, TrainingJob
from tests.tuning.test_pages import make_tuning_job


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _job(project, user, status: str) -> TrainingJob:
    now = timezone.now()
    job = TrainingJob.objects.create(project=project, name="timeline", algorithm="tabular-classifier", status=status,
                                     created_by=user, attempt=1, started_at=now - timedelta(minutes=2),
                                     finished_at=now if status in (JobStatus.FAILED, JobStatus.COMPLETED) else None,
                                     failure_reason="ValueError: no label column" if status == JobStatus.FAILED else "")
    for offset, step, message in ((0, "Pending", "Submitted"), (2, "Starting", "Placed on node node-1"),
                                  (3, "Starting", "Staging data (1 channel)"), (9, "Training", "Processes started"),
                                  (20, status, "")):
        JobEvent.objects.create(job=job, status=step, at=now - timedelta(minutes=2) + timedelta(seconds=offset),
                                message=message, attempt=1)
    return job


def test_login_page_names_the_studio_adduser_command():
    body = Client().get("/login/").content.decode()
    assert "studio adduser" in body and "createsuperuser" not in body


def test_breadcrumbs_name_the_project_not_its_slug(project, owner):
    job = _job(project, owner, JobStatus.COMPLETED)
    search = make_tuning_job(project, owner)
    client = login(owner)
    assert project.name != project.slug
    for url in (f"/jobs/{job.pk}/", f"/tuning/{search.pk}/"):
        crumbs = re.search(r'<nav class="breadcrumbs".*?</nav>', client.get(url).content.decode(), re.S).group(0)
        assert f">{project.name}<" in crumbs, crumbs


def test_timeline_shows_each_status_once_with_its_notes(project, owner):
    job = _job(project, owner, JobStatus.COMPLETED)
    body = login(owner).get(f"/jobs/{job.pk}/").content.decode()
    timeline = re.search(r'<ol class="timeline" id="timeline">.*?</ol>', body, re.S).group(0)
    assert timeline.count('data-status="starting"') == 1
    assert "Placed on node node-1" in timeline and "Staging data (1 channel)" in timeline


def test_failed_job_without_metrics_does_not_promise_a_chart(project, owner):
    job = _job(project, owner, JobStatus.FAILED)
    body = login(owner).get(f"/jobs/{job.pk}/").content.decode()
    empty = re.search(r'<div class="empty" id="charts-empty">.*?</div>', body, re.S).group(0)
    assert "No metrics yet" not in empty and "a chart appears" not in empty.lower()
    assert "failed before it reported a metric" in empty


def test_favicon_ico_leads_to_the_svg(owner):
    response = Client().get("/favicon.ico")
    assert response.status_code == 301 and re.search(r"/static/img/favicon\.[0-9a-f]{12}\.svg$", response["Location"])
    icon = Client().get(response["Location"])
    assert icon.status_code == 200 and icon["Content-Type"].startswith("image/svg")
