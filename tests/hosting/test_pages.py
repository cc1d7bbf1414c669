"""The models list, a model's page and an endpoint's page through Django's test client:
what they show, their empty states, the register and deploy forms, escaping of names
people typed, and who may open them."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from hosting import actions
from hosting.models import Endpoint, Model
from jobs.models import JobStatus, TrainingJob


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def deployed(owner, demo_job):
    version = actions.register_model(project=demo_job.project, name="biomes <b>bold</b>", job=demo_job, user=owner)
    endpoint = actions.create_endpoint(project=demo_job.project, name="biomes-live", model_version=version, user=owner)
    return version, endpoint


def test_empty_models_page_says_what_to_do_next(teammate, viewer):
    body = login(teammate).get(reverse("models")).content.decode()
    assert "No models yet" in body and "train one" in body
    assert 'id="register-panel"' in body
    viewer_body = login(viewer).get(reverse("models")).content.decode()
    assert "a scientist or admin of the project can" in viewer_body and 'id="register-form"' not in viewer_body


def test_register_form_lists_completed_jobs_and_registers(teammate, demo_job, project):
    TrainingJob.objects.create(project=project, name="still-going", status=JobStatus.TRAINING)
    client = login(teammate)
    body = client.get(reverse("models")).content.decode()
    assert f'<option value="{demo_job.pk}"' in body and "still-going" not in body
    response = client.post(reverse("model-register"), {"job": demo_job.pk, "name": "biomes"})
    model = Model.objects.get(name="biomes")
    assert response.status_code == 302 and response["Location"] == reverse("model-detail", args=[model.pk])
    failed = TrainingJob.objects.create(project=project, name="broken", status=JobStatus.FAILED, model_uri="file:///x")
    response = client.post(reverse("model-register"), {"job": failed.pk, "name": "biomes"})
    assert response.status_code == 400
    assert "is Failed: only a Completed job&#x27;s model can be registered" in response.content.decode()


def test_models_list_and_detail_show_versions_metrics_and_escape_names(teammate, deployed, demo_job):
    version, endpoint = deployed
    client = login(teammate)
    body = client.get(reverse("models")).content.decode()
    assert "biomes &lt;b&gt;bold&lt;/b&gt;" in body and "<b>bold</b>" not in body
    assert "validation_accuracy" in body and "biomes-live" in body
    detail = client.get(reverse("model-detail", args=[version.model_id])).content.decode()
    assert 'id="versions-table"' in detail and f"#{demo_job.pk}" in detail
    # The training data by name (it used to read "train: #1").
    assert "label_column=label" in detail and f"train: <a href=\"/datasets/{demo_job.inputs.get().dataset_version.dataset_id}/" in detail
    assert reverse("api-model-version-download", args=[version.model_id, 1]) in detail
    assert "<b>bold</b>" not in detail


def test_deploy_form_creates_an_endpoint_and_reports_a_taken_name(teammate, deployed):
    version, _ = deployed
    client = login(teammate)
    url = reverse("endpoint-create", args=[version.model_id])
    response = client.post(url, {"name": "second", "model_version": "1", "flow_definition": ""})
    assert response.status_code == 302 and Endpoint.objects.filter(name="second").exists()
    taken = client.post(url, {"name": "second", "model_version": "1"})
    assert taken.status_code == 400 and "already exists" in taken.content.decode()


def test_endpoint_page_prefills_an_example_row_from_the_schema(viewer, deployed):
    version, endpoint = deployed
    body = login(viewer).get(reverse("endpoint-detail", args=[endpoint.name])).content.decode()
    assert 'id="try-form"' in body and "/api/v1/endpoints/biomes-live/invocations" in body
    assert "&quot;feature_01&quot;:" in body and "&quot;region&quot;:" in body
    assert "js/endpoint_detail." in body  # js/endpoint_detail.<hash>.js


def test_reviewers_and_outsiders_cannot_open_model_or_endpoint_pages(reviewer, outsider, deployed):
    version, endpoint = deployed
    outsider_client = login(outsider)
    assert outsider_client.get(reverse("model-detail", args=[version.model_id])).status_code == 404
    assert outsider_client.get(reverse("endpoint-detail", args=[endpoint.name])).status_code == 404
    assert "biomes" not in outsider_client.get(reverse("models")).content.decode()
    reviewer_client = login(reviewer)  # reviewers are sent to their inbox
    for url in (reverse("models"), reverse("model-detail", args=[version.model_id]),
                reverse("endpoint-detail", args=[endpoint.name])):
        response = reviewer_client.get(url)
        assert response.status_code == 302 and "biomes" not in response.content.decode()


def test_batch_form_offers_ready_tabular_versions_and_queues_a_batch(teammate, deployed, demo_version):
    from hosting.models import BatchPrediction

    version, _ = deployed
    client = login(teammate)
    body = client.get(reverse("model-detail", args=[version.model_id])).content.decode()
    assert f'<option value="{demo_version.pk}">demo-held-out v1 · csv' in body
    response = client.post(reverse("batch-create", args=[version.model_id]),
                           {"dataset_version": demo_version.pk, "model_version": "1", "flow_definition": ""})
    assert response.status_code == 302
    batch = BatchPrediction.objects.get()
    assert batch.dataset_version_id == demo_version.pk and batch.status == "Pending"
    bad = client.post(reverse("batch-create", args=[version.model_id]), {"dataset_version": "999999"})
    assert bad.status_code == 400 and "No dataset version with that id" in bad.content.decode()
    listing = client.get(reverse("model-detail", args=[version.model_id])).content.decode()
    assert 'id="batches-table"' in listing
