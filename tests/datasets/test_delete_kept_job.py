"""Found by using the studio: deleting a dataset version that a job reads says
"delete that job first" — but when a registered model came from that job, deleting the job
only archives it (docs/SPEC.md §6), and the version stays in use for ever: the refusal asked
for the impossible again. It now says the job is kept for the model version and what to delete."""

from __future__ import annotations

from django.urls import reverse

from datasets.models import DatasetVersion
from hosting.models import Model, ModelVersion
from jobs.models import JobInput, JobStatus, TrainingJob
from tests.datasets.test_pages import login, make_version


def _job_behind_a_model(project, user, version) -> TrainingJob:
    job = TrainingJob.objects.create(project=project, name="base", status=JobStatus.COMPLETED, created_by=user)
    JobInput.objects.create(job=job, channel="train", dataset_version=version)
    model = Model.objects.create(project=project, name="tab")
    ModelVersion.objects.create(model=model, version=1, job=job, artifact_uri="file:///x", kind="tabular")
    return job


def test_api_refusal_says_the_job_is_kept_for_its_model(teammate, project, tmp_path, client_for):
    version = make_version(project, teammate, tmp_path)
    _job_behind_a_model(project, teammate, version)

    response = client_for(teammate).delete(f"/api/v1/dataset-versions/{version.pk}/")

    assert response.status_code == 409, response.content
    message = response.json()["error"]["message"]
    assert "a training job 'base'" in message
    assert "kept because model 'tab' v1 came from it" in message
    assert "delete those model versions first, then the job" in message
    assert DatasetVersion.objects.filter(pk=version.pk).exists()


def test_page_refusal_says_the_job_is_kept_for_its_model(teammate, project, tmp_path):
    version = make_version(project, teammate, tmp_path)
    _job_behind_a_model(project, teammate, version)

    page = login(teammate).post(reverse("dataset-version-delete", args=[version.pk]), follow=True).content.decode()

    assert "delete those model versions first, then the job" in page


def test_a_plain_job_keeps_the_short_refusal(teammate, project, tmp_path, client_for):
    version = make_version(project, teammate, tmp_path)
    job = TrainingJob.objects.create(project=project, name="plain", created_by=teammate)
    JobInput.objects.create(job=job, channel="train", dataset_version=version)

    message = client_for(teammate).delete(f"/api/v1/dataset-versions/{version.pk}/").json()["error"]["message"]

    assert message.endswith("delete that job first, or keep this version.")
    assert "kept because" not in message
