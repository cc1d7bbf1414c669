"""The pages' Delete: every kind's page has a Delete button whose dialog
says what goes (with counts) or what blocks it (named, linked); POST deletes through the
same action as the API; viewers get neither the button nor the delete."""

from __future__ import annotations

from django.test import Client
from django.urls import reverse

from hosting.models import Endpoint, Model, ModelVersion
from jobs.models import JobStatus, TrainingJob
from review.models import FlowDefinition, WorkTeam
from studio.models import PendingDeletion
from tests.studio import test_delete_api as api_tests
from tuning.models import TuningJob

# The API tests' factories, reused.
make_job = api_tests.make_job
make_tuning = api_tests.make_tuning
register = api_tests.register


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_job_page_delete_dialog_lists_what_goes_then_deletes(owner, make_job):
    job = make_job(name="cnn-<i>x</i>", points=7)
    client = login(owner)
    page = client.get(reverse("job-detail", args=[job.pk])).content.decode()
    assert f'hx-get="{reverse("job-delete", args=[job.pk])}"' in page and 'id="job-delete"' in page

    dialog = client.get(reverse("job-delete", args=[job.pk])).content.decode()
    assert "Delete job cnn-&lt;i&gt;x&lt;/i&gt;?" in dialog
    for line in ("2 artifacts", "2 checkpoint files", "1 log file", "7 metric points", "1 system sample"):
        assert line in dialog, line

    response = client.post(reverse("job-delete", args=[job.pk]), follow=True)
    assert response.redirect_chain[-1][0] == reverse("job-list")
    assert "Deleted job cnn-&lt;i&gt;x&lt;/i&gt;" in response.content.decode()
    assert not TrainingJob.objects.filter(pk=job.pk).exists() and PendingDeletion.objects.count() == 1


def test_running_job_dialog_says_stop_it_first(owner, make_job):
    job = make_job(status=JobStatus.TRAINING)
    client = login(owner)
    dialog = client.get(reverse("job-delete", args=[job.pk])).content.decode()
    assert "cannot be deleted yet" in dialog and "stop it first" in dialog
    response = client.post(reverse("job-delete", args=[job.pk]), follow=True)
    assert "stop it first" in response.content.decode()
    assert TrainingJob.objects.filter(pk=job.pk).exists()


def test_job_a_model_came_from_is_archived_from_its_page(owner, make_job):
    job = make_job()
    register(job, name="churn")
    client = login(owner)
    dialog = client.get(reverse("job-delete", args=[job.pk])).content.decode()
    assert "Archive job" in dialog and "churn v1" in dialog
    client.post(reverse("job-delete", args=[job.pk]))
    job.refresh_from_db()
    assert job.archived_at is not None


def test_model_version_dialog_names_the_endpoint_serving_it(owner, project, make_job):
    version = register(make_job(), name="churn")
    Endpoint.objects.create(project=project, name="churn-prod", model_version=version)
    client = login(owner)
    page = client.get(reverse("model-detail", args=[version.model_id])).content.decode()
    assert reverse("model-version-delete", args=[version.model_id, 1]) in page

    dialog = client.get(reverse("model-version-delete", args=[version.model_id, 1])).content.decode()
    assert "endpoint &#x27;churn-prod&#x27;" in dialog or "endpoint 'churn-prod'" in dialog
    assert f'href="{reverse("endpoint-detail", args=["churn-prod"])}"' in dialog
    client.post(reverse("model-version-delete", args=[version.model_id, 1]))
    assert ModelVersion.objects.filter(pk=version.pk).exists()

    client.post(reverse("endpoint-delete", args=["churn-prod"]))
    assert not Endpoint.objects.exists()
    client.post(reverse("model-version-delete", args=[version.model_id, 1]))
    assert not ModelVersion.objects.filter(pk=version.pk).exists()
    client.post(reverse("model-delete", args=[version.model_id]))
    assert not Model.objects.exists()


def test_tuning_flow_and_team_pages_delete(owner, project, make_tuning):
    tuning = make_tuning()
    client = login(owner)
    assert "2 trials" in client.get(reverse("tuning-delete", args=[tuning.pk])).content.decode()
    client.post(reverse("tuning-delete", args=[tuning.pk]))
    assert not TuningJob.objects.exists()

    team = WorkTeam.objects.create(project=project, name="labellers")
    flow = FlowDefinition.objects.create(project=project, name="biomes", work_team=team, labels=["a"], title="?")
    listing = client.get(reverse("review-flows")).content.decode()
    assert reverse("review-team-delete", args=[team.pk]) in listing
    assert "biomes" in client.get(reverse("review-team-delete", args=[team.pk])).content.decode()
    client.post(reverse("review-team-delete", args=[team.pk]))
    assert WorkTeam.objects.filter(pk=team.pk).exists()
    assert reverse("review-flow-delete", args=[flow.pk]) in client.get(reverse("review-flow", args=[flow.pk])).content.decode()
    client.post(reverse("review-flow-delete", args=[flow.pk]))
    client.post(reverse("review-team-delete", args=[team.pk]))
    assert not FlowDefinition.objects.exists() and not WorkTeam.objects.exists()


def test_viewer_sees_no_delete_and_cannot_post_one(viewer, make_job):
    job = make_job()
    client = login(viewer)
    assert reverse("job-delete", args=[job.pk]) not in client.get(reverse("job-detail", args=[job.pk])).content.decode()
    assert client.post(reverse("job-delete", args=[job.pk])).status_code == 403
    assert TrainingJob.objects.filter(pk=job.pk).exists()
