"""What the OpenAPI schema says about every operation, checked against the URLconf and the
real paginator; the fuzzer (test_schema_fuzz.py) checks it against the
answers. Plus: the schema is valid OpenAPI 3, and the docs page groups the operations
per resource in a real browser."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import resolve
from openapi_spec_validator import validate

from studio.api import PaginatedAPIView
from studio.schema import LIST_PATH_END

pytestmark = pytest.mark.django_db
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture
def schema() -> dict:
    response = Client().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    return response.json()


def operations(schema: dict):
    for path, item in schema["paths"].items():
        for method, op in item.items():
            if method in METHODS:
                yield path, method, op


def resolved(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        node = schema["components"]["schemas"][name]
    return node


def view_class(path: str):
    concrete = re.sub(r"\{(\w*id|number)\}", "1", path)  # ids and numbers; names, slugs and paths below
    concrete = re.sub(r"\{\w+\}", "x", concrete)
    return resolve(concrete).func.view_class


def test_the_schema_is_valid_openapi(schema):
    validate(schema)
    assert schema["openapi"].startswith("3.")


def test_every_paginated_list_is_documented_as_one_page_of_the_real_paginator(schema):
    lists = []
    for path, method, op in operations(schema):
        if method != "get" or not issubclass(view_class(path), PaginatedAPIView) or LIST_PATH_END.search(path):
            continue
        page = resolved(schema, op["responses"]["200"]["content"]["application/json"]["schema"])
        assert page.get("type") == "object", (path, page)
        assert {"count", "results"} <= set(page.get("required", [])), path
        assert page["properties"]["results"]["type"] == "array", path
        assert page["properties"]["next"].get("nullable") is True, path
        names = {p["name"] for p in op.get("parameters", []) if p["in"] == "query"}
        assert {"page", "page_size"} <= names, (path, names)
        lists.append(path)
    # The seven the issue counted as bare arrays are among them, and the rest.
    for path in ("/api/v1/datasets/", "/api/v1/dataset-versions/", "/api/v1/jobs/", "/api/v1/projects/",
                 "/api/v1/projects/{slug}/members/", "/api/v1/tokens/", "/api/v1/tuning-jobs/", "/api/v1/models/",
                 "/api/v1/endpoints/", "/api/v1/human-loops/", "/api/v1/work-teams/", "/api/v1/flow-definitions/"):
        assert path in lists, path


def test_a_list_answers_the_documented_page(owner, client_for):
    body = client_for(owner).get("/api/v1/jobs/?page_size=1").json()
    assert set(body) >= {"count", "next", "previous", "results"} and isinstance(body["results"], list)


def test_every_operation_documents_its_errors_in_the_envelope(schema):
    envelope = schema["components"]["schemas"]["Error"]
    assert envelope["required"] == ["error"]
    detail = resolved(schema, envelope["properties"]["error"])
    assert set(detail["required"]) == {"code", "message", "fields"}
    for path, method, op in operations(schema):
        responses = op["responses"]
        expected = {"400", "401"}
        if method != "get" or {} not in op.get("security", []):
            expected.add("403")
        if "{" in path:
            expected.add("404")
        if method in ("post", "put", "patch", "delete"):
            expected.add("409")
        if "requestBody" in op:
            expected |= {"413", "415"}
        assert expected <= set(responses), (method, path, sorted(responses))
        for code in expected:
            assert responses[code]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
            assert responses[code]["description"]


def test_downloads_and_streams_are_described_with_their_real_content_types(schema):
    stream = schema["paths"]["/api/v1/jobs/{id}/stream"]["get"]["responses"]
    assert list(stream["200"]["content"]) == ["text/event-stream"]
    assert set(stream["200"]["content"]["text/event-stream"]["schema"]["properties"]) >= {"event", "id", "data"}
    assert "204" in stream
    download = schema["paths"]["/api/v1/models/{id}/versions/{number}/download"]["get"]["responses"]
    assert list(download["200"]["content"]) == ["application/gzip"]
    assert "302" in download and "Location" in download["302"]["headers"]


def test_operations_are_grouped_per_resource(schema):
    tags = {}
    for path, _method, op in operations(schema):
        assert len(op["tags"]) == 1, path
        assert path.startswith(f"/api/v1/{op['tags'][0]}"), (path, op["tags"])
        tags.setdefault(op["tags"][0], []).append(path)
    assert {"jobs", "datasets", "dataset-versions", "models", "endpoints", "tuning-jobs", "flow-definitions",
            "human-loops", "work-teams", "projects", "tokens", "nodes", "review"} <= set(tags)
    assert "v1" not in tags


def test_json_bodies_are_documented_as_json_only_uploads_as_multipart(schema):
    """A generated client sends the first content type it finds: a job (nested inputs and
    hyperparameters) sent as a form cannot be read, so an operation that takes JSON
    documents JSON alone; the upload operations keep multipart."""
    job_create = schema["paths"]["/api/v1/jobs/"]["post"]["requestBody"]["content"]
    assert list(job_create) == ["application/json"]
    for path, method, op in operations(schema):
        content = list(op.get("requestBody", {}).get("content", {}))
        if method == "post" and path in ("/api/v1/datasets/", "/api/v1/scripts/"):
            assert "multipart/form-data" in content, (method, path)
        elif content:
            assert content == ["application/json"], (method, path, content)
