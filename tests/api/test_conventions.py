from __future__ import annotations

from rest_framework.test import APIClient


def test_unknown_api_path_is_a_json_404(db):
    response = APIClient().get("/api/v1/nope/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_malformed_json_is_a_400_envelope(owner, client_for):
    response = client_for(owner).post("/api/v1/projects/", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["error"]["message"]


def test_openapi_schema_lists_the_endpoints(db):
    response = APIClient().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    text = response.content.decode()
    for path in ("/api/v1/datasets/", "/api/v1/tokens/", "/api/v1/dataset-versions/{id}/", "/api/v1/health"):
        assert path in text


def test_api_docs_are_served_without_a_cdn(db):
    response = APIClient().get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "swagger-ui" in html
    assert "cdn." not in html and "unpkg.com" not in html and "jsdelivr" not in html
    assert "/static/drf_spectacular_sidecar/" in html


def test_health_reports_database_redis_and_nodes(owner, client_for):
    from jobs.models import Node

    Node.objects.create(name="node-a", hostname="h", queue="node.node-a")
    anonymous = APIClient().get("/api/v1/health").json()
    assert anonymous["database"]["ok"] is True
    assert anonymous["redis"]["ok"] is True
    assert anonymous["nodes"] == {"live": 1, "total": 1}
    detailed = client_for(owner).get("/api/v1/health").json()
    assert detailed["nodes"]["items"][0]["name"] == "node-a"
    assert detailed["nodes"]["items"][0]["state"] == "idle"


def test_lists_are_paginated(owner, client_for):
    from studio import actions

    for i in range(3):
        actions.create_project(slug=f"p{i}", owner=owner)
    body = client_for(owner).get("/api/v1/projects/?page_size=2").json()
    assert body["count"] == 4
    assert len(body["results"]) == 2
    assert body["next"]


def test_schema_generates_without_warnings(db):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", "/dev/null")


def test_a_list_items_or_nested_fields_error_message_names_its_path(owner, client_for):
    """DRF reports a ListField item's error as {"tags": {1: [...]}} and a many=True
    serializer's as a list of dicts; `fields` keeps them under the body's field (a client
    asks `"tags" in fields`) and the message names the item by its path, not '{}' or the
    list alone."""
    client = client_for(owner)
    base = {"project": "acme", "name": "j", "algorithm": "tabular-classifier"}
    cases = [
        ({"tags": ["ok", "x" * 101]}, {"tags[1]"}),
        ({"environment": {"A": "x" * 10_001}}, {"environment.A"}),
        ({"metric_definitions": [{"name": "loss", "regex": "loss=(\\S+)"}, {"name": "", "regex": "(("}]},
         {"metric_definitions[1].name", "metric_definitions[1].regex"}),
    ]
    for extra, paths in cases:
        response = client.post("/api/v1/jobs/", {**base, **extra}, format="json")
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert set(error["fields"]) == {path.split(".")[0].split("[")[0] for path in paths}, error
        assert error["message"].split(": ", 1)[0] in paths, error
    response = client.post("/api/v1/tuning-jobs/", {"project": "acme", "name": "t", "warm_start_from": [1, -3, "a"]},
                           format="json")
    error = response.json()["error"]
    assert error["fields"]["warm_start_from"] == {"1": ["Ensure this value is greater than or equal to 1."],
                                                  "2": ["A valid integer is required."]}, error
