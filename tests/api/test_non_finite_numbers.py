"""Found by using the studio: Python's json reads 1e400 as inf, which no JSON column
can store, so a body holding it was a 500 when the row was written (a script job's
hyperparameters: SQLite's JSON_VALID check; PostgreSQL refuses Infinity in jsonb too).
Such a number is a 400 naming where it is, like a NUL; so are the literals NaN and
Infinity that Python's json writes (DRF's strict parser refused them without a field)."""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from jobs.models import TrainingJob

pytestmark = pytest.mark.django_db


@pytest.fixture
def script_uri(owner, client_for) -> str:
    response = client_for(owner).post("/api/v1/scripts/", {
        "project": "acme", "file": SimpleUploadedFile("train.py", b"print('hi')\n")}, format="multipart")
    assert response.status_code in (200, 201), response.content
    return response.json()["uri"]


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "NaN", "Infinity", "-Infinity", "1" + "0" * 400, "-" + "9" * 320])
def test_a_number_too_large_for_a_float_is_a_400_naming_the_field(owner, client_for, script_uri, literal):
    body = json.dumps({"project": "acme", "name": "too-big", "script": {"uri": script_uri, "entry_point": "train.py"},
                       "hyperparameters": {"lr": 0.1, "x": "LITERAL"}}).replace('"LITERAL"', literal)
    response = client_for(owner).post("/api/v1/jobs/", body, content_type="application/json")

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == ["hyperparameters.x"]
    assert ("NaN" if literal == "NaN" else "Infinity") in error["fields"]["hyperparameters.x"][0], error
    assert not TrainingJob.objects.filter(name="too-big").exists()


def test_large_finite_numbers_still_pass(owner, client_for, script_uri):
    body = json.dumps({"project": "acme", "name": "big", "script": {"uri": script_uri, "entry_point": "train.py"},
                       "hyperparameters": {"x": 1e300}})
    response = client_for(owner).post("/api/v1/jobs/", body, content_type="application/json")

    assert response.status_code == 201, response.content
    # PostgreSQL's jsonb keeps numbers as numeric and writes 1e300 out in full digits: the
    # same number, read back as an int.
    assert float(response.json()["hyperparameters"]["x"]) == 1e300


def test_a_non_finite_number_in_a_list_is_named_as_the_rule_checker_names_it(owner, client_for, script_uri):
    # One path syntax for every 400: keys dotted, list items by index in brackets, as the
    # rule checker writes rules[0].parameters.metric (the parser used to say rules.0.…).
    body = json.dumps({"project": "acme", "name": "nan-rule", "script": {"uri": script_uri, "entry_point": "train.py"},
                       "rules": [{"type": "stalled"}, {"type": "custom", "parameters": {"metric": "loss",
                                                                                         "threshold": "LITERAL"}}]}
                      ).replace('"LITERAL"', "NaN")
    response = client_for(owner).post("/api/v1/jobs/", body, content_type="application/json")

    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["rules[1].parameters.threshold"]
    assert not TrainingJob.objects.filter(name="nan-rule").exists()


@pytest.mark.parametrize("where", ["rules", "rule", "tuning"])
def test_an_integer_too_large_for_a_float_is_a_400_not_a_500(owner, client_for, script_uri, where):
    # Found through a generated client: 10**400 as an integer literal passed the parser (only
    # floats were checked) and raised OverflowError in the rule checker, the algorithms'
    # hyperparameter check and the tuning ranges: a 500 each.
    huge = "1" + "0" * 400
    job = {"project": "acme", "name": "huge", "script": {"uri": script_uri, "entry_point": "train.py"}}
    if where == "rules":
        path, field = "/api/v1/jobs/", "rules[0].parameters.threshold"
        body = {**job, "rules": [{"type": "custom", "parameters": {"metric": "loss", "comparison": ">",
                                                                    "threshold": "HUGE"}}]}
    elif where == "rule":
        created = client_for(owner).post("/api/v1/jobs/", {**job, "name": "target"}, format="json")
        assert created.status_code == 201, created.content
        path, field = f"/api/v1/jobs/{created.json()['id']}/rules/", "parameters.threshold_seconds"
        body = {"type": "stalled", "parameters": {"threshold_seconds": "HUGE"}}
    else:
        path, field = "/api/v1/tuning-jobs/", "hyperparameter_ranges.lr.max"
        body = {"project": "acme", "name": "huge", "base_job": job, "objective": {"metric": "loss", "type": "minimize"},
                "hyperparameter_ranges": {"lr": {"type": "continuous", "min": 0.1, "max": "HUGE"}}}
    response = client_for(owner).post(path, json.dumps(body).replace('"HUGE"', huge), content_type="application/json")

    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [field], response.content
    assert not TrainingJob.objects.filter(name="huge").exists()
