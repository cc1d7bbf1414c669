"""What the endpoint, job and tuning pages let a scientist do, through
Django's test client: switch the served version and attach or detach a review flow (the
same action as PATCH /api/v1/endpoints/<name>/), register a completed job or a search's
best trial as a model, and pick a job in the register form by its key metric."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from hosting import actions
from hosting.models import Endpoint, Model
from jobs.models import JobStatus, TrainingJob
from tests.hosting.conftest import make_flow
from tests.tuning.test_pages import make_tuning_job
from tuning.models import TuningJob, TuningStatus


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def two_versions(owner, demo_job):
    first = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    second = actions.register_model(project=demo_job.project, name="biomes", job=demo_job, user=owner)
    endpoint = actions.create_endpoint(project=demo_job.project, name="biomes-live", model_version=second, user=owner)
    return first, second, endpoint


def settings_url(endpoint: Endpoint) -> str:
    return reverse("endpoint-update", args=[endpoint.name])


def test_the_endpoint_page_switches_the_version_and_attaches_and_detaches_a_flow(teammate, owner, project,
                                                                                 two_versions):
    first, second, endpoint = two_versions
    flow = make_flow(project, owner)
    client = login(teammate)
    page = client.get(reverse("endpoint-detail", args=[endpoint.name])).content.decode()
    assert 'id="endpoint-settings-form"' in page
    assert re.search(r'<option value="2" selected>v2 of biomes \(serving now\)</option>', page)
    assert f'<option value="{flow.pk}">check-uncertain</option>' in page

    response = client.post(settings_url(endpoint), {"model_version": "1", "flow_definition": str(flow.pk)})
    assert response.status_code == 302 and response["Location"] == reverse("endpoint-detail", args=[endpoint.name])
    endpoint.refresh_from_db()
    assert (endpoint.model_version_id, endpoint.flow_definition_id) == (first.pk, flow.pk)
    shown = client.get(response["Location"]).content.decode()
    assert "biomes-live now serves version 1 (was 2) and sends to the review flow check-uncertain." in shown
    assert "v1 (tabular)" in shown  # the page reads what it serves now

    response = client.post(settings_url(endpoint), {"model_version": "1", "flow_definition": ""})
    assert response.status_code == 302
    endpoint.refresh_from_db()
    assert (endpoint.model_version_id, endpoint.flow_definition_id) == (first.pk, None)
    assert "sends nothing to review" in client.get(response["Location"]).content.decode()
    # The API reads the same row.
    body = client.get(f"/api/v1/endpoints/{endpoint.name}/").json()
    assert body["model_version"]["version"] == 1 and body["flow_definition"] is None


@pytest.mark.parametrize(("posted", "field", "message"), [
    ({"model_version": "7"}, "model_version", "Model &#x27;biomes&#x27; has no version 7."),
    ({"model_version": "two"}, "model_version", "Give a version number."),
    ({"model_version": "1", "flow_definition": "x"}, "flow_definition", "Give the id of a flow definition."),
    ({"model_version": "1", "flow_definition": "999999"}, "flow_definition", "No flow definition with that id"),
])
def test_bad_settings_are_a_400_with_the_message_beside_the_field(teammate, two_versions, posted, field, message):
    _, second, endpoint = two_versions
    response = login(teammate).post(settings_url(endpoint), posted)
    assert response.status_code == 400
    assert message in response.content.decode()
    endpoint.refresh_from_db()
    assert endpoint.model_version_id == second.pk  # nothing changed


def test_another_projects_flow_cannot_be_attached(teammate, outsider, other_project, two_versions):
    _, _, endpoint = two_versions
    theirs = make_flow(other_project, outsider, name="theirs")
    response = login(teammate).post(settings_url(endpoint), {"model_version": "2", "flow_definition": str(theirs.pk)})
    assert response.status_code == 400
    endpoint.refresh_from_db()
    assert endpoint.flow_definition_id is None


def test_viewers_see_no_settings_and_cannot_post_them_outsiders_get_404(viewer, outsider, two_versions):
    _, second, endpoint = two_versions
    page = login(viewer).get(reverse("endpoint-detail", args=[endpoint.name])).content.decode()
    assert 'id="endpoint-settings-form"' not in page
    assert login(viewer).post(settings_url(endpoint), {"model_version": "1"}).status_code == 403
    assert login(outsider).post(settings_url(endpoint), {"model_version": "1"}).status_code == 404
    assert login(viewer).get(settings_url(endpoint)).status_code == 405
    endpoint.refresh_from_db()
    assert endpoint.model_version_id == second.pk


def test_a_completed_job_registers_from_its_page_and_lands_on_the_model(teammate, viewer, demo_job, project):
    client = login(teammate)
    page = client.get(reverse("job-detail", args=[demo_job.pk])).content.decode()
    assert 'id="register-model-form"' in page and f'name="job" value="{demo_job.pk}"' in page
    assert 'id="register-model-form"' not in login(viewer).get(reverse("job-detail", args=[demo_job.pk])).content.decode()
    running = TrainingJob.objects.create(project=project, name="still-going", status=JobStatus.TRAINING)
    assert 'id="register-model-form"' not in client.get(reverse("job-detail", args=[running.pk])).content.decode()

    response = client.post(reverse("model-register"), {"job": demo_job.pk, "name": demo_job.name})
    model = Model.objects.get(name=demo_job.name)
    assert response.status_code == 302 and response["Location"] == reverse("model-detail", args=[model.pk])
    assert model.versions.get().job_id == demo_job.pk


def test_a_searchs_best_trial_registers_from_the_tuning_page(teammate, owner, project, demo_job):
    search = make_tuning_job(project, owner, status=TuningStatus.COMPLETED)
    best = TrainingJob.objects.create(project=project, name="lr-search-1", algorithm="tabular-classifier",
                                      status=JobStatus.COMPLETED, model_uri=demo_job.model_uri,
                                      final_metrics=demo_job.final_metrics, tuning_job=search, trial_number=1,
                                      trial_params={"learning_rate": 0.01}, objective_value=0.9)
    TuningJob.objects.filter(pk=search.pk).update(best_trial=best, best_value=0.9)
    client = login(teammate)
    page = client.get(reverse("tuning-detail", args=[search.pk])).content.decode()
    form = re.search(r'<form method="post" action="/models/register/"[^>]*id="register-best-form">(.*?)</form>', page)
    assert form is not None, "no Register model button for the best trial"
    assert f'name="job" value="{best.pk}"' in form.group(1) and 'name="name" value="lr-search"' in form.group(1)
    response = client.post(reverse("model-register"), {"job": best.pk, "name": "lr-search"})
    model = Model.objects.get(name="lr-search")
    assert response["Location"] == reverse("model-detail", args=[model.pk])


def test_the_register_dropdown_names_each_job_with_its_key_metric(teammate, demo_job):
    body = login(teammate).get(reverse("models")).content.decode()
    option = re.search(rf'<option value="{demo_job.pk}"[^>]*>([^<]*)</option>', body).group(1)
    accuracy = demo_job.final_metrics["validation_accuracy"]
    assert option.startswith(f"demo-tabular (#{demo_job.pk}) · validation_accuracy {accuracy:.4g}"), option


def test_a_settings_post_without_a_version_keeps_the_one_served(teammate, two_versions):
    first, _, endpoint = two_versions
    client = login(teammate)
    assert client.post(settings_url(endpoint), {"model_version": "1"}).status_code == 302
    for posted in ({}, {"model_version": ""}, {"model_version": "  "}):
        response = client.post(settings_url(endpoint), posted)
        assert response.status_code == 302
        endpoint.refresh_from_db()
        assert endpoint.model_version_id == first.pk, posted  # not switched to the latest
    assert "biomes-live is unchanged." in client.get(response["Location"]).content.decode()
