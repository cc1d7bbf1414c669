"""Small things the dataset pages get right: a description written in Markdown is rendered (and
sanitised: no script, no on* handlers, no javascript: links); the page lists the jobs that
trained on the dataset, through a fragment the jobs app serves."""

from __future__ import annotations

import re

from django.test import Client

from datasets.models import Dataset
from jobs.models import JobInput, JobStatus, TrainingJob
from tests.jobs.test_pages import make_version


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_description_markdown_is_rendered_and_sanitised(project, owner, tmp_path):
    version = make_version(project, owner, tmp_path)
    Dataset.objects.filter(pk=version.dataset_id).update(description=(
        "Flowers **measured by hand**.\n\n- petals\n- sepals\n\n[source](https://example.org) "
        "<script>alert(1)</script> [bad](javascript:alert(2)) <img src=x onerror=alert(3)>"))
    body = login(owner).get(f"/datasets/{version.dataset_id}/").content.decode()
    description = re.search(r'<div class="description markdown">(.*?)</div>', body, re.S).group(1)
    assert "<strong>measured by hand</strong>" in description and "<li>petals</li>" in description
    assert 'href="https://example.org"' in description
    assert "**" not in description and "<script" not in description and "javascript:" not in description
    assert "onerror" not in description
    listing = login(owner).get("/datasets/").content.decode()
    assert "Flowers measured by hand." in listing and "**" not in listing


def test_dataset_page_lists_the_jobs_that_used_it(project, owner, outsider, tmp_path):
    version = make_version(project, owner, tmp_path)
    used = TrainingJob.objects.create(project=project, name="trained-on-flowers", algorithm="tabular-classifier",
                                      status=JobStatus.COMPLETED, created_by=owner)
    JobInput.objects.create(job=used, channel="train", dataset_version=version)
    TrainingJob.objects.create(project=project, name="unrelated", algorithm="tabular-classifier", created_by=owner)
    client = login(owner)
    page = client.get(f"/datasets/{version.dataset_id}/").content.decode()
    fragment_url = re.search(r'hx-get="([^"]+)"', page.split('id="dataset-jobs"')[1]).group(1)
    fragment = client.get(fragment_url).content.decode()
    assert "trained-on-flowers" in fragment and f"/jobs/{used.pk}/" in fragment and "unrelated" not in fragment
    assert "train</span>: v1" in fragment
    assert login(outsider).get(fragment_url).status_code == 404
