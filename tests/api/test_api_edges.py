"""Edges the schema fuzzer (test_schema_fuzz.py) found, each pinned by a plain test."""

from __future__ import annotations

import pytest

from jobs.models import JobStatus, TrainingJob

pytestmark = pytest.mark.django_db


def test_a_form_with_too_many_fields_is_a_400_not_a_500(owner, client_for):
    # Django refuses more than DATA_UPLOAD_MAX_NUMBER_FIELDS (1,000) fields with
    # TooManyFieldsSent, which DRF does not handle: it was a 500.
    body = {"project": "acme", "name": "team", "members": [f"user-{i}" for i in range(1200)]}
    response = client_for(owner).post("/api/v1/work-teams/", body)  # multipart
    assert response.status_code == 400, response.content[:300]
    assert response.json()["error"]["code"] == "invalid"
    assert "DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["error"]["message"]


def test_deleting_a_finished_job_is_not_a_500_on_postgresql(project, owner, client_for):
    # The delete locked the job row with a join to its (nullable) tuning job: PostgreSQL
    # refuses FOR UPDATE on the nullable side of an outer join.
    job = TrainingJob.objects.create(project=project, name="done", algorithm="tabular-classifier",
                                     status=JobStatus.COMPLETED, created_by=owner)
    response = client_for(owner).delete(f"/api/v1/jobs/{job.pk}/")
    assert response.status_code in (200, 204), response.content[:300]


def test_a_tuning_job_that_has_not_started_has_a_null_elapsed_time_and_the_schema_says_so(db):
    from django.test import Client

    schema = Client().get("/api/schema/", HTTP_ACCEPT="application/json").json()
    assert schema["components"]["schemas"]["TuningJobSummary"]["properties"]["elapsed_seconds"]["nullable"] is True


def test_a_claim_from_a_flow_id_past_the_id_column_is_a_400(owner, client_for):
    # A JSON integer has no bound; SQLite raised OverflowError (a 500) on the lookup.
    response = client_for(owner).post("/api/v1/review/claim/", {"flow_definition": 2**70}, format="json")
    assert response.status_code == 400, response.content[:300]
    assert list(response.json()["error"]["fields"]) == ["flow_definition"]


@pytest.mark.parametrize(("path", "noun"), [
    ("/api/v1/jobs/999999/", "training job"),
    ("/api/v1/dataset-versions/999999/", "dataset version"),
    ("/api/v1/human-loops/no-such-loop/", "human loop"),
])
def test_not_found_says_what_in_words_not_a_class_name(owner, client_for, path, noun):
    response = client_for(owner).get(path)
    assert response.status_code == 404
    message = response.json()["error"]["message"]
    assert noun in message and "matches the given query" not in message, message
